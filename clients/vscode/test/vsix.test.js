'use strict';
// The .vsix builder: a zip that unpacks (by an independent reader here) to the manifest,
// the content types and the extension's files, byte for byte.

const assert = require('assert');
const fs = require('fs');
const os = require('os');
const path = require('path');
const zlib = require('zlib');
const { describe, it } = require('node:test');
const { build, crc32 } = require('../scripts/build-vsix');

/// Reads a zip through its central directory; returns name -> contents.
function unzip(buf) {
  const eocd = buf.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
  assert.ok(eocd >= 0, 'no end of central directory');
  const count = buf.readUInt16LE(eocd + 10);
  let p = buf.readUInt32LE(eocd + 16);
  const out = new Map();
  for (let i = 0; i < count; i++) {
    assert.strictEqual(buf.readUInt32LE(p), 0x02014b50);
    const method = buf.readUInt16LE(p + 10);
    const crc = buf.readUInt32LE(p + 16);
    const csize = buf.readUInt32LE(p + 20);
    const size = buf.readUInt32LE(p + 24);
    const nlen = buf.readUInt16LE(p + 28);
    const xlen = buf.readUInt16LE(p + 30);
    const clen = buf.readUInt16LE(p + 32);
    const off = buf.readUInt32LE(p + 42);
    const name = buf.toString('utf8', p + 46, p + 46 + nlen);
    assert.strictEqual(buf.readUInt32LE(off), 0x04034b50);
    const lnlen = buf.readUInt16LE(off + 26);
    const lxlen = buf.readUInt16LE(off + 28);
    const body = buf.subarray(off + 30 + lnlen + lxlen, off + 30 + lnlen + lxlen + csize);
    const data = method === 8 ? zlib.inflateRawSync(body) : Buffer.from(body);
    assert.strictEqual(data.length, size, name);
    assert.strictEqual(crc32(data), crc, `${name}: CRC`);
    out.set(name, data);
    p += 46 + nlen + xlen + clen;
  }
  return out;
}

describe('build-vsix', () => {
  it('crc32 matches the standard check value', () => {
    assert.strictEqual(crc32(Buffer.from('123456789')), 0xcbf43926);
  });

  it('packs the manifest and the extension files', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'colibri-vsix-'));
    try {
      const out = path.join(dir, 'colibri.vsix');
      build(out);
      const files = unzip(fs.readFileSync(out));
      const root = path.resolve(__dirname, '..');
      const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
      const names = [...files.keys()];
      assert.strictEqual(names[0], '[Content_Types].xml');
      assert.ok(names.includes('extension.vsixmanifest'));
      for (const f of ['package.json', 'README.md', 'src/extension.js', 'src/client.js', 'src/provider.js',
                       'src/status.js']) {
        assert.ok(files.has(`extension/${f}`), f);
        assert.ok(files.get(`extension/${f}`).equals(fs.readFileSync(path.join(root, f))), `${f} differs`);
      }
      assert.ok(!names.some((n) => n.includes('/test/')), 'tests are not packaged');
      const manifest = files.get('extension.vsixmanifest').toString();
      assert.match(manifest, new RegExp(`Id="${pkg.name}" Version="${pkg.version}" Publisher="${pkg.publisher}"`));
      assert.match(manifest, /Microsoft.VisualStudio.Code.Engine" Value="\^1\.75\.0"/);
      const types = files.get('[Content_Types].xml').toString();
      for (const ext of ['.js', '.json', '.md', '.vsixmanifest']) assert.match(types, new RegExp(`Extension="\\${ext}"`));
      // The main file named in package.json is in the package.
      assert.ok(files.has(path.posix.join('extension', pkg.main)));
      // Same sources, same bytes.
      const again = path.join(dir, 'again.vsix');
      build(again);
      assert.ok(fs.readFileSync(out).equals(fs.readFileSync(again)));
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

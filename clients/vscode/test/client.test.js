'use strict';
// The protocol client against a real colibrid on the default model (Node's test runner;
// runs on Node 18). Skips when the daemon or the model is not built.

const assert = require('assert');
const { describe, it, before, after } = require('node:test');
const { ColibriClient, ColibriError, defaultSocketPath } = require('../src/client');
const { Daemon, missing } = require('./daemon');

const FIM_PROMPT = 'def count_words(path):\n    """Return how many words the file at path holds."""\n';
const FIM_SUFFIX = '\n    return total\n';

describe('defaultSocketPath', () => {
  it('follows XDG_RUNTIME_DIR, else /tmp/colibri-$UID', () => {
    assert.strictEqual(defaultSocketPath({ XDG_RUNTIME_DIR: '/run/user/7' }), '/run/user/7/colibri/colibri.sock');
    assert.strictEqual(defaultSocketPath({ XDG_RUNTIME_DIR: '' }), `/tmp/colibri-${process.getuid()}/colibri.sock`);
    assert.strictEqual(defaultSocketPath({}), `/tmp/colibri-${process.getuid()}/colibri.sock`);
  });
});

describe('client against colibrid', { skip: missing() || false, timeout: 60000 }, () => {
  let daemon;
  let client;

  before(async () => {
    daemon = new Daemon({ extraArgs: ['--enable-fault-injection'] });
    await daemon.start();
    client = new ColibriClient({ socketPath: daemon.socketPath, clientName: 'node-test' });
  });

  after(async () => {
    if (client) client.close();
    if (daemon) await daemon.dispose();
  });

  it('says hello on connecting and reports health and status', async () => {
    const h = await client.health();
    assert.strictEqual(h.event, 'health');
    assert.strictEqual(h.status, 'ok');
    assert.match(client.server, /^colibrid /);
    const st = await client.status();
    assert.strictEqual(st.event, 'status');
    assert.match(st.model.path, /default\.colibri$/);
    assert.ok(st.model.fim, 'the default model has FIM tokens');
  });

  it('streams a completion whose pieces add up to the text', async () => {
    const pieces = [];
    const c = client.complete({ prompt: FIM_PROMPT, suffix: FIM_SUFFIX, max_tokens: 24, temperature: 0 },
                              (piece) => pieces.push(piece));
    const done = await c.promise;
    assert.strictEqual(done.event, 'done');
    assert.ok(['stop', 'length'].includes(done.finish_reason), done.finish_reason);
    assert.ok(pieces.length > 0);
    assert.strictEqual(done.text, pieces.join(''));
    assert.strictEqual(done.usage.completion_tokens > 0, true);
    // Greedy decoding: the same request gives the same text.
    const again = await client.complete({ prompt: FIM_PROMPT, suffix: FIM_SUFFIX, max_tokens: 24, temperature: 0,
                                          stream: false }).promise;
    assert.strictEqual(again.text, done.text);
  });

  it('a lone surrogate in the text goes out as U+FFFD: the completion finishes', async () => {
    const done = await client.complete({ prompt: 'def f(x):\n    s = "\uD800"\n', max_tokens: 4, temperature: 0 })
      .promise;
    assert.strictEqual(done.event, 'done');
    assert.strictEqual(done.usage.completion_tokens > 0, true);
  });

  it('health with no answer rejects with "timeout" (a stopped daemon)', async () => {
    const c = new ColibriClient({ socketPath: daemon.socketPath, clientName: 'node-test', replyTimeoutMs: 300 });
    assert.strictEqual((await c.health()).status, 'ok');
    daemon.proc.kill('SIGSTOP');
    try {
      await assert.rejects(c.health(), (err) => err instanceof ColibriError && err.code === 'timeout');
    } finally {
      daemon.proc.kill('SIGCONT');
      c.close();
    }
  });

  it('runs pipelined completions and matches events by id', async () => {
    const a = client.complete({ prompt: 'import os\n', max_tokens: 8, temperature: 0 });
    const b = client.complete({ prompt: 'class Stack:\n', max_tokens: 8, temperature: 0 });
    const [da, db] = await Promise.all([a.promise, b.promise]);
    assert.notStrictEqual(a.id, b.id);
    assert.strictEqual(da.id, a.id);
    assert.strictEqual(db.id, b.id);
    const alone = await client.complete({ prompt: 'class Stack:\n', max_tokens: 8, temperature: 0 }).promise;
    assert.strictEqual(db.text, alone.text);
  });

  it('cancels a streaming completion', async () => {
    let resolveFirst;
    const first = new Promise((r) => { resolveFirst = r; });
    const c = client.complete({ prompt: FIM_PROMPT, max_tokens: 200, temperature: 0,
                                debug_fault: { kind: 'slow', delay_ms: 50 } }, () => resolveFirst());
    await first;
    c.cancel();
    c.cancel(); // idempotent
    const done = await c.promise;
    assert.strictEqual(done.finish_reason, 'cancelled');
    assert.ok(done.text.length > 0 && done.usage.completion_tokens < 200);
  });

  it('cancelling before the request went out never sends it', async () => {
    const fresh = new ColibriClient({ socketPath: daemon.socketPath });
    const c = fresh.complete({ prompt: 'x', max_tokens: 4 });
    c.cancel();
    const done = await c.promise;
    assert.strictEqual(done.finish_reason, 'cancelled');
    assert.strictEqual(done.text, '');
    fresh.close();
  });

  it('rejects with the daemon error code and keeps the connection usable', async () => {
    await assert.rejects(client.complete({ prompt: 'x', max_tokens: 'eight' }).promise,
                         (err) => err instanceof ColibriError && err.code === 'invalid_request');
    await assert.rejects(client.call('frobnicate'), (err) => err.code === 'unknown_op');
    const h = await client.health();
    assert.strictEqual(h.status, 'ok');
  });

  it('a newer request of the same session cancels the older one', async (t) => {
    const slow = { debug_fault: { kind: 'slow', delay_ms: 50 } };
    let started;
    const firstPiece = new Promise((r) => { started = r; });
    const a = client.complete({ prompt: FIM_PROMPT, max_tokens: 200, session: 'node-test-1', ...slow }, () => started());
    const raced = await Promise.race([firstPiece, a.promise.then(() => 'ended', (e) => e)]);
    if (raced instanceof ColibriError && raced.code === 'invalid_request' && /session/.test(raced.message)) {
      t.skip('this colibrid has no sessions yet');
      return;
    }
    const b = client.complete({ prompt: FIM_PROMPT + '    ', max_tokens: 4, session: 'node-test-1' });
    const da = await a.promise;
    assert.strictEqual(da.finish_reason, 'cancelled');
    const db = await b.promise;
    assert.notStrictEqual(db.finish_reason, 'cancelled');
  });

  it('max_lines 1 ends the completion with the line', async (t) => {
    let done;
    try {
      done = await client.complete({ prompt: 'def parse(line):\n', max_tokens: 64, temperature: 0, max_lines: 1 })
        .promise;
    } catch (err) {
      if (err.code === 'invalid_request' && /max_lines/.test(err.message)) {
        t.skip('this colibrid has no max_lines yet');
        return;
      }
      throw err;
    }
    assert.ok(!done.text.includes('\n'), JSON.stringify(done.text));
    assert.ok(done.text.length > 0);
  });

  it('fails what is in flight when the daemon goes away and reconnects when it is back', async () => {
    const c = client.complete({ prompt: FIM_PROMPT, max_tokens: 200, debug_fault: { kind: 'slow', delay_ms: 50 } });
    await new Promise((r) => setTimeout(r, 100));
    const stopped = daemon.stop();
    // The daemon ends it as cancelled at shutdown, or the connection drops first.
    const outcome = await c.promise.then((d) => d.finish_reason, (e) => e.code);
    assert.ok(['cancelled', 'disconnected', 'unavailable'].includes(outcome), outcome);
    await stopped;
    await assert.rejects(client.health(), (err) => err.code === 'connect' || err.code === 'disconnected');
    await daemon.start();
    const h = await client.health();
    assert.strictEqual(h.status, 'ok');
    const done = await client.complete({ prompt: 'import sys\n', max_tokens: 4, temperature: 0 }).promise;
    assert.strictEqual(done.event, 'done');
  });
});

describe('a daemon that closes the connection', { skip: missing() || false, timeout: 60000 }, () => {
  it('says why: the error it sent before closing', async () => {
    const daemon = new Daemon({ extraArgs: ['--max-line-bytes', '1024'] });
    await daemon.start();
    const c = new ColibriClient({ socketPath: daemon.socketPath });
    try {
      assert.strictEqual((await c.health()).status, 'ok');
      await assert.rejects(c.complete({ prompt: 'x'.repeat(2048), max_tokens: 1 }).promise,
                           (err) => err instanceof ColibriError && err.code === 'disconnected' &&
                             /the connection to colibrid closed \(too_large: /.test(err.message));
    } finally {
      c.close();
      await daemon.dispose();
    }
  });
});

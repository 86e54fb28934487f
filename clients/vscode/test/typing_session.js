#!/usr/bin/env node
'use strict';
// Scripted typing session against colibrid: types a Python file one character at a time
// and sends a completion request for every keystroke, each one replacing the previous
// (same `session`, or an explicit `cancel` with --cancel explicit). Reports keystroke-to-
// first-token and keystroke-to-complete-line latencies (median, p95) and how many requests
// were cancelled.
//
// Usage: node test/typing_session.js [--socket PATH] [--interval MS] [--cancel session|explicit]
//                                    [--max-tokens N] [--chars N] [--json]
// Without --socket it starts its own colibrid on the default model (test/daemon.js).

const { ColibriClient } = require('../src/client');
const { Daemon, sleep } = require('./daemon');

// What the user types (into the middle of a file, so the requests are fill-in-the-middle).
const BEFORE = 'import os\nimport sys\n\n\n';
const TYPED = [
  'def count_words(path):',
  '    """Return how many words the file at path holds."""',
  '    total = 0',
  '    with open(path) as f:',
  '        for line in f:',
  '            total += len(line.split())',
  '    return total',
  '',
].join('\n');
const AFTER = '\n\n\ndef main():\n    print(count_words(sys.argv[1]))\n';

function parseArgs(argv) {
  const o = { socket: null, interval: 100, cancel: 'session', maxTokens: 32, chars: TYPED.length, json: false };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i];
    const v = () => argv[++i];
    if (a === '--socket') o.socket = v();
    else if (a === '--interval') o.interval = Number(v());
    else if (a === '--cancel') o.cancel = v();
    else if (a === '--max-tokens') o.maxTokens = Number(v());
    else if (a === '--chars') o.chars = Number(v());
    else if (a === '--json') o.json = true;
    else throw new Error(`unknown argument ${a}`);
  }
  if (!['session', 'explicit'].includes(o.cancel)) throw new Error('--cancel takes session or explicit');
  return o;
}

function percentile(values, p) {
  if (values.length === 0) return null;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)];
}

async function run(opts) {
  let daemon = null;
  let socketPath = opts.socket;
  if (!socketPath) {
    daemon = new Daemon();
    await daemon.start();
    socketPath = daemon.socketPath;
  }
  const client = new ColibriClient({ socketPath, clientName: 'typing-session' });
  try {
    const status = await client.status();
    // One request first, so the model's pages are in memory before measuring.
    await client.complete({ prompt: BEFORE, suffix: AFTER, max_tokens: 4, temperature: 0 }).promise;

    // max_lines 1 when the daemon knows it: the completion then ends with the line.
    let lineLimit = true;
    try {
      await client.complete({ prompt: BEFORE, max_tokens: 1, temperature: 0, max_lines: 1 }).promise;
    } catch (err) {
      if (err.code !== 'invalid_request') throw err;
      lineLimit = false;
    }

    const records = [];
    let prev = null;
    const n = Math.min(opts.chars, TYPED.length);
    const started = Date.now();
    for (let k = 1; k <= n; k++) {
      const typed = TYPED.slice(0, k);
      const lineEnd = TYPED.indexOf('\n', k);
      const fields = {
        prompt: BEFORE + typed,
        suffix: (lineEnd >= 0 ? TYPED.slice(lineEnd) : '') + AFTER,
        max_tokens: opts.maxTokens,
        temperature: 0,
      };
      if (lineLimit) fields.max_lines = 1;
      if (opts.cancel === 'session') fields.session = 'typing-session';
      else if (prev) prev.c.cancel();
      const keyAt = performance.now();
      const rec = { key: k, keyAt, firstMs: null, lineMs: null, reason: null };
      const c = client.complete(fields, (piece, text) => {
        const now = performance.now() - keyAt;
        if (rec.firstMs === null) rec.firstMs = now;
        if (rec.lineMs === null && text.includes('\n')) rec.lineMs = now;
      });
      rec.done = c.promise.then((d) => {
        rec.reason = d.finish_reason;
        // The line is complete when the completion ends on its own (max_lines, stop, length).
        if (rec.lineMs === null && d.finish_reason !== 'cancelled') rec.lineMs = performance.now() - keyAt;
      }, (err) => { rec.reason = `error:${err.code}`; });
      records.push(rec);
      prev = { c, rec };
      await sleep(opts.interval);
    }
    await Promise.all(records.map((r) => r.done));
    const elapsed = (Date.now() - started) / 1000;

    const first = records.filter((r) => r.firstMs !== null).map((r) => r.firstMs);
    const lines = records.filter((r) => r.lineMs !== null).map((r) => r.lineMs);
    const cancelled = records.filter((r) => r.reason === 'cancelled').length;
    const errors = records.filter((r) => r.reason && r.reason.startsWith('error')).length;
    const after = await client.status();
    return {
      model: status.model.path,
      backend: status.backend,
      n_threads: status.model.n_threads,
      interval_ms: opts.interval,
      cancel: opts.cancel,
      max_lines_1: lineLimit,
      max_tokens: opts.maxTokens,
      keystrokes: records.length,
      seconds: elapsed,
      cancelled,
      errors,
      completed: records.length - cancelled - errors,
      first_token: { n: first.length, median_ms: percentile(first, 50), p95_ms: percentile(first, 95) },
      complete_line: { n: lines.length, median_ms: percentile(lines, 50), p95_ms: percentile(lines, 95) },
      daemon_cancelled: after.requests.cancelled - status.requests.cancelled,
      daemon_superseded: (after.requests.superseded || 0) - (status.requests.superseded || 0),
      cache_hit_rate: after.cache ? after.cache.hit_rate : null,
      load_average: require('os').loadavg()[0],
      cpus: require('os').cpus().length,
    };
  } finally {
    client.close();
    if (daemon) await daemon.dispose();
  }
}

function fmt(v) {
  return v === null ? '-' : `${v.toFixed(1)} ms`;
}

if (require.main === module) {
  const opts = parseArgs(process.argv);
  run(opts).then((r) => {
    if (opts.json) {
      console.log(JSON.stringify(r, null, 2));
      return;
    }
    console.log(`model ${r.model} (${r.backend}, ${r.n_threads} threads; machine: ${r.cpus} CPUs, ` +
                `load average ${r.load_average.toFixed(1)})`);
    console.log(`${r.keystrokes} keystrokes every ${r.interval_ms} ms, one request each (cancel by ${r.cancel}` +
                `${r.max_lines_1 ? ', max_lines 1' : ''}, max_tokens ${r.max_tokens}), ${r.seconds.toFixed(1)} s`);
    console.log(`requests: ${r.completed} completed, ${r.cancelled} cancelled, ${r.errors} errors ` +
                `(daemon: ${r.daemon_cancelled} cancelled, ${r.daemon_superseded} of them superseded)`);
    console.log(`keystroke to first token:   median ${fmt(r.first_token.median_ms)}, p95 ${fmt(r.first_token.p95_ms)}` +
                ` (${r.first_token.n} requests)`);
    console.log(`keystroke to complete line: median ${fmt(r.complete_line.median_ms)}, ` +
                `p95 ${fmt(r.complete_line.p95_ms)} (${r.complete_line.n} requests)`);
    if (r.cache_hit_rate !== null) console.log(`daemon prompt cache hit rate: ${(100 * r.cache_hit_rate).toFixed(0)}%`);
  }, (err) => {
    console.error(err.stack || String(err));
    process.exit(1);
  });
}

module.exports = { run };

'use strict';
// Starts a real colibrid on a temporary socket for the tests and the typing benchmark.
// Paths come from the environment (set by CTest) or default to the cpu preset's build:
// COLIBRID, COLIBRI_WORKER, COLIBRI_MODEL.

const fs = require('fs');
const os = require('os');
const path = require('path');
const { spawn } = require('child_process');
const { ColibriClient } = require('../src/client');

const repo = path.resolve(__dirname, '..', '..', '..');

function paths(env = process.env) {
  return {
    colibrid: env.COLIBRID || path.join(repo, 'build-cpu', 'bin', 'colibrid'),
    worker: env.COLIBRI_WORKER || path.join(repo, 'build-cpu', 'bin', 'colibri-worker'),
    model: env.COLIBRI_MODEL || path.join(repo, 'models', 'default.colibri'),
  };
}

/// Why the daemon tests cannot run here, or null.
function missing() {
  const p = paths();
  for (const f of [p.colibrid, p.worker, p.model]) {
    if (!fs.existsSync(f)) return `${f} not found (build with: cmake --preset cpu && cmake --build build-cpu)`;
  }
  return null;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class Daemon {
  constructor({ extraArgs = [], dir = null } = {}) {
    this.dir = dir || fs.mkdtempSync(path.join(os.tmpdir(), 'colibri-node-'));
    this.socketPath = path.join(this.dir, 'run', 'colibri.sock');
    this.extraArgs = extraArgs;
    this.proc = null;
    this.stderr = '';
  }

  /// Starts colibrid and waits until health reports ok.
  async start(timeoutMs = 20000) {
    const p = paths();
    const args = ['--model', p.model, '--socket', this.socketPath, '--worker-exe', p.worker,
                  '--log-level', 'warn', '--shutdown-grace-ms', '300', ...this.extraArgs];
    this.proc = spawn(p.colibrid, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    this.proc.stderr.on('data', (d) => { this.stderr += d; });
    const exited = new Promise((resolve) => this.proc.once('exit', resolve));
    this.exited = exited;
    const probe = new ColibriClient({ socketPath: this.socketPath, connectTimeoutMs: 500 });
    const deadline = Date.now() + timeoutMs;
    try {
      for (;;) {
        if (this.proc.exitCode !== null) throw new Error(`colibrid exited: ${this.stderr}`);
        try {
          const h = await probe.health();
          if (h.status === 'ok') return;
        } catch (err) {
          // not listening yet
        }
        if (Date.now() > deadline) throw new Error(`colibrid not ready after ${timeoutMs} ms: ${this.stderr}`);
        await sleep(20);
      }
    } finally {
      probe.close();
    }
  }

  async stop() {
    if (!this.proc || this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    this.proc.kill('SIGTERM');
    const t = setTimeout(() => this.proc.kill('SIGKILL'), 10000);
    await this.exited;
    clearTimeout(t);
  }

  async dispose() {
    await this.stop();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

module.exports = { Daemon, missing, paths, sleep };

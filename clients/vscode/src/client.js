'use strict';
// A client for colibrid's protocol v1 (docs/protocol.md): one persistent Unix socket,
// NDJSON both ways, pipelined requests matched to their events by id. It reconnects on
// demand after the daemon goes away, so a restarted daemon is picked up by the next
// request. Node's standard library only.

const net = require('net');
const os = require('os');
const path = require('path');
const { EventEmitter } = require('events');

/// The daemon's default socket: $XDG_RUNTIME_DIR/colibri/colibri.sock, or
/// /tmp/colibri-$UID/colibri.sock when XDG_RUNTIME_DIR is unset or empty.
function defaultSocketPath(env = process.env) {
  const runtime = env.XDG_RUNTIME_DIR;
  if (runtime) return path.join(runtime, 'colibri', 'colibri.sock');
  const uid = typeof process.getuid === 'function' ? process.getuid() : os.userInfo().uid;
  return `/tmp/colibri-${uid}/colibri.sock`;
}

/// An error event from the daemon (`code` is the protocol's stable code), or a local
/// failure: `disconnected` (the connection closed before the final line), `connect`
/// (the socket could not be reached).
class ColibriError extends Error {
  constructor(code, message, event = null) {
    super(message);
    this.name = 'ColibriError';
    this.code = code;
    this.event = event;
  }
}

const FINAL_EVENTS = new Set(['done', 'error']);

/// One completion in flight. `promise` resolves with the `done` event plus `text` (the
/// whole completion, from the pieces or from done.text) and rejects with a ColibriError.
class Completion {
  constructor(client, id, onPiece) {
    this.id = id;
    this.text = '';
    this.finished = false;
    this.cancelRequested = false;
    this.firstPieceAt = null;
    this.sentAt = Date.now();
    this._client = client;
    this._onPiece = onPiece;
    this.promise = new Promise((resolve, reject) => {
      this._resolve = resolve;
      this._reject = reject;
    });
  }

  /// Sends `cancel` for this completion. Its promise then resolves with
  /// finish_reason "cancelled" (or whatever ended it first). Idempotent.
  cancel() {
    if (this.finished || this.cancelRequested) return;
    this.cancelRequested = true;
    this._client._sendCancel(this);
  }

  _event(ev) {
    if (ev.event === 'piece') {
      if (typeof ev.text !== 'string') return;
      if (this.firstPieceAt === null) this.firstPieceAt = Date.now();
      this.text += ev.text;
      if (this._onPiece) this._onPiece(ev.text, this.text);
      return;
    }
    this.finished = true;
    if (ev.event === 'done') {
      if (typeof ev.text === 'string') this.text = ev.text;
      this._resolve({ ...ev, text: this.text });
    } else {
      this._reject(new ColibriError(ev.code || 'internal', ev.message || 'error', ev));
    }
  }

  _fail(err) {
    if (this.finished) return;
    this.finished = true;
    this._reject(err);
  }
}

class ColibriClient extends EventEmitter {
  /// options: socketPath, clientName (sent in hello), connectTimeoutMs, replyTimeoutMs (how
  /// long health and status may take: the daemon answers them from its event loop at once).
  constructor(options = {}) {
    super();
    this.socketPath = options.socketPath || defaultSocketPath();
    this.clientName = options.clientName || 'colibri-node';
    this.connectTimeoutMs = options.connectTimeoutMs || 2000;
    this.replyTimeoutMs = options.replyTimeoutMs || 5000;
    this.server = null; // from the hello reply
    this._socket = null;
    this._connecting = null;
    this._buf = '';
    this._nextId = 1;
    this._pending = new Map(); // id -> Completion | {resolve, reject} for one-reply ops
    this._daemonError = null; // the connection's last error without an id
    this._closed = false;
  }

  get connected() {
    return this._socket !== null && this._connecting === null;
  }

  /// Connects when not connected (concurrent calls share one attempt) and checks the
  /// protocol version. Resolves when the socket is ready for requests.
  connect() {
    if (this._closed) return Promise.reject(new ColibriError('closed', 'the client was closed'));
    if (this._socket && !this._connecting) return Promise.resolve();
    if (this._connecting) return this._connecting;
    this._connecting = new Promise((resolve, reject) => {
      const sock = net.createConnection({ path: this.socketPath });
      sock.setEncoding('utf8'); // multi-byte characters split across reads are reassembled
      let settled = false;
      const timer = setTimeout(() => fail(new ColibriError('connect', `no answer from ${this.socketPath}`)),
                               this.connectTimeoutMs);
      const fail = (err) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        sock.destroy();
        this._socket = null;
        this._connecting = null;
        reject(err instanceof ColibriError ? err
               : new ColibriError('connect', `cannot connect to ${this.socketPath}: ${err.message}`));
      };
      sock.once('error', fail);
      sock.once('connect', () => {
        this._socket = sock;
        this._buf = '';
        sock.on('data', (chunk) => this._onData(chunk));
        sock.on('close', () => this._onClose(sock));
        sock.on('error', () => {}); // 'close' follows and does the cleanup
        sock.removeListener('error', fail);
        sock.once('error', fail);
        // The handshake is pipelined with whatever follows it; its reply confirms the version.
        const id = this._nextId++;
        this._pending.set(id, {
          resolve: (ev) => {
            if (settled) return;
            settled = true;
            clearTimeout(timer);
            this.server = ev.server || null;
            this._connecting = null;
            this.emit('connect', ev);
            resolve();
          },
          reject: (err) => fail(err),
        });
        this._write({ id, op: 'hello', protocol: 1, client: this.clientName });
      });
    });
    return this._connecting;
  }

  /// Starts a completion. `params` are the complete request's fields (prompt, suffix,
  /// max_tokens, ...). `onPiece(piece, textSoFar)` is called as text streams in.
  /// Returns a Completion at once; connection failures reject its promise.
  complete(params, onPiece = null) {
    const id = this._nextId++;
    const c = new Completion(this, id, onPiece);
    this.connect().then(() => {
      if (c.cancelRequested) {
        c.finished = true;
        c._resolve({ event: 'done', id, finish_reason: 'cancelled', text: '' });
        return;
      }
      this._pending.set(id, c);
      c.sentAt = Date.now();
      this._write({ ...params, id, op: 'complete' });
    }, (err) => c._fail(err));
    return c;
  }

  /// A one-reply operation (health, status, hello): resolves with the reply event,
  /// rejects with a ColibriError on an error event, a lost connection, or no reply within
  /// replyTimeoutMs (code "timeout": a daemon whose event loop is stuck).
  async call(op, fields = {}) {
    await this.connect();
    const id = this._nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pending.delete(id);
        reject(new ColibriError('timeout', `colibrid did not answer ${op} within ${this.replyTimeoutMs} ms`));
      }, this.replyTimeoutMs);
      const settle = (f) => (v) => {
        clearTimeout(timer);
        f(v);
      };
      this._pending.set(id, { resolve: settle(resolve), reject: settle(reject) });
      this._write({ ...fields, id, op });
    });
  }

  health() { return this.call('health'); }
  status() { return this.call('status'); }

  /// Closes the connection; whatever was in flight is cancelled by the daemon and
  /// rejected here. The client may connect again unless `final` is true.
  close(final = true) {
    if (final) this._closed = true;
    if (this._socket) this._socket.destroy();
  }

  _sendCancel(c) {
    if (!this._pending.has(c.id)) return; // not sent yet: complete() drops it
    this._write({ id: this._nextId++, op: 'cancel', target: c.id });
  }

  _write(obj) {
    if (!this._socket) return;
    this._socket.write(JSON.stringify(obj, wellFormed) + '\n');
  }

  _onData(chunk) {
    this._buf += chunk;
    let nl;
    while ((nl = this._buf.indexOf('\n')) >= 0) {
      const line = this._buf.slice(0, nl).replace(/\r$/, '');
      this._buf = this._buf.slice(nl + 1);
      if (line.length === 0) continue;
      let ev;
      try {
        ev = JSON.parse(line);
      } catch (e) {
        this.emit('protocol_error', line);
        continue;
      }
      this._dispatch(ev);
    }
  }

  _dispatch(ev) {
    if (ev.id === null || ev.id === undefined) {
      // A connection-wide error (the daemon is stopping, forbidden, too many connections):
      // the close that follows reports it.
      this._daemonError = ev;
      this.emit('daemon_error', ev);
      return;
    }
    const p = this._pending.get(ev.id);
    if (!p) return; // e.g. the reply to a cancel: nobody waits for it
    if (p instanceof Completion) {
      if (FINAL_EVENTS.has(ev.event)) this._pending.delete(ev.id);
      p._event(ev);
      return;
    }
    this._pending.delete(ev.id);
    if (ev.event === 'error') p.reject(new ColibriError(ev.code || 'internal', ev.message || 'error', ev));
    else p.resolve(ev);
  }

  _onClose(sock) {
    if (this._socket !== sock) return;
    this._socket = null;
    this._connecting = null;
    const pending = this._pending;
    this._pending = new Map();
    const why = this._daemonError;
    this._daemonError = null;
    const err = new ColibriError('disconnected', 'the connection to colibrid closed' +
                                 (why ? ` (${why.code}: ${why.message})` : ''));
    for (const p of pending.values()) {
      if (p instanceof Completion) p._fail(err);
      else p.reject(err);
    }
    this.emit('disconnect');
  }
}

// A lone surrogate (possible in a JS string, never in UTF-8) would make the whole line
// invalid to the daemon, whose error could not name the request: U+FFFD instead.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;
function wellFormed(key, value) {
  return typeof value === 'string' ? value.replace(LONE_SURROGATE, '\uFFFD') : value;
}

module.exports = { ColibriClient, ColibriError, Completion, defaultSocketPath };

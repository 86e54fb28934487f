'use strict';
// The inline completion provider and the status bar with a stand-in for `vscode`: with a
// scripted client for the request/cancel logic, and with a real colibrid end to end.

const assert = require('assert');
const { describe, it, before, after } = require('node:test');
const { EventEmitter } = require('events');
const { vscode, textDocument, makeWindow } = require('./vscode_stub');
const { createProvider, extractContext, finishText, requestFields, capText, DEFAULTS } = require('../src/provider');
const { describeHealth, HealthStatus } = require('../src/status');
const { ColibriClient, ColibriError } = require('../src/client');
const { Daemon, missing, sleep } = require('./daemon');

const AUTOMATIC = { triggerKind: vscode.InlineCompletionTriggerKind.Automatic };

/// A client whose completions the test ends by hand.
class ScriptedClient extends EventEmitter {
  constructor() {
    super();
    this.requests = [];
  }

  complete(fields) {
    const c = { fields, finished: false, cancelled: false };
    c.promise = new Promise((resolve, reject) => { c.resolve = resolve; c.reject = reject; });
    c.cancel = () => {
      if (c.finished) return;
      c.cancelled = true;
      c.finished = true;
      c.resolve({ event: 'done', finish_reason: 'cancelled', text: 'partial' });
    };
    c.finish = (text, reason = 'stop') => { c.finished = true; c.resolve({ event: 'done', finish_reason: reason, text }); };
    this.requests.push(c);
    this.emit('request', c);
    return c;
  }
}

/// The next request the provider sent that the test has not looked at yet.
function nextRequest(client) {
  client.taken = client.taken || 0;
  if (client.requests.length > client.taken) return Promise.resolve(client.requests[client.taken++]);
  return new Promise((resolve) => client.once('request', () => resolve(client.requests[client.taken++])));
}

describe('context and text helpers', () => {
  const doc = textDocument('l0\nl1\nl2 cursor here\nl3\nl4');

  it('sends the configured line windows around the cursor', () => {
    const cfg = { ...DEFAULTS, prefixLines: 1, suffixLines: 1 };
    const { prompt, suffix } = extractContext(doc, new vscode.Position(2, 3), cfg);
    assert.strictEqual(prompt, 'l1\nl2 ');
    assert.strictEqual(suffix, 'cursor here\nl3');
    const all = extractContext(doc, new vscode.Position(2, 3), DEFAULTS);
    assert.strictEqual(all.prompt, 'l0\nl1\nl2 ');
    assert.strictEqual(all.suffix, 'cursor here\nl3\nl4'); // the file ends without a newline
    const eol = extractContext(textDocument('l0\nl1 cursor\n'), new vscode.Position(1, 3), DEFAULTS);
    assert.strictEqual(eol.suffix, 'cursor\n'); // its final newline, once
  });

  it('caps the context at line boundaries and never splits a surrogate pair', () => {
    assert.strictEqual(capText('aaaa\nbb\ncc', 6, true), 'bb\ncc');
    assert.strictEqual(capText('aa\nbb\ncccc', 6, false), 'aa\nbb');
    assert.strictEqual(capText('x🐍🐍', 3, true), '🐍'); // 🐍 is two UTF-16 units
    assert.strictEqual(capText('🐍🐍x', 3, false), '🐍');
  });

  it('trims trailing blank lines and limits lines', () => {
    assert.strictEqual(finishText('a\nb\n\n  \n', DEFAULTS), 'a\nb');
    assert.strictEqual(finishText('a\nb\nc', { ...DEFAULTS, multiline: false }), 'a');
    assert.strictEqual(finishText('1\n2\n3\n4', { ...DEFAULTS, maxLines: 2 }), '1\n2');
    assert.strictEqual(finishText('1\n2\n3\n4', { ...DEFAULTS, maxLines: 0 }), '1\n2\n3\n4');
  });

  it('asks for one line in single-line mode', () => {
    const single = requestFields('p', 's', 'sess', { ...DEFAULTS, multiline: false, maxTokens: 32 });
    assert.deepStrictEqual(single, { prompt: 'p', suffix: 's', max_tokens: 32, temperature: 0, timeout_ms: 5000,
                                     session: 'sess', max_lines: 1, stop_on_dedent: true });
    const multi = requestFields('p', 's', 'sess', { ...DEFAULTS, maxLines: 0, stopOnDedent: false });
    assert.strictEqual(multi.max_lines, undefined);
    assert.strictEqual(multi.stop_on_dedent, undefined);
  });
});

describe('provider with a scripted client', () => {
  function setup(config = {}) {
    const client = new ScriptedClient();
    const provider = createProvider({ vscode, getClient: () => client,
                                      getConfig: () => ({ debounceMs: 30, ...config }) });
    return { client, provider };
  }

  it('returns the completion as an inline item at the cursor', async () => {
    const { client, provider } = setup();
    const doc = textDocument('def f(x):\n    ret\n');
    const pos = new vscode.Position(1, 7);
    const src = new vscode.CancellationTokenSource();
    const pending = provider.provideInlineCompletionItems(doc, pos, AUTOMATIC, src.token);
    const req = await nextRequest(client);
    assert.strictEqual(req.fields.prompt, 'def f(x):\n    ret');
    assert.strictEqual(req.fields.suffix, '\n'); // the file's final newline, once
    assert.match(req.fields.session, /^vscode-\d+-1$/);
    req.finish('urn x + 1\n\n');
    const items = await pending;
    assert.strictEqual(items.length, 1);
    assert.strictEqual(items[0].insertText, 'urn x + 1');
    assert.strictEqual(items[0].range.start, pos);
    assert.strictEqual(items[0].range.end, pos);
    assert.strictEqual(provider.stats.completed, 1);
  });

  it('sends nothing when the token is cancelled during the debounce', async () => {
    const { client, provider } = setup({ debounceMs: 200 });
    const src = new vscode.CancellationTokenSource();
    const started = Date.now();
    const pending = provider.provideInlineCompletionItems(textDocument('x'), new vscode.Position(0, 1), AUTOMATIC,
                                                          src.token);
    setTimeout(() => src.cancel(), 20);
    assert.deepStrictEqual(await pending, []);
    assert.ok(Date.now() - started < 150, 'the debounce ends with the cancellation');
    assert.strictEqual(client.requests.length, 0);
  });

  it('an explicit invocation skips the debounce', async () => {
    const { client, provider } = setup({ debounceMs: 10000 });
    const src = new vscode.CancellationTokenSource();
    const pending = provider.provideInlineCompletionItems(textDocument('x'), new vscode.Position(0, 1),
      { triggerKind: vscode.InlineCompletionTriggerKind.Invoke }, src.token);
    const req = await nextRequest(client);
    req.finish('yz');
    assert.strictEqual((await pending)[0].insertText, 'yz');
  });

  it('cancels the daemon request when VS Code cancels the token', async () => {
    const { client, provider } = setup();
    const src = new vscode.CancellationTokenSource();
    const pending = provider.provideInlineCompletionItems(textDocument('abc'), new vscode.Position(0, 3), AUTOMATIC,
                                                          src.token);
    const req = await nextRequest(client);
    src.cancel();
    assert.strictEqual(req.cancelled, true);
    assert.deepStrictEqual(await pending, []);
    assert.strictEqual(provider.stats.cancelsSent, 1);
    assert.strictEqual(provider.stats.cancelled, 1);
  });

  it('keeps one session per document', async () => {
    const { client, provider } = setup({ debounceMs: 0 });
    const sessions = [];
    for (const uri of ['file:///a.py', 'file:///b.py', 'file:///a.py']) {
      const pending = provider.provideInlineCompletionItems(textDocument('x', uri), new vscode.Position(0, 1),
                                                            AUTOMATIC, new vscode.CancellationTokenSource().token);
      const req = await nextRequest(client);
      sessions.push(req.fields.session);
      req.finish('');
      assert.deepStrictEqual(await pending, []); // nothing to show
    }
    assert.notStrictEqual(sessions[0], sessions[1]);
    assert.strictEqual(sessions[0], sessions[2]);
  });

  it('shows nothing on an error and counts it', async () => {
    const { client, provider } = setup({ debounceMs: 0 });
    const pending = provider.provideInlineCompletionItems(textDocument('x'), new vscode.Position(0, 1), AUTOMATIC,
                                                          new vscode.CancellationTokenSource().token);
    const req = await nextRequest(client);
    req.reject(new ColibriError('busy', 'the queue is full'));
    assert.deepStrictEqual(await pending, []);
    assert.strictEqual(provider.stats.errors, 1);
    assert.strictEqual(provider.stats.lastError, 'busy: the queue is full');
  });

  it('warms the cache with a max_tokens 0 request in the document\'s session', async () => {
    const { client, provider } = setup({ debounceMs: 0 });
    const doc = textDocument('import os\n\nx = 1', 'file:///w.py');
    provider.warmUp(doc, new vscode.Position(2, 0));
    const warm = await nextRequest(client);
    assert.strictEqual(warm.fields.max_tokens, 0);
    assert.strictEqual(warm.fields.prompt, 'import os\n\n');
    assert.strictEqual(provider.stats.warmUps, 1);
    const pending = provider.provideInlineCompletionItems(doc, new vscode.Position(2, 1), AUTOMATIC,
                                                          new vscode.CancellationTokenSource().token);
    const req = await nextRequest(client);
    assert.strictEqual(req.fields.session, warm.fields.session);
    req.finish(' = 2');
    assert.strictEqual((await pending)[0].insertText, ' = 2');
    assert.strictEqual(setup({ warmUp: false }).provider.warmUp(doc, new vscode.Position(0, 0)), null);
  });

  it('does nothing when disabled', async () => {
    const { client, provider } = setup({ enabled: false });
    const items = await provider.provideInlineCompletionItems(textDocument('x'), new vscode.Position(0, 1),
      AUTOMATIC, new vscode.CancellationTokenSource().token);
    assert.deepStrictEqual(items, []);
    assert.strictEqual(client.requests.length, 0);
  });
});

describe('status bar', () => {
  it('describes each health state', () => {
    assert.strictEqual(describeHealth({ status: 'ok', worker: 'idle' }).text, '$(check) Colibri');
    assert.strictEqual(describeHealth({ status: 'ok', worker: 'busy' }).state, 'ok');
    assert.strictEqual(describeHealth({ status: 'restarting' }).state, 'restarting');
    const bad = describeHealth({ status: 'unavailable', message: 'crash loop' });
    assert.match(bad.tooltip, /unavailable: crash loop/);
    const off = describeHealth(null, new ColibriError('connect', 'cannot connect to /x'));
    assert.strictEqual(off.state, 'offline');
    assert.match(off.tooltip, /cannot connect to \/x/);
  });

  it('polls the client and shows what it says', async () => {
    let answer = { event: 'health', status: 'ok', worker: 'idle' };
    const client = { health: async () => { if (answer instanceof Error) throw answer; return answer; } };
    const window = makeWindow();
    const status = new HealthStatus({ vscode: { ...vscode, window }, getClient: () => client, pollMs: 10 });
    assert.strictEqual(window.items.length, 1);
    assert.strictEqual(window.items[0].command, 'colibri.showStatus');
    assert.ok(window.items[0].shown);
    status.start();
    await sleep(30);
    assert.strictEqual(window.items[0].text, '$(check) Colibri');
    answer = new ColibriError('disconnected', 'gone');
    await sleep(40);
    assert.strictEqual(status.last.state, 'offline');
    status.dispose();
    assert.ok(window.items[0].disposed);
  });
});

describe('provider against colibrid', { skip: missing() || false, timeout: 60000 }, () => {
  let daemon;
  let client;

  before(async () => {
    daemon = new Daemon({ extraArgs: ['--enable-fault-injection'] });
    await daemon.start();
    client = new ColibriClient({ socketPath: daemon.socketPath });
  });

  after(async () => {
    if (client) client.close();
    if (daemon) await daemon.dispose();
  });

  it('completes a fill-in-the-middle from a document', async () => {
    const provider = createProvider({ vscode, getClient: () => client,
                                      getConfig: () => ({ debounceMs: 0, maxLines: 0, stopOnDedent: false }) });
    const doc = textDocument('import os\n\n\ndef list_files(root):\n    for name in os.\n');
    const pos = new vscode.Position(4, 19);
    const items = await provider.provideInlineCompletionItems(doc, pos, AUTOMATIC,
                                                              new vscode.CancellationTokenSource().token);
    // The same request sent directly: the provider shows exactly its text.
    const { prompt, suffix } = extractContext(doc, pos, DEFAULTS);
    assert.strictEqual(prompt, 'import os\n\n\ndef list_files(root):\n    for name in os.');
    assert.strictEqual(suffix, '\n');
    const direct = await client.complete({ prompt, suffix, max_tokens: 64, temperature: 0 }).promise;
    assert.strictEqual(provider.stats.errors, 0, provider.stats.lastError);
    const expected = finishText(direct.text, { ...DEFAULTS, maxLines: 0 });
    assert.ok(expected.trim() !== '', `the model suggests only blanks here: ${JSON.stringify(direct.text)}`);
    assert.strictEqual(items.length, 1);
    assert.strictEqual(items[0].insertText, expected);
  });

  it('single-line mode asks the daemon for the rest of the line only', async () => {
    const provider = createProvider({ vscode, getClient: () => client,
                                      getConfig: () => ({ debounceMs: 0, multiline: false, maxTokens: 64 }) });
    const doc = textDocument('import os\n\n\ndef list_files(root):\n    for name in os.\n');
    const items = await provider.provideInlineCompletionItems(doc, new vscode.Position(4, 19), AUTOMATIC,
                                                              new vscode.CancellationTokenSource().token);
    assert.strictEqual(provider.stats.errors, 0, provider.stats.lastError);
    assert.strictEqual(items.length, 1);
    assert.ok(!items[0].insertText.includes('\n'), JSON.stringify(items[0].insertText));
    assert.ok(items[0].insertText.length > 0);
  });
});

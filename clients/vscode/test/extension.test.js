'use strict';
// activate() with a stand-in `vscode`: what it registers, and that the settings reach
// the client (a socket where no daemon listens: nothing shown, the status bar says so).

const assert = require('assert');
const Module = require('module');
const { describe, it } = require('node:test');
const { vscode: base, textDocument, makeWindow } = require('./vscode_stub');
const { sleep } = require('./daemon');

function fakeVscode(settings) {
  const registered = { providers: [], commands: new Map(), channels: [] };
  const window = makeWindow();
  window.onDidChangeActiveTextEditor = () => ({ dispose() {} });
  window.createOutputChannel = (name) => {
    const ch = { name, lines: [], appendLine(l) { this.lines.push(l); }, show() {}, dispose() {} };
    registered.channels.push(ch);
    return ch;
  };
  const vscode = {
    ...base,
    version: '1.90.0-test',
    window,
    ConfigurationTarget: { Global: 1 },
    workspace: {
      getConfiguration: () => ({
        get: (key, dflt) => (key in settings ? settings[key] : dflt),
        update: async (key, value) => { settings[key] = value; },
      }),
      onDidChangeConfiguration: () => ({ dispose() {} }),
    },
    languages: {
      registerInlineCompletionItemProvider: (selector, provider) => {
        registered.providers.push({ selector, provider });
        return { dispose() {} };
      },
    },
    commands: {
      registerCommand: (name, fn) => {
        registered.commands.set(name, fn);
        return { dispose() {} };
      },
    },
  };
  return { vscode, registered };
}

describe('extension', () => {
  it('registers the provider, the commands and the status bar item', async () => {
    const settings = { socketPath: '/nonexistent/colibri.sock', debounceMs: 0 };
    const { vscode, registered } = fakeVscode(settings);
    const load = Module._load;
    Module._load = function (request, ...rest) {
      return request === 'vscode' ? vscode : load.call(this, request, ...rest);
    };
    let ext;
    try {
      delete require.cache[require.resolve('../src/extension')];
      ext = require('../src/extension');
    } finally {
      Module._load = load;
    }
    const context = { subscriptions: [] };
    ext.activate(context);
    try {
      assert.strictEqual(registered.providers.length, 1);
      assert.deepStrictEqual(registered.providers[0].selector, { pattern: '**' });
      assert.deepStrictEqual([...registered.commands.keys()].sort(), ['colibri.showStatus', 'colibri.toggle']);
      const item = vscode.window.items[0];
      const items = await registered.providers[0].provider.provideInlineCompletionItems(
        textDocument('x'), new vscode.Position(0, 1), { triggerKind: 1 }, new vscode.CancellationTokenSource().token);
      assert.deepStrictEqual(items, []);
      for (let i = 0; i < 100 && !/not reachable/.test(item.tooltip); i++) await sleep(10);
      assert.match(item.tooltip, /daemon not reachable .*\/nonexistent\/colibri\.sock/);
      await registered.commands.get('colibri.showStatus')();
      const log = registered.channels[0].lines.join('\n');
      assert.match(log, /colibrid not reachable at \/nonexistent\/colibri\.sock/);
      assert.match(log, /1 requests, 0 cancelled by typing, 0 completed, 1 errors \(last: connect: /);
      await registered.commands.get('colibri.toggle')();
      assert.strictEqual(settings.enabled, false);
    } finally {
      for (const d of context.subscriptions) d.dispose();
      ext.deactivate();
    }
  });
});

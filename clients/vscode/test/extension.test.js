'use strict';
// activate() with a stand-in `vscode`: what it registers, and that the settings reach
// the client (a socket where no daemon listens: nothing shown, the status bar says so).

const assert = require('assert');
const Module = require('module');
const { describe, it } = require('node:test');
const { vscode: base, textDocument, makeWindow } = require('./vscode_stub');
const { sleep } = require('./daemon');

// settings: the user's; workspace: a workspace's, which win
function fakeVscode(settings, workspace = {}) {
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
    ConfigurationTarget: { Global: 1, Workspace: 2 },
    workspace: {
      getConfiguration: () => ({
        get: (key, dflt) => (key in workspace ? workspace[key] : key in settings ? settings[key] : dflt),
        inspect: (key) => ({ globalValue: settings[key], workspaceValue: workspace[key] }),
        update: async (key, value, target) => { (target === 2 ? workspace : settings)[key] = value; },
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

// The extension loaded afresh with `vscode` standing in for VS Code's module.
function loadExtension(vscode) {
  const load = Module._load;
  Module._load = function (request, ...rest) {
    return request === 'vscode' ? vscode : load.call(this, request, ...rest);
  };
  try {
    delete require.cache[require.resolve('../src/extension')];
    return require('../src/extension');
  } finally {
    Module._load = load;
  }
}

describe('extension', () => {
  it('registers the provider, the commands and the status bar item', async () => {
    const settings = { socketPath: '/nonexistent/colibri.sock', debounceMs: 0 };
    const { vscode, registered } = fakeVscode(settings);
    const ext = loadExtension(vscode);
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

  it('toggles where the setting is set: a workspace that turned completions off turns them on', async () => {
    const settings = { socketPath: '/nonexistent/colibri.sock', debounceMs: 0 };
    const workspace = { enabled: false };
    const { vscode, registered } = fakeVscode(settings, workspace);
    const ext = loadExtension(vscode);
    const context = { subscriptions: [] };
    ext.activate(context);
    try {
      await registered.commands.get('colibri.toggle')();
      assert.strictEqual(workspace.enabled, true);
      assert.strictEqual('enabled' in settings, false);
      await registered.commands.get('colibri.toggle')();
      assert.strictEqual(workspace.enabled, false);
    } finally {
      for (const d of context.subscriptions) d.dispose();
      ext.deactivate();
    }
  });
});

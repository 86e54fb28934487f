'use strict';
// Colibri for VS Code: inline completions (ghost text) from a local colibrid daemon.

const vscode = require('vscode');
const { ColibriClient } = require('./client');
const { createProvider } = require('./provider');
const { HealthStatus } = require('./status');

let client = null;
let clientSocket = null;

function settings() {
  const c = vscode.workspace.getConfiguration('colibri');
  return {
    enabled: c.get('enabled', true),
    socketPath: c.get('socketPath', ''),
    maxTokens: c.get('maxTokens', 64),
    debounceMs: c.get('debounceMs', 75),
    multiline: c.get('multiline', true),
    maxLines: c.get('maxLines', 8),
    stopOnDedent: c.get('stopOnDedent', true),
    temperature: c.get('temperature', 0),
    prefixLines: c.get('prefixLines', 64),
    suffixLines: c.get('suffixLines', 16),
    timeoutMs: c.get('timeoutMs', 5000),
    warmUp: c.get('warmUp', true),
  };
}

/// The client for the configured socket; a changed setting gets a new connection.
function getClient() {
  const socketPath = settings().socketPath || undefined;
  if (!client || clientSocket !== socketPath) {
    if (client) client.close();
    client = new ColibriClient({ socketPath, clientName: `vscode ${vscode.version}` });
    clientSocket = socketPath;
  }
  return client;
}

function activate(context) {
  const output = vscode.window.createOutputChannel('Colibri');
  const log = (msg) => output.appendLine(`${new Date().toISOString()} ${msg}`);
  const provider = createProvider({ vscode, getClient, getConfig: settings, log });
  const status = new HealthStatus({ vscode, getClient });
  status.disabled = !settings().enabled;
  status.start();

  context.subscriptions.push(
    output,
    status,
    vscode.languages.registerInlineCompletionItemProvider({ pattern: '**' }, provider),
    vscode.commands.registerCommand('colibri.showStatus', async () => {
      const lines = [];
      try {
        const st = await getClient().status();
        const m = st.model || {};
        lines.push(`colibrid ${st.version} (pid ${st.pid}), socket ${getClient().socketPath}`);
        lines.push(`model ${m.path} (${m.architecture}, ${m.quant}), backend ${st.backend}, worker ${st.worker.state}`);
        const cache = st.cache ? `; prompt cache hit rate ${(100 * st.cache.hit_rate).toFixed(0)}%` : '';
        lines.push(`requests: ${st.requests.served} served, ${st.requests.cancelled} cancelled ` +
                   `(${st.requests.superseded || 0} superseded by a newer one); ` +
                   `${st.tokens.per_second.toFixed(1)} tokens/s${cache}`);
      } catch (err) {
        lines.push(`colibrid not reachable at ${getClient().socketPath}: ${err.message}`);
      }
      const s = provider.stats;
      lines.push(`this window: ${s.requests} requests, ${s.cancelsSent} cancelled by typing, ` +
                 `${s.completed} completed, ${s.errors} errors` + (s.lastError ? ` (last: ${s.lastError})` : ''));
      for (const l of lines) log(l);
      output.show(true);
      status.refresh();
    }),
    vscode.commands.registerCommand('colibri.toggle', async () => {
      const c = vscode.workspace.getConfiguration('colibri');
      // flipped where it is set: a workspace's value would hide a flip of the user's
      const set = c.inspect('enabled') || {};
      const target = set.workspaceValue !== undefined ? vscode.ConfigurationTarget.Workspace
                                                       : vscode.ConfigurationTarget.Global;
      await c.update('enabled', !c.get('enabled', true), target);
    }),
    vscode.window.onDidChangeActiveTextEditor((editor) => {
      if (editor && editor.document.uri.scheme === 'file') provider.warmUp(editor.document, editor.selection.active);
    }),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration('colibri')) {
        status.disabled = !settings().enabled;
        status.refresh();
      }
    }),
    { dispose: () => { if (client) client.close(); client = null; } },
  );
}

function deactivate() {
  if (client) client.close();
  client = null;
}

module.exports = { activate, deactivate };

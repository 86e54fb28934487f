'use strict';
// The status bar item: the daemon's health, polled over the client's connection.

/// Text and tooltip for a `health` reply, or for the error of a failed health call.
function describeHealth(health, error) {
  if (error || !health) {
    const why = error ? error.message : 'no answer';
    return { state: 'offline', text: '$(debug-disconnect) Colibri', tooltip: `Colibri: daemon not reachable (${why})` };
  }
  switch (health.status) {
    case 'ok':
      return { state: 'ok', text: health.worker === 'busy' ? '$(sync~spin) Colibri' : '$(check) Colibri',
               tooltip: `Colibri: ready (worker ${health.worker})` };
    case 'starting':
    case 'restarting':
      return { state: health.status, text: '$(loading~spin) Colibri',
               tooltip: `Colibri: the worker is ${health.status}` };
    default: {
      const msg = health.message ? `: ${health.message}` : '';
      return { state: health.status, text: '$(error) Colibri', tooltip: `Colibri: ${health.status}${msg}` };
    }
  }
}

/// Polls health every `pollMs` and shows it. `getClient()` gives the current client.
class HealthStatus {
  constructor({ vscode, getClient, pollMs = 5000, command = 'colibri.showStatus' }) {
    this.vscode = vscode;
    this.getClient = getClient;
    this.pollMs = pollMs;
    this.item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
    this.item.command = command;
    this.item.text = '$(loading~spin) Colibri';
    this.item.show();
    this.last = null;
    this.timer = null;
    this.disabled = false;
  }

  start() {
    const tick = () => {
      this.refresh().finally(() => {
        if (this.timer !== null) this.timer = setTimeout(tick, this.pollMs);
      });
    };
    this.timer = setTimeout(tick, 0);
  }

  async refresh() {
    let d;
    try {
      d = describeHealth(await this.getClient().health(), null);
    } catch (err) {
      d = describeHealth(null, err);
    }
    if (this.disabled) d = { ...d, text: '$(circle-slash) Colibri', tooltip: `${d.tooltip} — completions off` };
    this.last = d;
    this.item.text = d.text;
    this.item.tooltip = d.tooltip;
    return d;
  }

  dispose() {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.item.dispose();
  }
}

module.exports = { describeHealth, HealthStatus };

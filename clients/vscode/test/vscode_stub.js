'use strict';
// A minimal stand-in for the `vscode` module: the classes and enums the extension's
// provider and status bar use, plus documents and cancellation tokens built from strings.

class Position {
  constructor(line, character) {
    this.line = line;
    this.character = character;
  }
}

class Range {
  constructor(start, end) {
    this.start = start;
    this.end = end;
  }
}

class InlineCompletionItem {
  constructor(insertText, range) {
    this.insertText = insertText;
    this.range = range;
  }
}

class CancellationTokenSource {
  constructor() {
    const listeners = [];
    this._listeners = listeners;
    this.token = {
      isCancellationRequested: false,
      onCancellationRequested(fn) {
        listeners.push(fn);
        return { dispose() { const i = listeners.indexOf(fn); if (i >= 0) listeners.splice(i, 1); } };
      },
    };
  }

  cancel() {
    if (this.token.isCancellationRequested) return;
    this.token.isCancellationRequested = true;
    for (const fn of [...this._listeners]) fn();
  }
}

function textDocument(text, uri = 'file:///test.py') {
  const lines = text.split('\n');
  return {
    uri: { toString: () => uri },
    lineCount: lines.length,
    lineAt: (i) => ({ text: lines[i] }),
  };
}

function makeWindow() {
  const items = [];
  return {
    items,
    createStatusBarItem() {
      const item = { text: '', tooltip: '', command: null, shown: false, disposed: false,
                     show() { this.shown = true; }, dispose() { this.disposed = true; } };
      items.push(item);
      return item;
    },
  };
}

const vscode = {
  Position,
  Range,
  InlineCompletionItem,
  CancellationTokenSource,
  InlineCompletionTriggerKind: { Invoke: 0, Automatic: 1 },
  StatusBarAlignment: { Left: 1, Right: 2 },
  window: makeWindow(),
};

module.exports = { vscode, textDocument, makeWindow };

'use strict';
// The inline completion provider: debounces, sends the text around the cursor to
// colibrid, and turns the completion into an inline item (ghost text). VS Code's
// cancellation token cancels the request on the daemon. The `vscode` module is passed in,
// so this file runs under a stand-in in the tests.

const DEFAULTS = {
  enabled: true,
  maxTokens: 64,
  debounceMs: 75,
  multiline: true,
  maxLines: 8,
  stopOnDedent: true,
  temperature: 0,
  prefixLines: 64,
  suffixLines: 16,
  maxContextChars: 16384,
  timeoutMs: 5000,
  warmUp: true,
};

/// Resolves after `ms` or as soon as `token` is cancelled.
function delay(ms, token) {
  return new Promise((resolve) => {
    if (ms <= 0 || token.isCancellationRequested) return resolve();
    let sub = null;
    const timer = setTimeout(done, ms);
    sub = token.onCancellationRequested(done);
    function done() {
      clearTimeout(timer);
      if (sub) sub.dispose();
      resolve();
    }
  });
}

function isLowSurrogate(code) {
  return code >= 0xdc00 && code <= 0xdfff;
}

/// Keeps at most `max` UTF-16 units of `s` from its end (`fromEnd`) or start, dropping
/// whole lines first and never splitting a surrogate pair.
function capText(s, max, fromEnd) {
  if (s.length <= max) return s;
  if (fromEnd) {
    let cut = s.length - max;
    const nl = s.indexOf('\n', cut);
    if (nl >= 0 && nl < s.length - 1) cut = nl + 1;
    else if (isLowSurrogate(s.charCodeAt(cut))) cut += 1;
    return s.slice(cut);
  }
  let end = max;
  const nl = s.lastIndexOf('\n', end);
  if (nl > 0) end = nl;
  else if (isLowSurrogate(s.charCodeAt(end))) end -= 1;
  return s.slice(0, end);
}

/// The prompt (text before the cursor) and suffix (after it) within the line windows.
function extractContext(document, position, cfg) {
  const first = Math.max(0, position.line - cfg.prefixLines);
  const last = Math.min(document.lineCount - 1, position.line + cfg.suffixLines);
  const before = [];
  for (let i = first; i < position.line; i++) before.push(document.lineAt(i).text);
  const cur = document.lineAt(position.line).text;
  before.push(cur.slice(0, position.character));
  const after = [cur.slice(position.character)];
  for (let i = position.line + 1; i <= last; i++) after.push(document.lineAt(i).text);
  // a final newline is already there: the empty last line VS Code shows after it
  const suffix = after.join('\n');
  return {
    prompt: capText(before.join('\n'), cfg.maxContextChars, true),
    suffix: capText(suffix, cfg.maxContextChars, false),
  };
}

/// What is shown and inserted: no trailing blank lines, at most the allowed lines.
function finishText(text, cfg) {
  let t = text.replace(/\n\s*$/, '');
  const maxLines = cfg.multiline ? cfg.maxLines : 1;
  if (maxLines > 0) {
    const lines = t.split('\n');
    if (lines.length > maxLines) t = lines.slice(0, maxLines).join('\n');
  }
  return t;
}

/// The complete request's fields for this configuration.
function requestFields(prompt, suffix, session, cfg) {
  const fields = {
    prompt,
    suffix,
    max_tokens: cfg.maxTokens,
    temperature: cfg.temperature,
    timeout_ms: cfg.timeoutMs,
    session,
  };
  const maxLines = cfg.multiline ? cfg.maxLines : 1;
  if (maxLines > 0) fields.max_lines = maxLines;
  if (cfg.stopOnDedent) fields.stop_on_dedent = true;
  return fields;
}

/// vscode: the module (or a stand-in); getClient(): the ColibriClient to use;
/// getConfig(): an object with the keys of DEFAULTS (missing ones take the defaults).
function createProvider({ vscode, getClient, getConfig, log = () => {} }) {
  const sessions = new Map(); // document uri -> session name
  const stats = { requests: 0, cancelsSent: 0, cancelled: 0, completed: 0, errors: 0, lastError: null, warmUps: 0 };

  function sessionFor(document) {
    const key = document.uri.toString();
    let s = sessions.get(key);
    if (!s) {
      s = `vscode-${process.pid}-${sessions.size + 1}`;
      sessions.set(key, s);
    }
    return s;
  }

  async function provideInlineCompletionItems(document, position, context, token) {
    const cfg = { ...DEFAULTS, ...getConfig() };
    if (!cfg.enabled) return [];
    const invoked = context && vscode.InlineCompletionTriggerKind &&
                    context.triggerKind === vscode.InlineCompletionTriggerKind.Invoke;
    if (!invoked) await delay(cfg.debounceMs, token);
    if (token.isCancellationRequested) return [];

    const { prompt, suffix } = extractContext(document, position, cfg);
    const completion = getClient().complete(requestFields(prompt, suffix, sessionFor(document), cfg));
    stats.requests++;
    const sub = token.onCancellationRequested(() => {
      if (!completion.finished) stats.cancelsSent++;
      completion.cancel();
    });
    let done;
    try {
      done = await completion.promise;
    } catch (err) {
      stats.errors++;
      stats.lastError = `${err.code}: ${err.message}`;
      log(`completion failed: ${stats.lastError}`);
      return [];
    } finally {
      sub.dispose();
    }
    if (done.finish_reason === 'cancelled') {
      stats.cancelled++;
      return [];
    }
    stats.completed++;
    if (token.isCancellationRequested) return [];
    const text = finishText(done.text, cfg);
    if (text.trim() === '') return [];
    return [new vscode.InlineCompletionItem(text, new vscode.Range(position, position))];
  }

  /// Has the daemon process the context into its cache (max_tokens 0), e.g. when an
  /// editor becomes active, so the first keystroke's request pays only for what was typed.
  function warmUp(document, position) {
    const cfg = { ...DEFAULTS, ...getConfig() };
    if (!cfg.enabled || !cfg.warmUp) return null;
    const { prompt, suffix } = extractContext(document, position, cfg);
    const c = getClient().complete({ ...requestFields(prompt, suffix, sessionFor(document), cfg), max_tokens: 0 });
    stats.warmUps++;
    c.promise.catch(() => {}); // an older daemon refuses max_tokens 0: nothing lost
    return c;
  }

  return { provideInlineCompletionItems, warmUp, stats };
}

module.exports = { createProvider, extractContext, finishText, requestFields, capText, delay, DEFAULTS };

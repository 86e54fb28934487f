-- End-to-end test of the Neovim client in headless Neovim against a real colibrid.
-- Run by run.sh: nvim --headless -u NONE -i NONE --cmd 'set rtp^=clients/nvim' -c 'luafile <this>'
-- Environment: COLIBRID, COLIBRI_MODEL (and COLIBRI_WORKER when colibrid needs it).
-- Exits 0 when every check passed, 1 otherwise (messages on stderr).
local uv = vim.loop
local api = vim.api

local function log(msg)
  io.stderr:write(msg .. '\n')
end

local daemon = nil -- { handle, pid, exited }

local function fail(msg)
  log('FAIL: ' .. msg)
  if daemon and not daemon.exited then uv.kill(daemon.pid, 'sigterm') end
  vim.cmd('cquit 1')
end

local colibrid = assert(os.getenv('COLIBRID'), 'COLIBRID unset')
local model = assert(os.getenv('COLIBRI_MODEL'), 'COLIBRI_MODEL unset')
local worker = os.getenv('COLIBRI_WORKER')
local dir = vim.fn.tempname()
vim.fn.mkdir(dir, 'p')
local socket = dir .. '/run/colibri.sock'

local function start_daemon()
  local args = { '--model', model, '--socket', socket, '--log-level', 'warn', '--enable-fault-injection' }
  if worker and worker ~= '' then
    vim.list_extend(args, { '--worker-exe', worker })
  end
  local handle, pid
  handle, pid = uv.spawn(colibrid, { args = args, stdio = { nil, nil, 2 } }, function(code, signal)
    if daemon and daemon.pid == pid then daemon.exited = { code = code, signal = signal } end
    handle:close()
  end)
  assert(handle, 'cannot start ' .. colibrid .. ': ' .. tostring(pid))
  daemon = { handle = handle, pid = pid }
end

local function stop_daemon()
  if daemon and not daemon.exited then
    uv.kill(daemon.pid, 'sigterm')
  end
end

-- The test runs as a coroutine that yields to the main loop while it waits, so that typed
-- keys, timers and socket callbacks are processed as they are in a real session.
local co
local function sleep(ms)
  vim.defer_fn(function()
    local ok, err = coroutine.resume(co)
    if not ok then fail(debug.traceback(co, err)) end
  end, ms)
  coroutine.yield()
end

local function wait_for(what, cond, timeout_ms)
  local deadline = uv.now() + (timeout_ms or 10000)
  while not cond() do
    if uv.now() > deadline then
      fail('timed out waiting for ' .. what .. '; plugin stats: ' .. vim.inspect(require('colibri').stats()))
    end
    sleep(10)
  end
end

local function check(cond, msg)
  if not cond then fail(msg) end
end

local function type_keys(keys, gap_ms)
  for _, ch in ipairs(vim.split(keys, '')) do
    api.nvim_input(ch)
    sleep(gap_ms or 15)
  end
end

local function buffer_text()
  return table.concat(api.nvim_buf_get_lines(0, 0, -1, false), '\n')
end

local function daemon_health()
  local result
  require('colibri').query(function(h) result = h end)
  wait_for('a health reply', function() return result ~= nil end)
  return result
end

local function wait_healthy()
  wait_for('colibrid to be ready', function()
    local h = daemon_health()
    return h.event == 'health' and h.status == 'ok'
  end, 20000)
end

local function main()
  vim.o.showmode = false
  local colibri = require('colibri')
  local base = {
    socket = socket,
    debounce_ms = 20,
    max_tokens = 24,
    max_lines = 3,
    reconnect_min_ms = 20,
    reconnect_max_ms = 200,
  }
  colibri.setup(base)
  start_daemon()
  wait_healthy()
  log('daemon ready')

  -- 1. Typing produces ghost text; <Tab> inserts exactly it.
  vim.bo.filetype = 'python'
  api.nvim_buf_set_lines(0, 0, -1, false, {
    'def count_words(path):',
    '    """Return how many words the file at path holds."""',
    '',
    '',
    'def main():',
    '    print(count_words("README.md"))',
  })
  api.nvim_win_set_cursor(0, { 3, 0 })
  api.nvim_input('A')
  sleep(20)
  check(api.nvim_get_mode().mode == 'i', 'not in insert mode')
  type_keys('    total = ')
  wait_for('a finished suggestion', function()
    -- every request answered: an earlier keystroke's request may have finished first
    local s = colibri.stats()
    return s.completed >= 1 and s.requests == s.completed + s.cancelled + s.errors and colibri.suggestion() ~= nil
  end)
  local suggestion = colibri.suggestion()
  log('suggestion: ' .. vim.inspect(suggestion))
  -- Entering insert mode warmed the cache: the completion reused the processed context.
  local st = colibri.stats()
  check(st.warm_ups == 1, 'no warm-up request on entering insert mode')
  check(st.last_usage and st.last_usage.cached_tokens > 0, 'no cached tokens: ' .. vim.inspect(st))
  local typed = '    total = '
  local first_char = suggestion:sub(1, 1)
  if first_char ~= '\n' and #suggestion > 1 then
    -- Typing the suggestion's next character keeps the rest, with no new request.
    local s_before = colibri.stats()
    type_keys(first_char)
    sleep(60) -- longer than the debounce: a request would have gone out
    local s_after = colibri.stats()
    check(colibri.suggestion() == suggestion:sub(2), 'typing through: ' .. vim.inspect(colibri.suggestion()))
    check(s_after.requests == s_before.requests and s_after.cancels_sent == s_before.cancels_sent,
          'typing through sent requests: ' .. vim.inspect(s_after))
    check(s_after.typed_through == s_before.typed_through + 1, 'typing through not counted')
    typed = typed .. first_char
    suggestion = suggestion:sub(2)
  end
  local marks = api.nvim_buf_get_extmarks(0, require('colibri.ghost').ns, 0, -1, { details = true })
  check(#marks == 1, 'expected one ghost text mark, found ' .. #marks)
  local details = marks[1][4]
  local shown = {}
  if details.virt_text then shown[1] = details.virt_text[1][1] else shown[1] = '' end
  for _, vl in ipairs(details.virt_lines or {}) do shown[#shown + 1] = vl[1][1] end
  check(marks[1][2] == 2 and marks[1][3] == #typed, 'ghost text not at the cursor')
  check(table.concat(shown, '\n') == suggestion:gsub('\t', string.rep(' ', vim.bo.tabstop)),
        'ghost text differs from the suggestion: ' .. vim.inspect(shown))
  local before = buffer_text()
  local lines_before = api.nvim_buf_get_lines(0, 0, -1, false)
  api.nvim_input('<Tab>')
  wait_for('the suggestion to be inserted', function() return buffer_text() ~= before end)
  local expected = vim.deepcopy(lines_before)
  local ins = vim.split(suggestion, '\n', { plain = true })
  expected[3] = typed .. ins[1]
  for i = 2, #ins do table.insert(expected, 2 + i, ins[i]) end
  check(vim.deep_equal(api.nvim_buf_get_lines(0, 0, -1, false), expected),
        'accepting inserted something else:\n' .. buffer_text())
  local pos = api.nvim_win_get_cursor(0)
  check(pos[1] == 3 + #ins - 1 and pos[2] == #expected[3 + #ins - 1],
        'cursor not after the inserted text: ' .. vim.inspect(pos))
  check(colibri.stats().accepted == 1, 'accept not counted')
  log('accepted; buffer:\n' .. buffer_text())
  api.nvim_input('<Esc>')
  sleep(20)
  check(colibri.suggestion() == nil, 'suggestion still shown after <Esc>')

  -- 2. Typing on while a completion streams sends `cancel`, and the daemon confirms it.
  colibri.setup(vim.tbl_extend('force', base, {
    max_tokens = 64, max_lines = 0, stop_on_dedent = false,
    -- a completion slower than typing: every token a second late, so that even a middle the
    -- model ends after one token is still streaming when the next key arrives
    request = { debug_fault = { kind = 'slow', delay_ms = 1000 } },
  }))
  wait_healthy()
  api.nvim_buf_set_lines(0, 0, -1, false, { 'import os', '', 'def walk(root):', '' })
  api.nvim_win_set_cursor(0, { 4, 0 })
  api.nvim_input('A')
  type_keys('    for')
  wait_for('a first piece', function() return colibri.suggestion() ~= nil end)
  local s0 = colibri.stats()
  type_keys(colibri.suggestion():sub(1, 1) == 'x' and 'y' or 'x') -- not what it suggests
  wait_for('the daemon to confirm the cancel', function() return colibri.stats().cancelled > s0.cancelled end)
  local s1 = colibri.stats()
  check(s1.cancels_sent > s0.cancels_sent, 'no cancel sent: ' .. vim.inspect(s1))
  check(s1.finish_reasons[#s0.finish_reasons + 1] == 'cancelled',
        'the streaming request did not end cancelled: ' .. vim.inspect(s1.finish_reasons))
  wait_for('the next request to stream', function() return colibri.suggestion() ~= nil end)
  api.nvim_input('<Esc>') -- leaving insert mode cancels too
  wait_for('the cancel on <Esc>', function() return colibri.stats().cancelled > s1.cancelled end)
  check(colibri.stats().cancels_sent > s1.cancels_sent, 'no cancel sent on <Esc>')
  check(colibri.suggestion() == nil, 'suggestion still shown after <Esc>')
  check(colibri.stats().completed == s0.completed, 'a slow request completed: ' .. vim.inspect(colibri.stats()))
  log('cancel: ' .. vim.inspect(colibri.stats()))

  -- 2b. Without streaming (`request = { stream = false }`) the text comes with done.
  colibri.setup(vim.tbl_extend('force', base, { request = { stream = false } }))
  wait_healthy()
  api.nvim_buf_set_lines(0, 0, -1, false, { 'import os', '', '', 'def list_files(root):', '' })
  api.nvim_win_set_cursor(0, { 5, 0 })
  api.nvim_input('A')
  local unstreamed = colibri.stats().completed
  type_keys('    for name in os.')
  wait_for('a suggestion without streaming', function()
    return colibri.stats().completed > unstreamed and colibri.suggestion() ~= nil
  end)
  api.nvim_input('<Esc>')
  sleep(20)

  -- 3. The daemon restarts: the plugin reconnects and completes again.
  colibri.setup(base)
  wait_healthy()
  stop_daemon()
  wait_for('colibrid to exit', function() return daemon.exited ~= nil end)
  wait_for('the plugin to notice', function() return colibri.connection_state() ~= 'connected' end)
  -- :ColibriStatus says why: no socket at the path now
  local down
  colibri.query(function(h, st) down = colibri.status_lines(h, st) end)
  wait_for('the status of a stopped daemon', function() return down ~= nil end)
  check(down[2]:find('not reachable', 1, true) and down[2]:find('ENOENT', 1, true),
    'status of a stopped daemon: ' .. table.concat(down, '\n'))
  start_daemon()
  wait_for('the plugin to reconnect', function() return colibri.connection_state() == 'connected' end, 20000)
  wait_healthy()
  api.nvim_buf_set_lines(0, 0, -1, false, { 'import os', '', '', 'def list_files(root):', '' })
  api.nvim_win_set_cursor(0, { 5, 0 })
  api.nvim_input('A')
  type_keys('    for name in os.')
  local completed = colibri.stats().completed
  wait_for('a suggestion from the restarted daemon', function()
    return colibri.stats().completed > completed and colibri.suggestion() ~= nil
  end)
  log('after restart: ' .. vim.inspect(colibri.suggestion()))

  -- 4. The dismiss key and cursor moves take the suggestion away without touching the text.
  local text = buffer_text()
  api.nvim_input('<C-]>')
  wait_for('the dismiss key', function() return colibri.suggestion() == nil end)
  check(#api.nvim_buf_get_extmarks(0, require('colibri.ghost').ns, 0, -1, {}) == 0, 'ghost text left behind')
  check(buffer_text() == text, 'dismissing changed the buffer')
  completed = colibri.stats().completed
  type_keys('x')
  wait_for('a new suggestion', function()
    return colibri.stats().completed > completed and colibri.suggestion() ~= nil
  end)
  -- A change the plugin has not seen yet (no turn of the event loop since, as with keys
  -- still in the typeahead): the suggestion was made for the text before it.
  local n_lines = api.nvim_buf_line_count(0)
  api.nvim_buf_set_lines(0, n_lines, n_lines, false, { '# a line below' })
  check(colibri.suggestion() == nil, 'a suggestion made before a change it has not seen')
  check(colibri.accept() == false, 'accepted a suggestion made before a change it has not seen')
  api.nvim_buf_set_lines(0, n_lines, n_lines + 1, false, {})
  completed = colibri.stats().completed
  wait_for('the suggestion again', function()
    return colibri.stats().completed > completed and colibri.suggestion() ~= nil
  end)
  text = buffer_text()
  api.nvim_input('<Left>')
  wait_for('a cursor move to dismiss', function() return colibri.suggestion() == nil end)
  check(#api.nvim_buf_get_extmarks(0, require('colibri.ghost').ns, 0, -1, {}) == 0, 'ghost text left behind')
  check(buffer_text() == text, 'moving the cursor changed the buffer')
  local status_lines
  colibri.query(function(h, st) status_lines = colibri.status_lines(h, st) end)
  wait_for('status', function() return status_lines ~= nil end)
  check(status_lines[2]:find('daemon: ok', 1, true) ~= nil, 'status: ' .. table.concat(status_lines, '\n'))
  log(table.concat(status_lines, '\n'))
  api.nvim_input('<Esc>')
  sleep(20)

  -- 5. A byte that is not UTF-8 in the buffer (a Latin-1 "é"): the request still completes.
  api.nvim_buf_set_lines(0, 0, -1, false, { '# caf\233 au lait', 'def brew(cup):', '' })
  api.nvim_win_set_cursor(0, { 3, 0 })
  api.nvim_input('A')
  sleep(20)
  local before = colibri.stats()
  type_keys('    return ')
  wait_for('a completion of a buffer holding a byte that is not UTF-8', function()
    return colibri.stats().completed > before.completed
  end)
  check(colibri.stats().errors == before.errors, 'an error: ' .. vim.inspect(colibri.stats()))
  api.nvim_input('<Esc>')
  sleep(20)

  stop_daemon()
  wait_for('colibrid to exit', function() return daemon.exited ~= nil end)
  vim.fn.delete(dir, 'rf')
  log('PASS')
  vim.cmd('qall!')
end

local watchdog = uv.new_timer()
watchdog:start(60000, 0, vim.schedule_wrap(function()
  stop_daemon()
  fail('the test took over 60 s')
end))

co = coroutine.create(main)
vim.schedule(function()
  local ok, err = coroutine.resume(co)
  if not ok then
    stop_daemon()
    fail(debug.traceback(co, err))
  end
end)

-- llama.vim, llama.cpp's editor client, unchanged, in headless Neovim against colibrid's
-- llama-server-compatible /infill:
--   1. with the real engine on the default model: suggestions arrive as ghost text, <Tab>
--      inserts them, and the next keystroke's request reuses the cached prompt;
--   2. with a slow stand-in worker: a request that typing overtakes is cancelled (llama.vim
--      stops its curl, the connection closes, colibrid cancels the completion).
-- Run by run.sh. Exits 0 when every check passed, 1 otherwise (messages on stderr).
local uv = vim.loop
local api = vim.api

local function log(msg)
  io.stderr:write(msg .. '\n')
end

local daemon = nil -- { pid, exited }

local function fail(msg)
  log('FAIL: ' .. msg)
  if daemon and not daemon.exited then uv.kill(daemon.pid, 'sigterm') end
  vim.cmd('cquit 1')
end

local function env(name)
  return assert(os.getenv(name), name .. ' unset')
end

local colibrid, worker, test_worker = env('COLIBRID'), env('COLIBRI_WORKER'), env('COLIBRI_TEST_WORKER')
local client, model, llama_vim = env('COLIBRI_CLIENT'), env('COLIBRI_MODEL'), env('LLAMA_VIM')
local dir = vim.fn.tempname()
vim.fn.mkdir(dir, 'p')
local socket = dir .. '/colibri.sock'

local co
local function sleep(ms)
  vim.defer_fn(function()
    local ok, err = coroutine.resume(co)
    if not ok then fail(debug.traceback(co, err)) end
  end, ms)
  coroutine.yield()
end

local function check(cond, msg)
  if not cond then fail(msg) end
end

local function free_port()
  local t = uv.new_tcp()
  t:bind('127.0.0.1', 0)
  local port = t:getsockname().port
  t:close()
  return port
end

local function status()
  local out = vim.fn.system({ client, '--socket', socket, '--json', 'status' })
  local ok, st = pcall(vim.json.decode, out)
  return ok and st or {}
end

local function wait_for(what, cond, timeout_ms)
  local deadline = uv.now() + (timeout_ms or 15000)
  while not cond() do
    if uv.now() > deadline then fail('timed out waiting for ' .. what .. '; daemon status: ' .. vim.inspect(status())) end
    sleep(20)
  end
end

local function start_daemon(port, args)
  local all = { '--socket', socket, '--http', '127.0.0.1:' .. port, '--log-level', 'warn' }
  vim.list_extend(all, args)
  local handle, pid
  handle, pid = uv.spawn(colibrid, { args = all, stdio = { nil, nil, 2 } }, function(code, signal)
    if daemon and daemon.pid == pid then daemon.exited = { code = code, signal = signal } end
    handle:close()
  end)
  assert(handle, 'cannot start ' .. colibrid .. ': ' .. tostring(pid))
  daemon = { pid = pid }
  local url = 'http://127.0.0.1:' .. port .. '/health'
  wait_for('colibrid to answer /health', function()
    return vim.fn.system({ 'curl', '-s', url }):find('"ok"') ~= nil
  end, 30000)
end

local function stop_daemon()
  uv.kill(daemon.pid, 'sigterm')
  wait_for('colibrid to exit', function() return daemon.exited ~= nil end)
end

local function type_keys(keys, gap_ms)
  for _, ch in ipairs(vim.split(keys, '')) do
    api.nvim_input(ch)
    sleep(gap_ms or 15)
  end
end

-- What llama.vim shows: its ghost-text extmarks (first line, then the lines below).
local function ghost_text()
  local ns = api.nvim_create_namespace('vt_fim')
  local marks = api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
  local first, below = nil, {}
  for _, m in ipairs(marks) do
    local d = m[4]
    if d.virt_text then first = d.virt_text[1][1] end
    for _, vl in ipairs(d.virt_lines or {}) do below[#below + 1] = vl[1][1] end
  end
  return first, below
end

local function use_llama_vim(port, n_predict)
  vim.g.llama_config = {
    endpoint = 'http://127.0.0.1:' .. port .. '/infill',
    n_prefix = 256, n_suffix = 64, n_predict = n_predict,
    t_max_prompt_ms = 500, t_max_predict_ms = 3000,
    show_info = 2, auto_fim = true, max_line_suffix = 8,
    ring_n_chunks = 16, ring_chunk_size = 64, ring_scope = 1024, ring_update_ms = 1000,
  }
  vim.fn['llama#init']()
  sleep(700) -- llama.vim sends at most one request per 600 ms; start with a fresh window
end

local function main()
  vim.cmd('source ' .. vim.fn.fnameescape(llama_vim))

  -- 1. The real engine: a suggestion arrives and <Tab> inserts it; the cache is reused.
  local port = free_port()
  start_daemon(port, { '--model', model, '--worker-exe', worker, '--threads', '1' })
  log('colibrid (engine) on port ' .. port)
  use_llama_vim(port, 24)
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
  type_keys('    with open(')
  wait_for('llama.vim to show a suggestion', function() return ghost_text() ~= nil end)
  local first, below = ghost_text()
  log('suggestion: ' .. vim.inspect({ first, below }))
  check(status().requests.served >= 1, 'no request served: ' .. vim.inspect(status()))

  local typed = '    with open('
  api.nvim_input('<Tab>')
  wait_for('the suggestion to be inserted', function()
    return api.nvim_buf_get_lines(0, 2, 3, false)[1] ~= typed
  end)
  local lines = api.nvim_buf_get_lines(0, 2, 3 + #below, false)
  check(lines[1] == typed .. first, 'accepted line differs: ' .. vim.inspect(lines[1]) .. ' vs ' .. vim.inspect(typed .. first))
  for i, l in ipairs(below) do
    check(lines[i + 1] == l, 'accepted line ' .. (i + 1) .. ' differs: ' .. vim.inspect(lines[i + 1]))
  end
  log('accepted')

  -- Each keystroke's request shares the prompt up to the cursor with the last one: its
  -- tokens are reused.
  local function keystroke(key)
    sleep(700) -- past llama.vim's 600 ms deferral: this key sends its own request
    wait_for('no request in flight', function() return status().in_flight == 0 end)
    local before = status()
    type_keys(key)
    wait_for('the request of ' .. key, function() return status().requests.served > before.requests.served end)
    wait_for('no request in flight', function() return status().in_flight == 0 end)
  end
  keystroke(' ')
  local cache0 = status().cache
  keystroke('x')
  local cache1 = status().cache
  check(cache1.cached_tokens > cache0.cached_tokens,
        'no prompt tokens reused: ' .. vim.inspect({ before = cache0, after = cache1 }))
  log('cache reused: ' .. (cache1.cached_tokens - cache0.cached_tokens) .. ' tokens')
  api.nvim_input('<Esc>')
  stop_daemon()

  -- 2. A slow completion overtaken by typing is cancelled.
  local slow_model = dir .. '/slow.colibri'
  vim.fn.writefile({ 'slow 300' }, slow_model)
  port = free_port()
  start_daemon(port, { '--model', slow_model, '--worker-exe', test_worker })
  log('colibrid (slow stand-in) on port ' .. port)
  use_llama_vim(port, 24)
  api.nvim_buf_set_lines(0, 0, -1, false, { 'import os', '', 'def walk(root):', '' })
  api.nvim_win_set_cursor(0, { 4, 0 })
  api.nvim_input('A')
  type_keys('    f')
  wait_for('a running request', function() return (status().in_flight or 0) >= 1 end)
  type_keys('o') -- llama.vim stops the old request's curl when it sends the next
  wait_for('colibrid to cancel the overtaken request', function()
    return (status().requests.cancelled or 0) >= 1
  end)
  log('overtaken request cancelled')
  api.nvim_input('<Esc>')
  stop_daemon()
  vim.cmd('qall!')
end

co = coroutine.create(function()
  local ok, err = xpcall(main, debug.traceback)
  if not ok then fail(err) end
end)
vim.schedule(function()
  local ok, err = coroutine.resume(co)
  if not ok then fail(debug.traceback(co, err)) end
end)

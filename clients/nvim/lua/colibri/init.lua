-- Colibri for Neovim: completions from colibrid shown as ghost text while typing.
-- require('colibri').setup({ ... }) -- options in lua/colibri/config.lua and docs/editors.md
local config = require('colibri.config')
local Connection = require('colibri.connection')
local context = require('colibri.context')
local ghost = require('colibri.ghost')

local uv = vim.loop
local api = vim.api

local M = {}

local S = {
  cfg = nil,
  conn = nil,
  enabled = false,
  timer = nil,
  -- The current request and its suggestion: { id, buf, row, col, text, finished,
  -- finish_reason, sent_at, first_at }. One at a time: typing on replaces it.
  cur = nil,
  stats = {
    requests = 0,        -- complete requests sent
    cancels_sent = 0,    -- cancel requests sent because the user typed on or moved away
    cancelled = 0,       -- requests that ended with finish_reason "cancelled"
    completed = 0,       -- requests that ended with another finish_reason
    errors = 0,
    accepted = 0,
    typed_through = 0,   -- characters typed that matched the suggestion (kept, not re-requested)
    warm_ups = 0,        -- max_tokens 0 requests sent on entering insert mode
    last_error = nil,
    last_first_piece_ms = nil, -- request sent to its first piece
    last_total_ms = nil,       -- request sent to its final line
    last_usage = nil,          -- `usage` of the last completed request (prompt, cached tokens)
    finish_reasons = {},       -- the last few, newest last (for :ColibriStatus)
  },
}

local function now_ms()
  return uv.hrtime() / 1e6
end

local function display_text(text)
  -- A trailing run of blank lines is invisible as ghost text: neither shown nor inserted.
  local t = text:gsub('\n%s*$', '')
  if not t:find('%S') then return '' end -- only blanks: nothing visible to show
  if S.cfg.max_lines > 0 then
    local lines = vim.split(t, '\n', { plain = true })
    if #lines > S.cfg.max_lines then
      t = table.concat(vim.list_slice(lines, 1, S.cfg.max_lines), '\n')
    end
  end
  return t
end

local function cursor()
  local pos = api.nvim_win_get_cursor(0)
  return api.nvim_get_current_buf(), pos[1] - 1, pos[2]
end

local function at_anchor(cur)
  local buf, row, col = cursor()
  return cur.buf == buf and cur.row == row and cur.col == col
end

local function render()
  local cur = S.cur
  if not cur then return end
  local text = display_text(cur.text)
  if text == '' or not at_anchor(cur) or not api.nvim_buf_is_valid(cur.buf) then
    ghost.clear(cur.buf)
    return
  end
  ghost.show(cur.buf, cur.row, cur.col, text, S.cfg.hl_group)
end

--- Forgets the current suggestion; a request still running is cancelled.
local function invalidate()
  local cur = S.cur
  if not cur then return end
  S.cur = nil
  ghost.clear(cur.buf)
  if not cur.finished and S.conn:cancel(cur.id) then
    S.stats.cancels_sent = S.stats.cancels_sent + 1
  end
end

local function record_final(ev, cur)
  local st = S.stats
  cur.finished = true
  cur.finish_reason = ev.finish_reason or ev.code
  if ev.event == 'done' then
    if ev.finish_reason == 'cancelled' then
      st.cancelled = st.cancelled + 1
    else
      st.completed = st.completed + 1
      st.last_total_ms = now_ms() - cur.sent_at
      if type(ev.usage) == 'table' then st.last_usage = ev.usage end
    end
  else
    st.errors = st.errors + 1
    st.last_error = (ev.code or 'error') .. ': ' .. (ev.message or '')
  end
  table.insert(st.finish_reasons, cur.finish_reason)
  if #st.finish_reasons > 32 then table.remove(st.finish_reasons, 1) end
end

local function filetype_enabled(buf)
  local ft = vim.bo[buf].filetype
  local v = S.cfg.filetypes[ft]
  if v == nil then v = S.cfg.filetypes['*'] end
  return v == true
end

local request_now

local function schedule_request()
  S.timer:stop()
  S.timer:start(S.cfg.debounce_ms, 0, vim.schedule_wrap(function() request_now() end))
end

local function completion_fields(buf, row, col, max_tokens)
  local prompt, suffix = context.around(buf, row, col, S.cfg)
  local fields = {
    op = 'complete',
    prompt = prompt,
    suffix = suffix,
    max_tokens = max_tokens,
    temperature = S.cfg.temperature,
    timeout_ms = S.cfg.timeout_ms,
    -- One session per buffer: a newer request of the buffer ends an older one on the daemon.
    session = ('nvim-%d-%d'):format(uv.os_getpid(), buf),
  }
  if S.cfg.max_lines > 0 then fields.max_lines = S.cfg.max_lines end
  if S.cfg.stop_on_dedent then fields.stop_on_dedent = true end
  for k, v in pairs(S.cfg.request) do
    fields[k] = v
  end
  return fields
end

local function wanted_here()
  if not S.enabled then return false end
  if api.nvim_get_mode().mode:sub(1, 1) ~= 'i' then return false end
  local buf = api.nvim_get_current_buf()
  return vim.bo[buf].buftype == '' and filetype_enabled(buf)
end

--- Entering insert mode: the context is processed into the daemon's cache (max_tokens 0),
--- so the first keystroke's request pays only for what was typed.
local function warm_up()
  if not S.cfg.warm_up or not wanted_here() or S.cur then return end
  local buf, row, col = cursor()
  S.stats.warm_ups = S.stats.warm_ups + 1
  S.conn:request(completion_fields(buf, row, col, 0), function() end)
end

request_now = function()
  if not wanted_here() then return end
  local buf, row, col = cursor()
  invalidate()
  local fields = completion_fields(buf, row, col, S.cfg.max_tokens)
  local line = api.nvim_buf_get_lines(buf, row, row + 1, false)[1] or ''
  local cur = {
    buf = buf, row = row, col = col, text = '', finished = false, sent_at = now_ms(),
    rest = line:sub(col + 1), -- the line after the cursor, to recognise typing through
    tick = api.nvim_buf_get_changedtick(buf),
  }
  S.cur = cur
  S.stats.requests = S.stats.requests + 1
  cur.id = S.conn:request(fields, function(ev)
    if ev.event == 'piece' then
      if cur.first_at == nil then
        cur.first_at = now_ms()
        S.stats.last_first_piece_ms = cur.first_at - cur.sent_at
      end
      cur.text = cur.text .. (ev.text or '')
      if S.cur == cur then render() end
      return
    end
    -- the whole text comes with done when `request` asked for stream = false
    if ev.event == 'done' and cur.text == '' and type(ev.text) == 'string' then cur.text = ev.text end
    record_final(ev, cur)
    if S.cur ~= cur then return end
    render()
    if cur.typed_through and display_text(cur.text) == '' and S.enabled then
      schedule_request() -- typed to the end of what came: ask for what follows
    end
  end)
end

--- Typing the suggestion's own next characters keeps it: the anchor moves past them and
--- the request (finished or still streaming) stays. Returns true when that is what the
--- cursor and the line show.
local function type_through()
  local cur = S.cur
  if not cur then return false end
  local buf, row, col = cursor()
  if buf ~= cur.buf or row ~= cur.row or col <= cur.col then return false end
  local line = api.nvim_buf_get_lines(buf, row, row + 1, false)[1] or ''
  local typed = line:sub(cur.col + 1, col)
  if line:sub(col + 1) ~= cur.rest or cur.text:sub(1, #typed) ~= typed then return false end
  cur.col = col
  cur.text = cur.text:sub(#typed + 1)
  cur.tick = api.nvim_buf_get_changedtick(buf)
  cur.typed_through = true
  S.stats.typed_through = S.stats.typed_through + #typed
  render()
  return true
end

local function on_text_changed()
  local cur = S.cur
  if cur and at_anchor(cur) and cur.tick == api.nvim_buf_get_changedtick(cur.buf) then
    -- CursorMovedI came first and found the user typing through the suggestion.
  elseif not type_through() then
    invalidate()
    if S.enabled then schedule_request() end
    return
  end
  S.timer:stop()
  if cur.finished and display_text(cur.text) == '' then
    invalidate() -- typed all of it
    if S.enabled then schedule_request() end
  end
end

local function on_cursor_moved()
  if S.cur and not at_anchor(S.cur) and not type_through() then invalidate() end
end

local function on_leave()
  S.timer:stop()
  invalidate()
end

--- The suggestion on screen, or nil.
function M.suggestion()
  local cur = S.cur
  -- at the cursor, and for the text as it is (keys still in the typeahead may have changed
  -- it before TextChangedI ran)
  if not cur or not at_anchor(cur) or cur.tick ~= api.nvim_buf_get_changedtick(cur.buf) then return nil end
  local text = display_text(cur.text)
  if text == '' then return nil end
  return text
end

function M.is_visible()
  return M.suggestion() ~= nil
end

--- Inserts the suggestion (or its first line when `first_line_only`) at the cursor.
--- Returns true when something was inserted.
function M.accept(first_line_only)
  local text = M.suggestion()
  if not text then return false end
  local cur = S.cur
  if first_line_only then
    local nl = text:find('\n', 1, true)
    if nl == 1 then
      nl = text:find('\n', 2, true) -- the suggestion starts a new line: take that line
    end
    if nl then text = text:sub(1, nl - 1) end
  end
  invalidate()
  local lines = vim.split(text, '\n', { plain = true })
  api.nvim_buf_set_text(cur.buf, cur.row, cur.col, cur.row, cur.col, lines)
  local end_row = cur.row + #lines - 1
  local end_col = (#lines == 1 and cur.col or 0) + #lines[#lines]
  api.nvim_win_set_cursor(0, { end_row + 1, end_col })
  S.stats.accepted = S.stats.accepted + 1
  return true
end

function M.dismiss()
  S.timer:stop()
  invalidate()
end

function M.stats()
  return vim.deepcopy(S.stats)
end

function M.config()
  return S.cfg
end

--- 'connected', 'connecting' or 'disconnected'.
function M.connection_state()
  return S.conn and S.conn.state or 'disconnected'
end

--- Asks the daemon for `health` and `status`; calls cb(health, status) (nil on failure).
function M.query(cb)
  local health
  S.conn:request({ op = 'health' }, function(h)
    health = h
    S.conn:request({ op = 'status' }, function(st)
      cb(health, st.event == 'status' and st or nil)
    end)
  end)
end

local function fmt_ms(v)
  return v and ('%.0f ms'):format(v) or '-'
end

--- Lines for :ColibriStatus.
function M.status_lines(health, status)
  local st = S.stats
  local out = {
    ('colibri: %s, socket %s (%s)'):format(S.enabled and 'enabled' or 'disabled', S.cfg.socket,
      M.connection_state()),
  }
  if health and health.event == 'health' then
    local line = ('daemon: %s, worker %s'):format(health.status, tostring(health.worker))
    if health.message then line = line .. ' (' .. health.message .. ')' end
    out[#out + 1] = line
  elseif health then
    out[#out + 1] = ('daemon: not reachable (%s)'):format(health.message or health.code or '?')
  end
  if status then
    local model = status.model or {}
    out[#out + 1] = ('model: %s (%s, %s), backend %s'):format(tostring(model.path), tostring(model.architecture),
      tostring(model.quant), tostring(status.backend))
    local req = status.requests or {}
    local line = ('daemon requests: %s served, %s cancelled (%s superseded by a newer one); %.1f tokens/s'):format(
      tostring(req.served), tostring(req.cancelled), tostring(req.superseded or 0),
      (status.tokens and status.tokens.per_second) or 0)
    if type(status.cache) == 'table' and status.cache.hit_rate then
      line = line .. ('; prompt cache hit rate %.0f%%'):format(100 * status.cache.hit_rate)
    end
    out[#out + 1] = line
  end
  out[#out + 1] = ('this editor: %d requests, %d cancels sent, %d completed, %d cancelled, %d errors, %d accepted, '
    .. '%d characters typed through'):format(st.requests, st.cancels_sent, st.completed, st.cancelled, st.errors,
    st.accepted, st.typed_through)
  local last = ('last request: first piece %s, done %s'):format(fmt_ms(st.last_first_piece_ms),
    fmt_ms(st.last_total_ms))
  if st.last_usage then
    last = last .. (', %s prompt tokens (%s from the cache)'):format(tostring(st.last_usage.prompt_tokens),
      tostring(st.last_usage.cached_tokens))
  end
  out[#out + 1] = last
  if st.last_error then out[#out + 1] = 'last error: ' .. st.last_error end
  return out
end

function M.show_status()
  M.query(function(health, status)
    vim.api.nvim_echo({ { table.concat(M.status_lines(health, status), '\n') } }, true, {})
  end)
end

function M.enable()
  S.enabled = true
end

function M.disable()
  S.enabled = false
  M.dismiss()
end

function M.toggle()
  if S.enabled then M.disable() else M.enable() end
end

local function map_key(lhs, fn)
  if not lhs or lhs == '' then return end
  local fallback = api.nvim_replace_termcodes(lhs, true, false, true)
  vim.keymap.set('i', lhs, function()
    if not fn() then
      api.nvim_feedkeys(fallback, 'n', false)
    end
  end, { silent = true, desc = 'colibri' })
end

function M.setup(opts)
  if S.conn then S.conn:close() end
  S.cfg = config.resolve(opts)
  S.enabled = S.cfg.enabled
  S.conn = Connection.new({
    socket = S.cfg.socket,
    client = 'colibri.nvim',
    reconnect_min_ms = S.cfg.reconnect_min_ms,
    reconnect_max_ms = S.cfg.reconnect_max_ms,
    on_state = function(state)
      -- gone with the connection (its handler gets the 'disconnected' error, or none after
      -- close()); a request queued while connecting is still cancellable
      if state == 'disconnected' and S.cur and not S.cur.finished then S.cur.finished = true end
    end,
  })
  if not S.timer then S.timer = uv.new_timer() end
  vim.cmd('highlight default link ColibriSuggestion Comment')

  local group = api.nvim_create_augroup('colibri', { clear = true })
  api.nvim_create_autocmd('TextChangedI', { group = group, callback = on_text_changed })
  api.nvim_create_autocmd('CursorMovedI', { group = group, callback = on_cursor_moved })
  api.nvim_create_autocmd('InsertEnter', { group = group, callback = vim.schedule_wrap(warm_up) })
  api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave', 'WinLeave' }, { group = group, callback = on_leave })
  api.nvim_create_autocmd('VimLeavePre', {
    group = group,
    callback = function()
      S.conn:close()
    end,
  })

  map_key(S.cfg.keys.accept, function() return M.accept(false) end)
  map_key(S.cfg.keys.accept_line, function() return M.accept(true) end)
  map_key(S.cfg.keys.dismiss, function()
    local shown = M.is_visible()
    M.dismiss()
    return shown
  end)

  S.conn:connect() -- warm: the first keystroke does not wait for a connection
end

return M

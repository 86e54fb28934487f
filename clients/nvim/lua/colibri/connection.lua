-- One persistent connection to colibrid (docs/protocol.md): NDJSON over a Unix socket,
-- requests matched to their events by id. When the daemon goes away the connection is
-- retried with backoff, so a restarted daemon is picked up without user action.
local uv = vim.loop

local Connection = {}
Connection.__index = Connection

-- The line with every byte that is not part of a UTF-8 character replaced by U+FFFD (a
-- buffer can hold such bytes): the daemon refuses a line that is not UTF-8, and its error
-- could not name the request. JSON's own syntax is ASCII, so only text changes.
local function valid_utf8(s)
  if not s:find('[\128-\255]') then return s end
  local out, from, i, n = {}, 1, 1, #s
  while i <= n do
    local c = s:byte(i)
    local len = c < 0x80 and 1 or (c >= 0xC2 and c <= 0xDF) and 2 or (c >= 0xE0 and c <= 0xEF) and 3
      or (c >= 0xF0 and c <= 0xF4) and 4 or 0
    local ok = len > 0 and i + len - 1 <= n
    for k = 1, len - 1 do
      if not ok then break end
      local b = s:byte(i + k)
      local lo, hi = 0x80, 0xBF -- the second byte's range excludes overlong forms and surrogates
      if k == 1 then
        if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F
        elseif c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
      end
      ok = b >= lo and b <= hi
    end
    if ok then
      i = i + len
    else
      out[#out + 1] = s:sub(from, i - 1) .. '\239\191\189'
      i = i + 1
      from = i
    end
  end
  out[#out + 1] = s:sub(from)
  return table.concat(out)
end
Connection.valid_utf8 = valid_utf8

--- opts: socket, client (name for hello), reconnect_min_ms, reconnect_max_ms,
--- on_state(state) called with 'connected' / 'disconnected' on the main loop.
function Connection.new(opts)
  local self = setmetatable({}, Connection)
  self.opts = opts
  self.state = 'disconnected' -- 'connecting', 'connected'
  self.pipe = nil
  self.buf = ''
  self.next_id = 1
  self.handlers = {} -- id -> function(event)
  self.queue = {} -- lines waiting for the connection
  self.backoff = opts.reconnect_min_ms
  self.retry_timer = nil
  self.server = nil
  self.last_error = nil
  self.connects = 0
  self.closed = false
  return self
end

function Connection:_set_state(state)
  if self.state == state then return end
  self.state = state
  if self.opts.on_state then
    self.opts.on_state(state)
  end
end

--- Starts connecting unless connected or connecting. Lines written meanwhile are queued.
function Connection:connect()
  if self.closed or self.state ~= 'disconnected' then return end
  if self.retry_timer then
    self.retry_timer:stop()
    self.retry_timer:close()
    self.retry_timer = nil
  end
  self:_set_state('connecting')
  local pipe = uv.new_pipe(false)
  self.pipe = pipe
  pipe:connect(self.opts.socket, function(err)
    vim.schedule(function()
      if self.pipe ~= pipe then return end
      if err then
        self.last_error = err
        self:_drop(pipe)
        return
      end
      self.connects = self.connects + 1
      self.last_error = nil
      self.backoff = self.opts.reconnect_min_ms
      self.buf = ''
      pipe:read_start(function(rerr, chunk)
        -- Fast event context: only hand the bytes to the main loop.
        vim.schedule(function()
          if self.pipe ~= pipe then return end
          if rerr or not chunk then
            self.last_error = rerr or self.last_error or 'closed by colibrid' -- a forbidden, say, came first
            self:_drop(pipe)
          else
            self:_on_data(chunk)
          end
        end)
      end)
      self:_set_state('connected')
      local hello_id = self:_take_id()
      self.handlers[hello_id] = function(ev)
        self.server = ev.server
      end
      self:_raw_write(vim.json.encode({ id = hello_id, op = 'hello', protocol = 1, client = self.opts.client }))
      local queued = self.queue
      self.queue = {}
      for _, line in ipairs(queued) do
        self:_raw_write(line)
      end
    end)
  end)
end

function Connection:_take_id()
  local id = self.next_id
  self.next_id = self.next_id + 1
  return id
end

function Connection:_raw_write(line)
  if self.pipe and self.state == 'connected' then
    self.pipe:write(line .. '\n')
  end
end

--- Lost the connection: every request still waiting gets a local 'disconnected' error,
--- then a reconnect is scheduled.
function Connection:_drop(pipe)
  if self.pipe == pipe then
    self.pipe = nil
  end
  if not pipe:is_closing() then
    pipe:close()
  end
  local handlers = self.handlers
  self.handlers = {}
  self.queue = {}
  self:_set_state('disconnected')
  local message = 'the connection to colibrid closed'
  if self.last_error then message = message .. ': ' .. tostring(self.last_error) end
  for id, h in pairs(handlers) do
    h({ id = id, event = 'error', code = 'disconnected', message = message })
  end
  self:_schedule_retry()
end

function Connection:_schedule_retry()
  if self.closed or self.retry_timer then return end
  local delay = self.backoff
  self.backoff = math.min(self.backoff * 2, self.opts.reconnect_max_ms)
  self.retry_timer = uv.new_timer()
  self.retry_timer:start(delay, 0, function()
    vim.schedule(function()
      if self.retry_timer then
        self.retry_timer:close()
        self.retry_timer = nil
      end
      self:connect()
    end)
  end)
end

function Connection:_on_data(chunk)
  self.buf = self.buf .. chunk
  while true do
    local nl = self.buf:find('\n', 1, true)
    if not nl then break end
    local line = self.buf:sub(1, nl - 1):gsub('\r$', '')
    self.buf = self.buf:sub(nl + 1)
    if line ~= '' then
      local ok, ev = pcall(vim.json.decode, line)
      if ok and type(ev) == 'table' then
        self:_dispatch(ev)
      end
    end
  end
end

function Connection:_dispatch(ev)
  local id = ev.id
  if id == nil or id == vim.NIL then -- connection-wide error (forbidden, ...); the close follows
    if ev.event == 'error' then self.last_error = tostring(ev.code) .. ': ' .. tostring(ev.message) end
    return
  end
  local h = self.handlers[id]
  if not h then return end
  local final = ev.event ~= 'piece'
  if final then
    self.handlers[id] = nil
  end
  h(ev)
end

--- Sends a request; `handler(event)` receives every event of it (for a completion: the
--- pieces and the final done/error; otherwise the one reply). Returns the request id.
function Connection:request(fields, handler)
  local id = self:_take_id()
  local msg = vim.tbl_extend('force', {}, fields, { id = id })
  self.handlers[id] = handler
  local line = valid_utf8(vim.json.encode(msg))
  if self.state == 'connected' then
    self:_raw_write(line)
  else
    table.insert(self.queue, line)
    self:connect()
  end
  return id
end

--- Sends `cancel` for a request still in flight. Returns true when one was sent.
function Connection:cancel(target)
  if self.handlers[target] == nil then return false end
  if self.state ~= 'connected' then
    -- Still queued: drop it before it is ever sent.
    local h = self.handlers[target]
    self.handlers[target] = nil
    local keep = {}
    for _, line in ipairs(self.queue) do
      local ok, msg = pcall(vim.json.decode, line)
      if not (ok and msg.id == target) then table.insert(keep, line) end
    end
    self.queue = keep
    h({ id = target, event = 'done', finish_reason = 'cancelled' })
    return false
  end
  self:_raw_write(vim.json.encode({ id = self:_take_id(), op = 'cancel', target = target }))
  return true
end

function Connection:close()
  self.closed = true
  if self.retry_timer then
    self.retry_timer:stop()
    self.retry_timer:close()
    self.retry_timer = nil
  end
  if self.pipe then
    local pipe = self.pipe
    self.pipe = nil
    if not pipe:is_closing() then pipe:close() end
  end
  self.handlers = {}
  self.queue = {}
  self:_set_state('disconnected')
end

return Connection

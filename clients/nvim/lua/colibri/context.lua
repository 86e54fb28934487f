-- The text around the cursor that goes into a request: `prompt` (before the cursor) and
-- `suffix` (after it), limited to configured line windows and a byte cap each.
local M = {}

-- Cuts `s` to at most `max` bytes, keeping its end, without splitting a UTF-8 character.
local function keep_tail(s, max)
  if #s <= max then return s end
  local start = #s - max + 1
  while start <= #s do
    local b = s:byte(start)
    if b < 0x80 or b >= 0xC0 then break end -- not a continuation byte
    start = start + 1
  end
  return s:sub(start)
end

-- Cuts `s` to at most `max` bytes, keeping its start, without splitting a UTF-8 character.
local function keep_head(s, max)
  if #s <= max then return s end
  local stop = max + 1 -- first byte dropped
  while stop > 1 do
    local b = s:byte(stop)
    if b < 0x80 or b >= 0xC0 then break end
    stop = stop - 1
  end
  return s:sub(1, stop - 1)
end

M.keep_tail = keep_tail
M.keep_head = keep_head

--- row: 0-based line, col: 0-based byte column of the cursor.
function M.around(buf, row, col, cfg)
  local first = math.max(0, row - cfg.prefix_lines)
  local last = row + cfg.suffix_lines + 1 -- exclusive
  local lines = vim.api.nvim_buf_get_lines(buf, first, last, false)
  local cur = lines[row - first + 1] or ''
  local before = {}
  for i = 1, row - first do
    before[#before + 1] = lines[i]
  end
  before[#before + 1] = cur:sub(1, col)
  local after = { cur:sub(col + 1) }
  for i = row - first + 2, #lines do
    after[#after + 1] = lines[i]
  end
  local prompt = keep_tail(table.concat(before, '\n'), cfg.max_context_bytes)
  local suffix = keep_head(table.concat(after, '\n'), cfg.max_context_bytes)
  -- A final newline is part of the file (unless 'noeol'): the model has seen files end so.
  if last >= vim.api.nvim_buf_line_count(buf) and #suffix < cfg.max_context_bytes then
    suffix = suffix .. '\n'
  end
  return prompt, suffix
end

return M

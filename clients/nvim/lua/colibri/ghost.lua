-- Shows a suggestion as virtual text at the cursor ("ghost text"): the first line after
-- the cursor, the following lines as virtual lines below it. Nothing is written to the
-- buffer until the suggestion is accepted.
local M = {}

local ns = vim.api.nvim_create_namespace('colibri')
local mark_id = 1
M.ns = ns

-- Inline virtual text (shifting the rest of the line) exists from Neovim 0.10 on; before
-- that the first line is drawn over the rest of the line, which is redrawn after it.
local has_inline = vim.fn.has('nvim-0.10') == 1

local function expand_tabs(s, buf)
  if not s:find('\t', 1, true) then return s end
  local ts = vim.bo[buf].tabstop
  return (s:gsub('\t', string.rep(' ', ts)))
end

function M.clear(buf)
  if buf and vim.api.nvim_buf_is_valid(buf) then
    pcall(vim.api.nvim_buf_del_extmark, buf, ns, mark_id)
  end
end

--- Draws `text` at (row, col) of `buf` (0-based), replacing what was drawn before.
function M.show(buf, row, col, text, hl)
  local lines = vim.split(text, '\n', { plain = true })
  local line = vim.api.nvim_buf_get_lines(buf, row, row + 1, false)[1] or ''
  local rest = line:sub(col + 1)
  local opts = { id = mark_id, hl_mode = 'combine', priority = 200 }
  local first = expand_tabs(lines[1], buf)
  if has_inline then
    if first ~= '' then
      opts.virt_text = { { first, hl } }
      opts.virt_text_pos = 'inline'
    end
  elseif #lines == 1 then
    -- The rest of the line follows the suggestion, as it will after accepting.
    opts.virt_text = { { first, hl }, { expand_tabs(rest, buf), 'Normal' } }
    opts.virt_text_pos = 'overlay'
  elseif first ~= '' or rest ~= '' then
    -- The rest of the line moves to the last suggested line: blank it out here.
    local pad = math.max(0, vim.fn.strdisplaywidth(rest) - vim.fn.strdisplaywidth(first))
    opts.virt_text = { { first, hl }, { string.rep(' ', pad), 'Normal' } }
    opts.virt_text_pos = 'overlay'
  end
  if #lines > 1 then
    local virt_lines = {}
    for i = 2, #lines do
      local chunks = { { expand_tabs(lines[i], buf), hl } }
      if i == #lines and not has_inline and rest ~= '' then
        chunks[2] = { expand_tabs(rest, buf), 'Normal' }
      end
      virt_lines[#virt_lines + 1] = chunks
    end
    opts.virt_lines = virt_lines
  end
  vim.api.nvim_buf_set_extmark(buf, ns, row, col, opts)
end

return M

-- Defaults of the Neovim client; `require('colibri').setup(opts)` overrides any of them.
local M = {}

local function default_socket()
  local runtime = os.getenv('XDG_RUNTIME_DIR')
  if runtime and runtime ~= '' then
    return runtime .. '/colibri/colibri.sock'
  end
  return '/tmp/colibri-' .. vim.loop.getuid() .. '/colibri.sock'
end

M.defaults = {
  socket = nil,            -- nil: the daemon's default path (docs/protocol.md, Transport)
  enabled = true,          -- request completions while typing
  filetypes = { ['*'] = true }, -- e.g. { ['*'] = true, markdown = false }
  debounce_ms = 75,        -- quiet time after a keystroke before a request goes out
  prefix_lines = 64,       -- lines above the cursor sent as the prompt
  suffix_lines = 16,       -- lines below the cursor sent as the suffix
  max_context_bytes = 16384, -- cap on prompt and on suffix (each), kept nearest the cursor
  max_tokens = 64,
  max_lines = 8,           -- 1: the rest of the cursor's line only; 0: no limit
  stop_on_dedent = true,   -- end before a line indented less than the cursor's line
  temperature = 0,         -- greedy: the same context gives the same suggestion
  timeout_ms = 5000,
  warm_up = true,          -- on entering insert mode, have the daemon process the context
  request = {},            -- extra fields merged into every complete request
  keys = {
    accept = '<Tab>',      -- falls back to the key itself when no suggestion shows
    accept_line = '<C-l>', -- accept the first line of the suggestion only
    dismiss = '<C-]>',
  },
  reconnect_min_ms = 100,  -- backoff between connection attempts after the daemon went away
  reconnect_max_ms = 5000,
  hl_group = 'ColibriSuggestion', -- linked to Comment unless defined
}

function M.resolve(opts)
  local cfg = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  if not cfg.socket or cfg.socket == '' then
    cfg.socket = default_socket()
  end
  return cfg
end

return M

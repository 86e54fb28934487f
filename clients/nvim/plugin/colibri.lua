-- Commands of the Colibri client; completion starts with require('colibri').setup().
if vim.g.loaded_colibri then return end
vim.g.loaded_colibri = true

local function with_setup(fn)
  return function()
    local colibri = require('colibri')
    if not colibri.config() then colibri.setup({}) end
    fn(colibri)
  end
end

vim.api.nvim_create_user_command('ColibriStatus', with_setup(function(c) c.show_status() end),
  { desc = 'Colibri: connection, daemon health and request counts' })
vim.api.nvim_create_user_command('ColibriEnable', with_setup(function(c) c.enable() end), {})
vim.api.nvim_create_user_command('ColibriDisable', with_setup(function(c) c.disable() end), {})
vim.api.nvim_create_user_command('ColibriToggle', with_setup(function(c) c.toggle() end), {})

-- read.lua: the progress of one (consumer, scope), read-only. KEYS: see _lib.lua.
-- Returns reply('progress', '')
return reply('progress', '')

-- read.lua: the progress of one (consumer, scope), read-only. KEYS: see _lib.lua.
-- Returns progress_reply('progress', '')
return progress_reply('progress', '')

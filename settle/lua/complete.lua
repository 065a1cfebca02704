-- complete.lua: settle an attempt with action 'complete'. The rules, KEYS, ARGV and reply are in
-- _settle.lua, prepended (after _lib.lua) when the script is loaded.
return settle('complete')

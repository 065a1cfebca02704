-- fail.lua: settle an attempt with action 'fail'. The rules, KEYS, ARGV and reply are in
-- _settle.lua, prepended (after _lib.lua) when the script is loaded.
return settle('fail')

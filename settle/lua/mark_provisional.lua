-- mark_provisional.lua: settle an attempt with action 'mark_provisional'. The rules, KEYS, ARGV and reply are in
-- _settle.lua, prepended (after _lib.lua) when the script is loaded.
return settle('mark_provisional')

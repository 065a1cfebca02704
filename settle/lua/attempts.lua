-- attempts.lua: read an operation's attempt log, oldest first.
-- KEYS[1] attempt log stream
-- Returns {ok, '', now, '', entries}; each entry is {id, {field, value, ...}}.
return {'ok', '', now_ms(), '', redis.call('XRANGE', KEYS[1], '-', '+')}

-- attempts.lua: read an operation's attempt log, oldest first.
-- KEYS[1] attempt log list
-- Returns {ok, '', now, '', entries}; each entry is 'aid|gen|action|verdict|detail|at'.
return {'ok', '', now_ms(), '', redis.call('LRANGE', KEYS[1], 0, -1)}

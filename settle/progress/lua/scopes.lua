-- scopes.lua: the consumer's scope index, read-only.
-- KEYS[1] scopes HASH (scope id -> JSON scope)
-- Returns {'scopes', '', now_ms, the flat field/value list}.
return reply('scopes', '', now_ms(), redis.call('HGETALL', KEYS[1]))

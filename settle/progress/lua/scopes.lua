-- scopes.lua: the consumer's scope index, read-only.
-- KEYS[1] scopes HASH (scope id -> JSON scope)
-- Returns the flat field/value list.
return redis.call('HGETALL', KEYS[1])

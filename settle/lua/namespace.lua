-- namespace.lua: record a namespace's shard count on first use and report it after.
-- KEYS[1] namespace meta hash (never expires)
-- ARGV[1] shard count  ARGV[2] fingerprint version
-- Returns {ok | mismatch, stored shard count, now, '', {}}.
local now = now_ms()
redis.call('HSETNX', KEYS[1], 'shards', ARGV[1])
redis.call('HSETNX', KEYS[1], 'created', int(now))
redis.call('HSETNX', KEYS[1], 'fpv', ARGV[2])
local stored = redis.call('HGET', KEYS[1], 'shards')
if stored ~= ARGV[1] then return {'mismatch', stored, now, '', {}} end
return {'ok', stored, now, '', {}}

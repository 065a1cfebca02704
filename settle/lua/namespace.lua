-- namespace.lua: check a namespace's shard count against its metadata, and create the
-- metadata (first use, or after it was lost) only when asked to: the client asks after every
-- surviving shard state agreed with its count (claim.lua with claim flag '0'), so a client
-- refused by a shard never re-creates the metadata with its own count.
-- KEYS[1] namespace meta hash (never expires)
-- ARGV[1] shard count  ARGV[2] fingerprint version
-- ARGV[3] create: '1' writes missing metadata; '0' answers 'absent' and writes nothing
-- Returns {ok | mismatch | absent | corrupt_state, stored shard count (corrupt_state: the
-- key), now, the metadata's 'created' (ms; '' when it has none), {}}.
local now = now_ms()
local stored = redis.pcall('HGET', KEYS[1], 'shards')
if type(stored) == 'table' then return {'corrupt_state', KEYS[1], now, '', {}} end
if not stored then
  if ARGV[3] ~= '1' then return {'absent', '', now, '', {}} end
  redis.call('HSETNX', KEYS[1], 'shards', ARGV[1])
  redis.call('HSETNX', KEYS[1], 'created', int(now))
  redis.call('HSETNX', KEYS[1], 'fpv', ARGV[2])
  stored = ARGV[1]
end
if stored ~= ARGV[1] then return {'mismatch', stored, now, '', {}} end
return {'ok', stored, now, redis.call('HGET', KEYS[1], 'created') or '', {}}

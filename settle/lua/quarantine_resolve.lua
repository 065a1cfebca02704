-- quarantine_resolve.lua: mark a quarantine entry resolved with a note. The entry itself
-- is never changed or deleted, and the first resolution stands.
-- KEYS[1] quarantine stream  KEYS[2] resolutions hash (entry id -> resolution JSON)
-- KEYS[3] shard state (see _lib.lua)
-- ARGV[1] entry id  ARGV[2] note  ARGV[3] shard count  ARGV[4] claim flag
-- Returns {missing | resolved | already_resolved, '', now, '', {resolution JSON}}.
local refused = guard()
if refused then return refused end
local now = now_ms()
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return {'missing', '', now, '', {}}
end
local res = cjson.encode({note = ARGV[2], at = now})
if redis.call('HSETNX', KEYS[2], ARGV[1], res) == 0 then
  return {'already_resolved', '', now, '', {redis.call('HGET', KEYS[2], ARGV[1])}}
end
return {'resolved', '', now, '', {res}}

-- quarantine_resolve.lua: mark a quarantine entry resolved with a note. The entry itself
-- is never changed or deleted, and the first resolution stands.
-- KEYS[1] quarantine stream  KEYS[2] resolutions hash (entry id -> resolution JSON)
-- KEYS[3] shard state (see _lib.lua)
-- ARGV[1] entry id  ARGV[2] note  ARGV[3] shard count  ARGV[4] claim flag
-- Returns {missing | resolved | already_resolved, '', now, '', {resolution JSON}}.
-- An entry id XRANGE refuses is answered with an error reply before anything is written
-- (the claim waits for it: see guard in _lib.lua).
local refused, held = guard(true)
if refused then return refused end
local now = now_ms()
local found = redis.pcall('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if found.err then
  if string.sub(found.err, 1, 9) == 'WRONGTYPE' then return found end  -- not the id's fault
  return redis.error_reply(arg_refused('quarantine_resolve', 1, 'entry id',
    'a stream id: ' .. found.err))
end
if held then redis.call('HSET', KEYS[#KEYS], 'shards', ARGV[#ARGV - 1]) end
if #found == 0 then
  return {'missing', '', now, '', {}}
end
local res = cjson.encode({note = ARGV[2], at = now})
if redis.call('HSETNX', KEYS[2], ARGV[1], res) == 0 then
  return {'already_resolved', '', now, '', {redis.call('HGET', KEYS[2], ARGV[1])}}
end
return {'resolved', '', now, '', {res}}

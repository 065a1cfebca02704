-- _head_gen.lua: the generations reserve.lua and reserve_head.lua issue (see _head.lua).

-- The next fencing generation of a shard: a hybrid logical clock, max(last + 1, server time
-- in microseconds). Strictly increasing while the state lives; after the state was lost
-- (restart without persistence, FLUSHALL, eviction, a failover that lost the latest writes)
-- it restarts from the server clock, above every generation issued before, as long as the
-- server clock did not step back and generations were issued no faster than one per
-- microsecond (docs/concepts.md, "Generations"). Below 2^53 until the year 2255. (Not in
-- _lib.lua, as reserve.lua and its head, the only scripts that issue generations, both call
-- it.)
local function next_generation(key, now_us)
  local stored_gen = redis.call('HGET', key, 'gen')
  local last = decimal(stored_gen) and tonumber(stored_gen) or 0
  local gen = math.max(last + 1, now_us)
  redis.call('HSET', key, 'gen', int(gen))
  return int(gen)
end

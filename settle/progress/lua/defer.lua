-- defer.lua: set a delivery aside without applying it. The deferred record is durable
-- (found again with the deferred list) and a settle intent of kind defer lets the provider
-- stop redelivering it; the delivery stays unapplied, so the floor never passes it.
-- KEYS: see _lib.lua.
-- ARGV[1] scope id  ARGV[2] scope JSON  ARGV[3] delivery id  ARGV[4] emission id
-- ARGV[5] reason
-- Returns progress_reply(code, detail): deferred | covered (detail floor | applied | dead_lettered)
local now = now_ms()
local broken = stored_corrupt()
if broken then return progress_reply('corrupt', broken) end
local covered = coverage(ARGV[3], ARGV[4])
if covered then return progress_reply('covered', covered) end
redis.call('HSET', KEYS[6], ARGV[3],
  cjson.encode({emission = ARGV[4], reason = ARGV[5], at = now}))
add_hold(ARGV[3])
intent(ARGV[3], 'defer', ARGV[4], now, ARGV[5])
touch(ARGV[1], ARGV[2], now)
return progress_reply('deferred', '')

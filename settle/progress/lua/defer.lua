-- defer.lua: set a delivery aside without applying it. The deferred record is durable
-- (found again with the deferred list) and a settle intent of kind defer lets the provider
-- stop redelivering it; the delivery stays unapplied, so the floor never passes it.
-- KEYS: see _lib.lua.
-- ARGV[1] scope id  ARGV[2] scope JSON  ARGV[3] claim flag ('1' | '': see _lib.lua)
-- ARGV[4] delivery id  ARGV[5] emission id  ARGV[6] reason
-- Returns progress_reply(code, detail): deferred | covered (detail floor | applied | dead_lettered)
-- Or progress_reply('unclaimed', ''): no state, no claim flag (_lib.lua); nothing written.
local now = now_ms()
local broken = stored_corrupt()
if broken then return progress_reply('corrupt', broken) end
if unclaimed(ARGV[3], now) then return progress_reply('unclaimed', '') end
local covered = coverage(ARGV[4], ARGV[5])
if covered then return progress_reply('covered', covered) end
redis.call('HSET', KEYS[6], ARGV[4],
  cjson.encode({emission = ARGV[5], reason = ARGV[6], at = now}))
add_hold(ARGV[4])
intent(ARGV[4], 'defer', ARGV[5], now, ARGV[6])
touch(ARGV[1], ARGV[2], now)
return progress_reply('deferred', '')

-- begin.lua: consult progress before applying a delivery (SPEC 10: redelivery consults
-- progress first). KEYS: see _lib.lua.
-- ARGV[1] scope id  ARGV[2] scope JSON  ARGV[3] claim flag ('1' | '': see _lib.lua)
-- ARGV[4] delivery id  ARGV[5] emission id  ARGV[6] attempt id
-- Returns progress_reply(code, detail):
--   covered  (detail floor | applied | dead_lettered): this delivery is already settled
--            in progress; settle it again, never apply it again
--   applied  (detail: the delivery id it was applied as): the emission was applied under
--            another delivery (a duplicate publication, or a stream that lost its data)
--   fresh    (detail: attempts so far): apply the effect; the emission is marked applying
-- Or progress_reply('unclaimed', ''): no state, no claim flag (_lib.lua); nothing written.
local now = now_ms()
local broken = stored_corrupt()
if broken then return progress_reply('corrupt', broken) end
if unclaimed(ARGV[3], now) then return progress_reply('unclaimed', '') end
local covered = coverage(ARGV[4], ARGV[5])
if covered then return progress_reply('covered', covered) end
local state = redis.call('HGET', KEYS[10], 'state')
if state == 'applied' then
  return progress_reply('applied', redis.call('HGET', KEYS[10], 'delivery'))
end
redis.call('HSET', KEYS[10], 'state', 'applying', 'scope', ARGV[1], 'delivery', ARGV[4],
  'attempt', ARGV[6], 'at', int(now))
local attempts = redis.call('HINCRBY', KEYS[10], 'attempts', 1)
redis.call('HSETNX', KEYS[9], ARGV[1], ARGV[2])
return progress_reply('fresh', int(attempts))

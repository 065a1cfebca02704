-- begin.lua: consult progress before applying a delivery (SPEC 10: redelivery consults
-- progress first). KEYS: see _lib.lua.
-- ARGV[1] scope id  ARGV[2] scope JSON  ARGV[3] delivery id  ARGV[4] emission id
-- ARGV[5] attempt id
-- Returns progress_reply(code, detail):
--   covered  (detail floor | applied | dead_lettered): this delivery is already settled
--            in progress; settle it again, never apply it again
--   applied  (detail: the delivery id it was applied as): the emission was applied under
--            another delivery (a duplicate publication, or a stream that lost its data)
--   fresh    (detail: attempts so far): apply the effect; the emission is marked applying
local now = now_ms()
local broken = stored_corrupt()
if broken then return progress_reply('corrupt', broken) end
local covered = coverage(ARGV[3], ARGV[4])
if covered then return progress_reply('covered', covered) end
local state = redis.call('HGET', KEYS[10], 'state')
if state == 'applied' then
  return progress_reply('applied', redis.call('HGET', KEYS[10], 'delivery'))
end
redis.call('HSET', KEYS[10], 'state', 'applying', 'scope', ARGV[1], 'delivery', ARGV[3],
  'attempt', ARGV[5], 'at', int(now))
local attempts = redis.call('HINCRBY', KEYS[10], 'attempts', 1)
redis.call('HSETNX', KEYS[9], ARGV[1], ARGV[2])
return progress_reply('fresh', int(attempts))

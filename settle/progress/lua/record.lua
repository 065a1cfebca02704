-- record.lua: durably record that a delivery's effect is applied, and open its settle
-- intent, in one step (after the effect, before any settlement). KEYS: see _lib.lua.
-- ARGV[1] scope id  ARGV[2] scope JSON  ARGV[3] claim flag ('1' | '': see _lib.lua)
-- ARGV[4] delivery id  ARGV[5] emission id  ARGV[6] attempt id
-- Returns progress_reply(code, detail):
--   recorded (detail applied | duplicate): the delivery is now applied above the floor
--            (duplicate: its emission had already been applied; no second effect ran)
--   covered  (detail floor | applied | dead_lettered): progress already covered it
-- Or progress_reply('unclaimed', ''): no state, no claim flag (_lib.lua); nothing written.
local now = now_ms()
local broken = stored_corrupt()
if broken then return progress_reply('corrupt', broken) end
if unclaimed(ARGV[3], now) then return progress_reply('unclaimed', '') end
local covered = coverage(ARGV[4], ARGV[5])
if covered then
  if covered ~= 'dead_lettered' then intent(ARGV[4], 'ack', ARGV[5], now) end
  if redis.call('HGET', KEYS[10], 'state') ~= 'applied' then
    -- Progress covered the delivery while this attempt's effect ran (another worker
    -- dead-lettered it, possibly moving the floor past it): the effect happened all the
    -- same, so the emission is applied and a later publication of it is not run again.
    redis.call('HSET', KEYS[10], 'state', 'applied', 'scope', ARGV[1], 'delivery', ARGV[4],
      'attempt', ARGV[6], 'at', int(now))
  end
  return progress_reply('covered', covered)
end
local detail = 'applied'
if redis.call('HGET', KEYS[10], 'state') == 'applied' then
  detail = 'duplicate'
else
  redis.call('HSET', KEYS[10], 'state', 'applied', 'scope', ARGV[1], 'delivery', ARGV[4],
    'attempt', ARGV[6], 'at', int(now))
end
-- At or below the floor only a deferral the floor passed before it was held (coverage()).
if id_lt(floor_of(), ARGV[4]) then redis.call('HSET', KEYS[2], ARGV[4], ARGV[5]) end
unhold(ARGV[4])
intent(ARGV[4], 'ack', ARGV[5], now)
touch(ARGV[1], ARGV[2], now)
return progress_reply('recorded', detail)

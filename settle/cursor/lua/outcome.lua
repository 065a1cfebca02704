-- outcome.lua: record the durable receipt of one event outcome, attributed to a witness.
-- KEYS[1..5] see _lib.lua
-- ARGV[1] attempt id (the witness)  ARGV[2] event id  ARGV[3] position  ARGV[4] digest
-- ARGV[5] outcome
-- Returns {code, detail, now, checkpoint, {existing receipt or ''}}:
--   recorded | duplicate (same id, position and digest already recorded: nothing written)
--   conflict (another digest or position for this id, or another id at this position)
--   no_witness (detail 'gone': the witness does not exist any more, pruned after the
--               checkpoint moved keep_generations past it; '': it does not list this event)
-- detail is 'live' while the checkpoint still holds the witness's generation and the
-- witness is pending, else 'superseded'.
local now = now_ms()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
local aid = ARGV[1]
local wgen = wget(KEYS[2], aid, 'gen')
if not wgen then return {'no_witness', 'gone', now, flat, {''}} end
local listed = false
for _, ev in ipairs(cjson.decode(wget(KEYS[2], aid, 'events'))) do
  if ev[1] == ARGV[2] and ev[2] == tonumber(ARGV[3]) and ev[3] == ARGV[4] then
    listed = true
    break
  end
end
if not listed then return {'no_witness', '', now, flat, {''}} end
local live = 'superseded'
if c and c.gen == wgen and wget(KEYS[2], aid, 'disp') == 'pending' then live = 'live' end
local existing = redis.call('HGET', KEYS[4], ARGV[2])
if existing then
  local r = parse_receipt(existing)
  if r.pos == tonumber(ARGV[3]) and r.digest == ARGV[4] then
    return {'duplicate', live, now, flat, {existing}}
  end
  return {'conflict', live, now, flat, {existing}}
end
for _, other in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], ARGV[3], ARGV[3])) do
  if other ~= ARGV[2] then
    return {'conflict', live, now, flat, {other .. ' ' .. redis.call('HGET', KEYS[4], other)}}
  end
end
local value = ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. wgen .. ' ' .. aid .. ' ' .. ARGV[5] .. ' '
  .. int(now)
redis.call('HSET', KEYS[4], ARGV[2], value)
redis.call('ZADD', KEYS[5], ARGV[3], ARGV[2])
return {'recorded', live, now, flat, {value}}

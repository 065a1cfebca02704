-- promote.lua: the compare-and-swap that advances a checkpoint to a witness's successor.
-- KEYS[1..5] see _lib.lua
-- ARGV[1] generation G  ARGV[2] input cursor digest  ARGV[3] attempt id (the witness)
-- ARGV[4] generations of witnesses to keep  ARGV[5] receipt horizon (positions)
-- Only if the checkpoint still holds (cursor, G), the witness is pending for G and every
-- event it lists has a receipt with the same id, position and digest: the checkpoint takes
-- the witness's successor verbatim, generation G+1 and the witness's next boundary; the
-- witness becomes promoted and every other pending witness of G abandoned. Then bounded
-- pruning of old witnesses and of receipts below the horizon (the checkpoint's 'pruned'
-- keeps the highest position whose receipt went). Every event another pending
-- witness of G lists (an empty 'held' one lists none) and that has no matching receipt must
-- be listed by this witness or lie inside its coverage marker: a successor is opaque, so
-- promoting a response that lacks it could skip it for good.
-- Returns {code, detail, now, checkpoint, {}}:
--   promoted | already (this witness was promoted before: a repeated call)
--   stale (the checkpoint moved on; nothing written) | abandoned (the witness lost)
--   incomplete (detail: first event id without a matching receipt; nothing written)
--   uncovered (detail: an unsettled event of another pending witness this one lacks;
--              nothing written: that other response must be completed instead)
--   no_witness | missing | corrupt
local now = now_ms()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
if not c then return {'missing', '', now, {}, {}} end
local aid = ARGV[3]
local wgen = wget(KEYS[2], aid, 'gen')
local disp = wget(KEYS[2], aid, 'disp')
if wgen == ARGV[1] and disp == 'promoted' then return {'already', '', now, flat, {}} end
-- The checkpoint moved on (whatever became of this witness: pruned once it was
-- keep_generations behind): the race this worker lost.
if c.gen ~= ARGV[1] or c.cdig ~= ARGV[2] then return {'stale', '', now, flat, {}} end
-- The checkpoint still holds this generation, so the witness must be there, of it.
if not wgen or wgen ~= ARGV[1] then return {'no_witness', '', now, flat, {}} end
if disp ~= 'pending' then return {'abandoned', disp, now, flat, {}} end
for _, ev in ipairs(cjson.decode(wget(KEYS[2], aid, 'events'))) do
  local v = redis.call('HGET', KEYS[4], ev[1])
  if not v then return {'incomplete', ev[1], now, flat, {}} end
  local r = parse_receipt(v)
  if r.pos ~= ev[2] or r.digest ~= ev[3] then return {'incomplete', ev[1], now, flat, {}} end
end
local mine = {}
for _, ev in ipairs(cjson.decode(wget(KEYS[2], aid, 'events'))) do
  mine[ev[1]] = ev
end
local cov = wget(KEYS[2], aid, 'cov')
local cov_after, cov_through = nil, nil
if cov and cov ~= '' then
  local pair = cjson.decode(cov)
  -- As the classification (_classify.py, _Rules.coverage): a marker proves the absence of
  -- events only when it reaches back to the applied boundary; one that starts above it
  -- proves nothing, and another witness's event inside it must be completed, not skipped.
  if pair[1] <= tonumber(c.bound) then cov_after, cov_through = pair[1], pair[2] end
end
for _, other in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], c.gen, c.gen)) do
  if other ~= aid and wget(KEYS[2], other, 'disp') == 'pending' then
    for _, ev in ipairs(cjson.decode(wget(KEYS[2], other, 'events'))) do
      local v = redis.call('HGET', KEYS[4], ev[1])
      local settled = false
      if v then
        local r = parse_receipt(v)
        settled = r.pos == ev[2] and r.digest == ev[3]
      end
      local m = mine[ev[1]]
      local covered = (m ~= nil and m[2] == ev[2] and m[3] == ev[3])
        or (cov_after ~= nil and cov_after < ev[2] and ev[2] <= cov_through)
      if not settled and not covered then return {'uncovered', ev[1], now, flat, {}} end
    end
  end
end
local gen = tonumber(c.gen)
local nbound = wget(KEYS[2], aid, 'nbound')
redis.call('HSET', KEYS[1], 'cursor', wget(KEYS[2], aid, 'succ'), 'cdig',
  wget(KEYS[2], aid, 'sdig'), 'gen', int(gen + 1), 'bound', nbound, 'updated', int(now),
  'waid', aid)
wset(KEYS[2], aid, 'disp', 'promoted')
wset(KEYS[2], aid, 'updated', int(now))
for _, other in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], c.gen, c.gen)) do
  if other ~= aid and wget(KEYS[2], other, 'disp') == 'pending' then
    wset(KEYS[2], other, 'disp', 'abandoned')
    wset(KEYS[2], other, 'reason', 'superseded')
    wset(KEYS[2], other, 'updated', int(now))
  end
end
local keep = tonumber(ARGV[4])
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. int(gen + 1 - keep),
    'LIMIT', 0, 64)) do
  witness_delete(KEYS[2], KEYS[3], old)
end
local horizon = tonumber(ARGV[5])
if horizon > 0 then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf',
      '(' .. int(tonumber(nbound) - horizon), 'WITHSCORES', 'LIMIT', 0, 256)
  for i = 1, #gone, 2 do
    redis.call('HDEL', KEYS[4], gone[i])
    redis.call('ZREM', KEYS[5], gone[i])
  end
  -- 'pruned': the highest position whose receipt is gone. A reset to a boundary below it
  -- would hand those events over again as new (reset.lua refuses it unless told).
  if #gone > 0 then
    local top = tonumber(gone[#gone])
    local was = tonumber(redis.call('HGET', KEYS[1], 'pruned') or '')
    if not was or top > was then redis.call('HSET', KEYS[1], 'pruned', int(top)) end
  end
end
local _, promoted = load_ckpt(KEYS[1])
return {'promoted', '', now, promoted, {}}

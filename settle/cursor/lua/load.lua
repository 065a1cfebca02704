-- load.lua: what classifying one response needs, read in one step.
-- KEYS[1..5] see _lib.lua
-- ARGV[1] low position (exclusive)  ARGV[2] high position (inclusive): receipts in that
--         range are returned ('' '' for none)
-- ARGV[3] n, then n event ids, then their n positions: the receipts of those ids and of
--         every event applied at those positions are returned
-- The receipts of every event a witness of the current generation lists are returned too
-- (a retry must cover each witnessed event that is not settled, wherever it sits).
-- Returns {ok | missing | corrupt, '', now, checkpoint,
--          {witnesses of the current generation (each a flat list), receipts (flat id/value),
--           input cursor digests of the kept witnesses of earlier generations since the
--           last reset (the cursors passed)}}.
local now = now_ms()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
if not c then return {'missing', '', now, {}, {}} end
local wanted = {}
local order = {}
local function want(id)
  if not wanted[id] then wanted[id] = true; order[#order + 1] = id end
end
local witnesses = {}
for _, aid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], c.gen, c.gen)) do
  local w = witness_flat(KEYS[2], aid)
  if #w > 0 then
    witnesses[#witnesses + 1] = w
    for _, ev in ipairs(cjson.decode(wget(KEYS[2], aid, 'events'))) do want(ev[1]) end
  end
end
-- The cursors of the newest 1024 witnesses of earlier generations (newest first: with a
-- large keep_generations, oldest first would leave out the recent ones, the likeliest a
-- provider loops back to).
local passed, seen = {}, {}
for _, aid in ipairs(redis.call('ZREVRANGEBYSCORE', KEYS[3], '(' .. c.gen, c.rgen or '-inf',
    'LIMIT', 0, 1024)) do
  local d = wget(KEYS[2], aid, 'cdig')
  if d and not seen[d] then seen[d] = true; passed[#passed + 1] = d end
end
local n = tonumber(ARGV[3] or '0') or 0
for i = 1, n do
  want(ARGV[3 + i])
  local p = ARGV[3 + n + i]
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], p, p)) do want(id) end
end
if ARGV[1] ~= '' then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. ARGV[1], ARGV[2],
      'LIMIT', 0, 10000)) do
    want(id)
  end
end
local receipts = {}
for _, id in ipairs(order) do
  local v = redis.call('HGET', KEYS[4], id)
  if v then receipts[#receipts + 1] = id; receipts[#receipts + 1] = v end
end
return {'ok', '', now, flat, {witnesses, receipts, passed}}

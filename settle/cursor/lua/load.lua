-- load.lua: what classifying one response needs, read in one step.
-- KEYS[1..5] see _lib.lua
-- ARGV[1] low position (exclusive)  ARGV[2] high position (inclusive): receipts in that
--         range are returned ('' '' for none)
-- ARGV[3] n, then n event ids, then their n positions: the receipts of those ids and of
--         every event applied at those positions are returned
-- Returns {ok | missing | corrupt, '', now, checkpoint,
--          {witnesses of the current generation (each a flat list), receipts (flat id/value)}}.
local now = now_ms()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
if not c then return {'missing', '', now, {}, {}} end
local witnesses = {}
for _, aid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], c.gen, c.gen)) do
  local w = witness_flat(KEYS[2], aid)
  if #w > 0 then witnesses[#witnesses + 1] = w end
end
local wanted = {}
local order = {}
local function want(id)
  if not wanted[id] then wanted[id] = true; order[#order + 1] = id end
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
return {'ok', '', now, flat, {witnesses, receipts}}

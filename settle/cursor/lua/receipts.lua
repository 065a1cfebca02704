-- receipts.lua: the durable receipts of a stream's events, by position (for inspection;
-- writes nothing).
-- KEYS[1..5] see _lib.lua
-- ARGV[1] low position (exclusive, '' for none)  ARGV[2] how many
-- Returns {ok | missing | corrupt, '', now, checkpoint, {flat event id / receipt value list}}.
local now = now_ms()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
if not c then return {'missing', '', now, {}, {}} end
local low = '-inf'
if ARGV[1] ~= '' then low = '(' .. ARGV[1] end
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], low, '+inf', 'LIMIT', 0,
    tonumber(ARGV[2]))) do
  local v = redis.call('HGET', KEYS[4], id)
  if v then out[#out + 1] = id; out[#out + 1] = v end
end
return {'ok', '', now, flat, out}

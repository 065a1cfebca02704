-- witnesses.lua: the checkpoint and its newest witnesses (for inspection; writes nothing).
-- KEYS[1..5] see _lib.lua
-- ARGV[1] how many witnesses, newest generation first
-- Returns {ok | missing | corrupt, '', now, checkpoint, {witness flat lists}}.
local now = now_ms()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
if not c then return {'missing', '', now, {}, {}} end
local out = {}
for _, aid in ipairs(redis.call('ZREVRANGEBYSCORE', KEYS[3], '+inf', '-inf', 'LIMIT', 0,
    tonumber(ARGV[1]))) do
  local w = witness_flat(KEYS[2], aid)
  if #w > 0 then out[#out + 1] = w end
end
return {'ok', '', now, flat, out}

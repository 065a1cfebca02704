-- init.lua: create a stream's checkpoint unless it exists. Its first generation comes from
-- the server clock (milliseconds x 1000), so that a checkpoint created again after Redis
-- lost it (a restart without persistence, FLUSHALL) never issues a generation it issued
-- before (SPEC 1): every later one is one more (a promotion, a reset), and a stream sees
-- far fewer than 1,000 of those a millisecond. Assumes a server clock that does not step
-- back across the loss, as the core's generations do.
-- KEYS[1..5] see _lib.lua
-- ARGV[1] stream  ARGV[2] cursor (opaque bytes)  ARGV[3] cursor digest  ARGV[4] boundary
-- Returns {created | exists | corrupt, '', now, checkpoint, {}}.
local now = now_ms()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
if c then return {'exists', '', now, flat, {}} end
redis.call('HSET', KEYS[1], 'stream', ARGV[1], 'cursor', ARGV[2], 'cdig', ARGV[3], 'gen', int(now * 1000),
  'bound', ARGV[4], 'created', int(now), 'updated', int(now), 'waid', '')
local _, created = load_ckpt(KEYS[1])
return {'created', '', now, created, {}}

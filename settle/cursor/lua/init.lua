-- init.lua: create a stream's checkpoint at generation 1 unless it exists.
-- KEYS[1..5] see _lib.lua
-- ARGV[1] stream  ARGV[2] cursor (opaque bytes)  ARGV[3] cursor digest  ARGV[4] boundary
-- Returns {created | exists | corrupt, '', now, checkpoint, {}}.
local now = now_ms()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
if c then return {'exists', '', now, flat, {}} end
redis.call('HSET', KEYS[1], 'stream', ARGV[1], 'cursor', ARGV[2], 'cdig', ARGV[3], 'gen', '1',
  'bound', ARGV[4], 'created', int(now), 'updated', int(now), 'waid', '')
local _, created = load_ckpt(KEYS[1])
return {'created', '', now, created, {}}

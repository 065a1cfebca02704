-- init.lua: create a stream's checkpoint unless it exists. Its first generation is the
-- server clock in microseconds, so that a checkpoint created again after Redis lost it (a
-- restart without persistence, FLUSHALL, a DEL and a start() right after it) never issues a
-- generation it issued before (SPEC 1): every later one is one more (a promotion, a reset),
-- each a script call of its own, and Redis runs far fewer than one a microsecond, so the
-- clock has passed the last one issued. (Milliseconds x 1000 did not: a checkpoint lost and made
-- again within the same millisecond started where the lost one had, below the ones its
-- resets had issued.) Assumes a server clock that does not step back across the loss, as
-- the core's generations do.
-- KEYS[1..5] see _lib.lua
-- ARGV[1] stream  ARGV[2] cursor (opaque bytes)  ARGV[3] cursor digest  ARGV[4] boundary
-- Returns {created | exists | corrupt, '', now, checkpoint, {}}.
local now, now_us = clock()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
if c then return {'exists', '', now, flat, {}} end
redis.call('HSET', KEYS[1], 'stream', ARGV[1], 'cursor', ARGV[2], 'cdig', ARGV[3], 'gen', int(now_us),
  'bound', ARGV[4], 'created', int(now), 'updated', int(now), 'waid', '')
local _, created = load_ckpt(KEYS[1])
return {'created', '', now, created, {}}

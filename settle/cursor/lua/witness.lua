-- witness.lua: record the response witness of one fetch, before any event outcome.
-- KEYS[1..5] see _lib.lua
-- ARGV[1] generation  ARGV[2] input cursor digest  ARGV[3] attempt id  ARGV[4] input cursor
-- ARGV[5] events JSON [[id, pos, digest], ...]  ARGV[6] successor (verbatim bytes)
-- ARGV[7] successor digest  ARGV[8] snapshot  ARGV[9] coverage JSON or ''
-- ARGV[10] classification  ARGV[11] next boundary  ARGV[12] disposition (pending|abandoned)
-- ARGV[13] reason  ARGV[14] how many witnesses of this generation the classification saw
-- Returns {recorded | exists | stale | changed | missing | corrupt, '', now, checkpoint, {}}:
-- stale when the checkpoint no longer holds (cursor, generation); changed when another
-- response to (cursor, generation) was witnessed after this one was classified, so the
-- classification must be made again against it (nothing written in either case).
local now = now_ms()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
if not c then return {'missing', '', now, {}, {}} end
if c.gen ~= ARGV[1] or c.cdig ~= ARGV[2] then return {'stale', '', now, flat, {}} end
local aid = ARGV[3]
if wget(KEYS[2], aid, 'gen') then return {'exists', '', now, flat, {}} end
local seen = 0
for _, other in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], c.gen, c.gen)) do
  if wget(KEYS[2], other, 'gen') then seen = seen + 1 end
end
if seen ~= tonumber(ARGV[14]) then return {'changed', '', now, flat, {}} end
local values = {ARGV[1], ARGV[4], ARGV[2], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9],
  ARGV[10], ARGV[11], ARGV[12], ARGV[13], int(now), int(now)}
for i, a in ipairs(WITNESS_ATTRS) do wset(KEYS[2], aid, a, values[i]) end
redis.call('ZADD', KEYS[3], ARGV[1], aid)
return {'recorded', '', now, flat, {}}

-- stream_settle.lua (runs on the STREAM's server): a fenced settlement. It checks, in the
-- same atomic step as the XACK, that the delivery is still pending for this group, owned by
-- this worker and (when given) at the delivery count the worker was handed; otherwise it
-- settles nothing. A worker whose delivery was reclaimed can never acknowledge it.
-- An acknowledgement also marks, in the same step, that this incarnation had a delivery of
-- the group acknowledged for this progress consumer (the acknowledged mark, field ARGV[10],
-- value the incarnation; written only when it holds another value): evidence, kept next to
-- the stream, that the consumer's progress for this scope existed (nothing is acknowledged
-- before progress records it), checked by stream_evidence.lua when that progress is found
-- missing.
-- KEYS[1] stream  KEYS[2] dead-letter stream  KEYS[3] incarnation marker
-- KEYS[4] acknowledged mark (HASH: progress consumer and group -> incarnation)
-- ARGV[1] group  ARGV[2] worker (consumer name)  ARGV[3] delivery id
-- ARGV[4] expected delivery count ('' any)  ARGV[5] mode: ack | dead_letter | release
-- ARGV[6] emission id  ARGV[7] reason  ARGV[8] idle ms to set on release
-- ARGV[9] the incarnation the worker's delivery belongs to
-- ARGV[10] the mark's field: the progress consumer and the group (JSON [namespace, consumer,
--          group])
-- Returns {outcome, owner, now_ms, delivery count, acknowledged}: outcome is acked | released |
--   not_pending (already settled, by this worker or another) | not_owner | reclaimed |
--   no_group (the group, the stream or the incarnation the delivery came from is gone)
if redis.call('GET', KEYS[3]) ~= ARGV[9] then return reply('no_group', '', now_ms(), 0, 0) end
local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if not ok then return reply('no_group', '', now_ms(), 0, 0) end
if #pending == 0 then return reply('not_pending', '', now_ms(), 0, 0) end
local owner = pending[1][2]
local count = tonumber(pending[1][4])
if owner ~= ARGV[2] then return reply('not_owner', owner, now_ms(), count, 0) end
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= count then return reply('reclaimed', owner, now_ms(), count, 0) end
if ARGV[5] == 'release' then
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[8], 'JUSTID')
  return reply('released', owner, now_ms(), count, 0)
end
if ARGV[5] == 'dead_letter' then
  redis.call('XADD', KEYS[2], '*', 'delivery', ARGV[3], 'group', ARGV[1],
    'emission', ARGV[6], 'reason', ARGV[7], 'deliveries', count)
end
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
if acked > 0 and redis.call('HGET', KEYS[4], ARGV[10]) ~= ARGV[9] then
  redis.call('HSET', KEYS[4], ARGV[10], ARGV[9])
end
return reply('acked', owner, now_ms(), count, acked)

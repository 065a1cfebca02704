-- stream_evidence.lua (runs on the STREAM's server, read-only): whether this incarnation of
-- the stream had a delivery of the group acknowledged for this progress consumer (the mark
-- stream_settle.lua writes with each acknowledgement). Asked when the consumer's progress for
-- the scope is found missing: acknowledged means that progress existed and was lost (a
-- restart of the progress server without persistence, FLUSHALL, a DEL); unused means the
-- scope is new and may be created.
-- KEYS[1] incarnation marker  KEYS[2] acknowledged mark (HASH, see stream_settle.lua)
-- ARGV[1] the mark's field (JSON [namespace, consumer, group])  ARGV[2] the scope's incarnation
-- Returns {code, '', now_ms}: code acknowledged | unused | no_group (the marker holds another
--   incarnation or none: the stream's server lost the stream, or the marker was deleted)
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return reply('no_group', '', now_ms()) end
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  return reply('acknowledged', '', now_ms())
end
return reply('unused', '', now_ms())

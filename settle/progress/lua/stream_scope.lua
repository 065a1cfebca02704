-- stream_scope.lua (runs on the STREAM's server): make sure the consumer group exists and
-- return the stream's incarnation. The incarnation marker lives next to the stream (same
-- hash tag, same durability): a server that lost the stream lost the marker too, so the
-- positions of a new stream are never compared with the old one's progress.
-- KEYS[1] stream  KEYS[2] incarnation marker
-- ARGV[1] group  ARGV[2] incarnation to use when there is none
-- Returns {'scope', incarnation, now_ms, created} (created = 1 when the group was created now)
local inc = redis.call('GET', KEYS[2])
if not inc then
  inc = ARGV[2]
  redis.call('SET', KEYS[2], inc)
end
local ok = pcall(redis.call, 'XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
local created = 0
if ok then created = 1 end
return reply('scope', inc, now_ms(), created)

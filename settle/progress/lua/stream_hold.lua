-- stream_hold.lua (runs on the STREAM's server): make the deliveries a worker listed as its
-- own (XPENDING for its name) fresh for it: XCLAIM JUSTID, idle 0, delivery count kept. Each
-- only while it is still as listed when the request arrives: pending to this worker, idle
-- at least the least idle time given (the listed idle plus what elapsed since on the
-- worker's clock). The check and the claim are one step on the server: a request held up on
-- the way, however long, never takes back a delivery another worker's XAUTOCLAIM took
-- meanwhile (XCLAIM's own min-idle compares only the idle time, which that take started
-- again); one the worker's own earlier try made fresh (its reply lost) is claimed again only
-- when idle that long.
-- KEYS[1] stream
-- ARGV[1] group  ARGV[2] worker (consumer name)
-- ARGV[3..] pairs: delivery id, least idle ms
-- Returns {'held', '', now_ms, held}: held has one array per pair, in order, as XCLAIM JUSTID
--   answers: {id} made fresh, {} left as it is;
--   or {'no_group', '', now_ms, {}}: the stream or the group is gone (nothing claimed).
local held = {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if not ok then return reply('no_group', '', now_ms(), {}) end
  local row = pending[1]
  if row and row[2] == ARGV[2] and row[3] >= tonumber(ARGV[i + 1]) then
    held[#held + 1] = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'JUSTID')
  else
    held[#held + 1] = {}
  end
end
return reply('held', '', now_ms(), held)

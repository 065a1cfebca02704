-- dead_letter.lua: quarantine a delivery (poison, malformed): durable evidence and a settle
-- intent of kind dead_letter, written BEFORE the provider is told. A dead-lettered delivery
-- is resolved for the floor but never counted as applied. KEYS: see _lib.lua.
-- ARGV[1] scope id  ARGV[2] scope JSON  ARGV[3] delivery id  ARGV[4] emission id ('' unknown)
-- ARGV[5] reason    ARGV[6] delivery count
-- Returns progress_reply(code, detail):
--   dead_lettered (detail: the dead-letter entry id, '' when it was already dead-lettered)
--   covered       (detail floor | applied): progress says it was applied; not dead-lettered
local now = now_ms()
local broken = stored_corrupt()
if broken then return progress_reply('corrupt', broken) end
-- An unknown emission ('': malformed, or deleted) is compared with nothing.
local emission = ARGV[4]
if emission == '' then emission = nil end
local covered = coverage(ARGV[3], emission)
if covered == 'dead_lettered' then return progress_reply('dead_lettered', '') end
if covered then return progress_reply('covered', covered) end
local id = redis.call('XADD', KEYS[7], '*', 'scope', ARGV[1], 'delivery', ARGV[3],
  'emission', ARGV[4], 'reason', ARGV[5], 'deliveries', ARGV[6], 'at', int(now))
-- At or below the floor only a deferral the floor passed before it was held (coverage()).
if id_lt(floor_of(), ARGV[3]) then redis.call('HSET', KEYS[3], ARGV[3], ARGV[4]) end
unhold(ARGV[3])
intent(ARGV[3], 'dead_letter', ARGV[4], now, ARGV[5])
touch(ARGV[1], ARGV[2], now)
return progress_reply('dead_lettered', id)

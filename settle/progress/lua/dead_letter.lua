-- dead_letter.lua: quarantine a delivery (poison, malformed): durable evidence and a settle
-- intent of kind dead_letter, written BEFORE the provider is told. A dead-lettered delivery
-- is resolved for the floor but never counted as applied. KEYS: see _lib.lua.
-- ARGV[1] scope id  ARGV[2] scope JSON  ARGV[3] claim flag ('1' | '': see _lib.lua)
-- ARGV[4] delivery id  ARGV[5] emission id ('' unknown)  ARGV[6] reason
-- ARGV[7] delivery count
-- Returns progress_reply(code, detail):
--   dead_lettered (detail: the dead-letter entry id, '' when it was already dead-lettered)
--   covered       (detail floor | applied): progress says it was applied; not dead-lettered
-- Or progress_reply('unclaimed', ''): no state, no claim flag (_lib.lua); nothing written.
local now = now_ms()
local broken = stored_corrupt()
if broken then return progress_reply('corrupt', broken) end
if unclaimed(ARGV[3], now) then return progress_reply('unclaimed', '') end
-- An unknown emission ('': malformed, or deleted) is compared with nothing.
local emission = ARGV[5]
if emission == '' then emission = nil end
local covered = coverage(ARGV[4], emission)
if covered == 'dead_lettered' then return progress_reply('dead_lettered', '') end
if covered then return progress_reply('covered', covered) end
local id = redis.call('XADD', KEYS[7], '*', 'scope', ARGV[1], 'delivery', ARGV[4],
  'emission', ARGV[5], 'reason', ARGV[6], 'deliveries', ARGV[7], 'at', int(now))
-- At or below the floor only a deferral the floor passed before it was held (coverage()).
if id_lt(floor_of(), ARGV[4]) then redis.call('HSET', KEYS[3], ARGV[4], ARGV[5]) end
unhold(ARGV[4])
intent(ARGV[4], 'dead_letter', ARGV[5], now, ARGV[6])
touch(ARGV[1], ARGV[2], now)
return progress_reply('dead_lettered', id)

-- observe.lua: store the provider's floor as last observed and advance the cumulative
-- floor along a provider listing (see advance() in _lib.lua). KEYS: see _lib.lua.
-- ARGV[1] scope id  ARGV[2] scope JSON  ARGV[3] claim flag ('1' | '': see _lib.lua)
-- ARGV[4] listing starts after this id ('0-0': start)
-- ARGV[5] provider last-delivered id ('' unknown)  ARGV[6] oldest pending id ('' none)
-- ARGV[7] pending count
-- ARGV[8] the pending ids that hold the floor, comma-separated, then ';' and the id the
--         pending listing proves nothing past when it was cut ('' none; see advance())
-- ARGV[9..] listed ids, ascending
-- Returns progress_reply(advanced | unchanged | unproven, floor)
-- Or progress_reply('unclaimed', ''): no state, no claim flag (_lib.lua); nothing written.
local now = now_ms()
local broken = stored_corrupt(true)
if broken then return progress_reply('corrupt', broken) end
-- A listing that starts above the floor proves nothing: nothing is written, the provider
-- floor included (the caller lists again from the floor).
if id_lt(floor_of(), ARGV[4]) then return progress_reply('unproven', floor_of()) end
if unclaimed(ARGV[3], now) then return progress_reply('unclaimed', '') end
broken = holds_index()
if broken then return progress_reply('corrupt', broken) end
local ids = {}
for i = 9, #ARGV do ids[#ids + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], 'pf_last', ARGV[5], 'pf_oldest', ARGV[6],
  'pf_pending', ARGV[7], 'pf_at', int(now))
local code = advance(ARGV[4], ids, now, ARGV[8])
touch(ARGV[1], ARGV[2], now)
return progress_reply(code, floor_of())

-- lost.lua: deliveries the group handed out (at or below its last-delivered id) that are no
-- longer pending and that progress neither covers nor holds as deferred: lost (an operator
-- ran XGROUP DELCONSUMER, XGROUP SETID past unread entries, ...). Each becomes a gap, so it
-- holds the floor until it is applied or dead-lettered. KEYS: see _lib.lua.
-- ARGV[1] scope id  ARGV[2] scope JSON  ARGV[3] claim flag ('1' | '': see _lib.lua)
-- ARGV[4..] candidate ids (listed, delivered, not pending)
-- Returns progress_reply('lost', comma-separated ids that became gaps now ('' none))
-- Or progress_reply('unclaimed', ''): no state, no claim flag (_lib.lua); nothing written.
local now = now_ms()
local broken = stored_corrupt()
if broken then return progress_reply('corrupt', broken) end
if unclaimed(ARGV[3], now) then return progress_reply('unclaimed', '') end
local lost = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  if not coverage(id) and redis.call('HEXISTS', KEYS[6], id) == 0 then
    if gap(id, now) == 1 then lost[#lost + 1] = id end
  end
end
if #lost > 0 then touch(ARGV[1], ARGV[2], now) end
return progress_reply('lost', table.concat(lost, ','))

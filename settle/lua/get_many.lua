-- get_many.lua: read several records of one shard at once, with the server's clock, each as
-- get.lua reads one (an expired pending lease reads as provisional). One call instead of one
-- per record: what counts records by state (the console's overview) reads them with.
-- KEYS[1..n] records of ONE shard (one hash tag: one slot on a cluster)
-- Returns {ok, '', now, '', replies}: a reply per key, in KEYS order: {'found', record row},
-- {'missing'} or {'corrupt'}.
local now = now_ms()
local out = {}
for i = 1, #KEYS do
  local rec, row = load_record(KEYS[i], nil, now, true)
  if rec == false then
    out[i] = {'corrupt'}
  elseif not rec then
    out[i] = {'missing'}
  else
    out[i] = {'found', replied(row)}
  end
end
return {'ok', '', now, '', out}

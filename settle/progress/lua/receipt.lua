-- receipt.lua: record what the provider said about a settlement; a conclusive answer
-- closes the delivery's settle intent. KEYS: see _lib.lua.
-- ARGV[1] scope id  ARGV[2] scope JSON  ARGV[3] claim flag ('1' | '': see _lib.lua)
-- ARGV[4] delivery id
-- ARGV[5] kind (ack | dead_letter | defer | release)
-- ARGV[6] outcome (acked | released | not_pending | not_owner | reclaimed | no_group)
-- ARGV[7] '1' when conclusive  ARGV[8] worker  ARGV[9] owner reported by the provider
-- ARGV[10] delivery count reported  ARGV[11] entries acknowledged  ARGV[12] receipts cap
-- Returns progress_reply('receipt', receipt entry id)
-- Or progress_reply('unclaimed', ''): no state, no claim flag (_lib.lua); nothing written.
local now = now_ms()
local broken = stored_corrupt()
if broken then return progress_reply('corrupt', broken) end
if unclaimed(ARGV[3], now) then return progress_reply('unclaimed', '') end
-- The receipt first: the intent closes only once what the provider said is on record.
local id = redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[12], '*',
  'delivery', ARGV[4], 'kind', ARGV[5], 'outcome', ARGV[6], 'worker', ARGV[8],
  'owner', ARGV[9], 'deliveries', ARGV[10], 'acked', ARGV[11], 'at', int(now))
if ARGV[7] == '1' then redis.call('HDEL', KEYS[5], ARGV[4]) end
return progress_reply('receipt', id)

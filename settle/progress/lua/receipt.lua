-- receipt.lua: record what the provider said about a settlement; a conclusive answer
-- closes the delivery's settle intent. KEYS: see _lib.lua.
-- ARGV[1] scope id  ARGV[2] scope JSON  ARGV[3] delivery id
-- ARGV[4] kind (ack | dead_letter | defer | release)
-- ARGV[5] outcome (acked | released | not_pending | not_owner | reclaimed | no_group)
-- ARGV[6] '1' when conclusive  ARGV[7] worker  ARGV[8] owner reported by the provider
-- ARGV[9] delivery count reported  ARGV[10] entries acknowledged  ARGV[11] receipts cap
-- Returns progress_reply('receipt', receipt entry id)
local now = now_ms()
local broken = stored_corrupt()
if broken then return progress_reply('corrupt', broken) end
-- The receipt first: the intent closes only once what the provider said is on record.
local id = redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[11], '*',
  'delivery', ARGV[3], 'kind', ARGV[4], 'outcome', ARGV[5], 'worker', ARGV[7],
  'owner', ARGV[8], 'deliveries', ARGV[9], 'acked', ARGV[10], 'at', int(now))
if ARGV[6] == '1' then redis.call('HDEL', KEYS[5], ARGV[3]) end
return progress_reply('receipt', id)

-- receipts.lua: the latest settlement receipts of one scope, newest first, read-only.
-- KEYS[1] receipts STREAM
-- ARGV[1] how many
-- Returns {'receipts', '', now_ms, XREVRANGE entries: {id, {field, value, ...}}} (fields: see
-- receipt.lua)
return reply('receipts', '', now_ms(), redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[1]))

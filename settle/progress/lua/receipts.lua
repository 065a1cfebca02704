-- receipts.lua: the latest settlement receipts of one scope, newest first, read-only.
-- KEYS[1] receipts STREAM
-- ARGV[1] how many
-- Returns XREVRANGE entries: {id, {field, value, ...}} (fields: see receipt.lua)
return redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[1])

-- renew.lua: extend a live pending lease of the current generation (a heartbeat).
-- KEYS[1] record (packed, see _lib.lua)  KEYS[2] the previous layout's attempt log
-- KEYS[3] shard state (see _lib.lua)
-- ARGV[1] fingerprint (in stored form: arg_stored in _lib.lua)
-- ARGV[2] fingerprint version  ARGV[3] binding  ARGV[4] generation
-- ARGV[5] lease ms     ARGV[6] retention ms  ARGV[7] shard count  ARGV[8] claim flag
-- Returns {renewed | lost | corrupt, detail, now, '', record}. A lost lease is not a
-- response, so it is never quarantined; detail says why (unknown_operation, misbound,
-- stale_generation, not_pending, lease_expired). Misbound callers get no record.
-- A lease or retention it cannot use (see arg_refused in _lib.lua) is refused where the lease
-- would be renewed, before anything is written; a lost lease is answered as before.
local bad = arg_refused('renew', 5, 'lease', 'ms', 52)
  or arg_refused('renew', 6, 'retention', 'ms', 62)
local refused = guard(bad)
if refused then return refused end
local now = HEAD_NOW or now_ms()  -- HEAD_*: what renew_head.lua read (see prelude.lua)
local rec, row, st = load_record(KEYS[1], KEYS[2], now, false, HEAD_BLOB)
if rec == false then return {'corrupt', '', now, '', {}} end
if not rec then return {'lost', 'unknown_operation', now, '', {}} end  -- rule: N1
-- rule: N2
if not same(rec.fp, arg_stored(ARGV[1])) or rec.fpv ~= ARGV[2] or rec.bind ~= ARGV[3] then
  return {'lost', 'misbound', now, '', {}}
end
local lost = nil
if rec.gen ~= ARGV[4] then
  lost = 'stale_generation'  -- rule: N3
elseif rec.state ~= 'pending' then
  lost = 'not_pending'  -- rule: N4
elseif tonumber(rec.lease) <= now then
  lost = 'lease_expired'  -- rule: N5
end
if lost then return {'lost', lost, now, '', replied(row)} end
if bad then return redis.error_reply(bad) end
-- rule: N6 (not a transition: the version stays, so the owner's expected_version holds)
local lease = tonumber(ARGV[5])
row = write(st, rec, row, {'lease', int(now + lease)})
st.rexp = now + lease + tonumber(ARGV[6])
save(st, now)
return {'renewed', '', now, '', replied(row)}

-- reserve.lua: claim an operation for a new attempt (SPEC 2, reserve table).
-- KEYS[1] record (packed, see _lib.lua)   KEYS[2] the previous layout's attempt log
-- KEYS[3] shard state (see _lib.lua)
-- ARGV[1] operation id  ARGV[2] fingerprint  ARGV[3] fingerprint version  ARGV[4] binding
-- ARGV[5] lease ms      ARGV[6] retention ms ARGV[7] attempt id           ARGV[8] log cap
-- (the fingerprint and the attempt id in stored form: arg_stored in _lib.lua)
-- ARGV[9] shard count   ARGV[10] claim flag (see guard in _lib.lua)
-- Returns {code, detail, now, '', record}:
--   reserved (detail new | lease_expired | provisional | resumed), replay, in_progress,
--   fingerprint_mismatch, binding_mismatch, corrupt (the last three carry no record),
--   unclaimed, shard_mismatch (from guard; nothing written).
-- A lease, retention or log cap it cannot use (see arg_refused in _lib.lua) is refused where the
-- record would be written, before anything is; a call that answers before that answers as
-- it did, and claims no shard.
local bad = arg_refused('reserve', 5, 'lease', 'ms', 52)
  or arg_refused('reserve', 6, 'retention', 'ms', 62)
  or arg_refused('reserve', 8, 'log cap', 'number')
local refused = guard(bad)
if refused then return refused end
local now, now_us = HEAD_NOW, HEAD_US  -- what reserve_head.lua read (see prelude.lua)
if not now then now, now_us = clock() end
local rec, row, st = load_record(KEYS[1], KEYS[2], now, true, HEAD_BLOB)
if rec == false then return {'corrupt', '', now, '', {}} end
local lease = tonumber(ARGV[5])
local retention = tonumber(ARGV[6])
local detail = 'new'  -- rule: R1
local fp, aid = arg_stored(ARGV[2]), arg_stored(ARGV[7])
if rec then
  -- rule: R2
  if not same(rec.fp, fp) or rec.fpv ~= ARGV[3] then
    return {'fingerprint_mismatch', '', now, '', {}}
  end
  -- rule: R3
  if rec.bind ~= ARGV[4] then return {'binding_mismatch', '', now, '', {}} end
  local state = effective_state(rec, now)
  -- rule: R4, R5
  if is_terminal(state) then return {'replay', state, now, '', replied(row)} end
  if state == 'pending' then
    -- rule: R9
    -- The same attempt asking again (its first reply was lost on the wire) gets its own
    -- reservation back, so reserve is safe to repeat.
    if same(rec.aid, aid) then return {'reserved', 'resumed', now, '', replied(row)} end
    -- rule: R6
    return {'in_progress', '', now, '', replied(row)}
  end
  -- rule: R7, R8
  if rec.state == 'pending' then detail = 'lease_expired' else detail = 'provisional' end
end
if not load_log(st) then return {'corrupt', '', now, '', {}} end
if bad then return redis.error_reply(bad) end
local gen = next_generation(KEYS[3], now_us)
if rec then
  row = write(st, rec, row, {'gen', gen, 'ver', int(tonumber(rec.ver) + 1),
    'n', int(tonumber(rec.n) + 1), 'state', 'pending', 'lease', int(now + lease),
    'aid', aid, 'updated', int(now), 'reason', false})
else
  row = write(st, {}, {false, false, false, false, false, false, false, false, false,
    false, false, false, false, false, false}, {'op', ARGV[1], 'fp', fp,
    'fpv', ARGV[3], 'bind', ARGV[4],
    'gen', gen, 'ver', '1', 'n', '1', 'state', 'pending', 'lease', int(now + lease),
    'aid', aid, 'created', int(now), 'updated', int(now)})
end
st.rexp = now + lease + retention
observe(st, ARGV[8], retention, lease + retention, aid, gen, 'reserve', 'reserved', detail,
  now)
save(st, now)
return {'reserved', detail, now, '', replied(row)}

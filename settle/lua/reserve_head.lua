-- reserve_head.lua: reserve.lua's fast paths (see _head.lua), for its two most repeated
-- calls. KEYS, ARGV and the reply are reserve.lua's. Both need a shard claimed for the
-- caller's shard count (head_claimed in _head.lua). Anything else is left to reserve.lua.
-- * The replay of a settled operation (rules R4, R5), which writes nothing: a completed or
--   failed record whose fingerprint and binding are the caller's.
-- * A new operation (rule R1): no value at the key at all, a fingerprint and an attempt id
--   sent as stored bytes, a fingerprint version that is a canonical integer, a lease and a
--   retention that are whole positive numbers of ms and a log cap of at least one (in
--   whatever text tonumber reads as those, as reserve.lua reads them). The head writes what
--   reserve.lua's write, observe and save would for it: the pending record and its one
--   attempt log entry, packed as _lib.lua describes (record fields relative to created; the
--   entry's aid, gen and at equal to the record's; words as their WORDS index: reserve 5,
--   reserved 9, new 13). It runs reserve.lua's commands in reserve.lua's order: GET, HGET,
--   TIME, HGET, HSET, SET. tests/integration/test_write_heads.py holds its value, its expiry,
--   its reply and the shard's last generation equal to the whole script's.
HEAD_BLOB, HEAD_NOW, HEAD_US = head_read(KEYS[1])  -- reserve.lua's too (see prelude.lua)
if HEAD_NOW then
  local row, state = head_record(KEYS[1], HEAD_BLOB, HEAD_NOW)
  if row and state >= 3 and row[3] == ARGV[3] and row[4] == ARGV[4]
      and string.byte(ARGV[2], 1) == 0 and row[2] == string.sub(ARGV[2], 2)
      and head_claimed() then
    return {'replay', row[7], HEAD_NOW, '', row}
  end
elseif HEAD_BLOB == false and string.byte(ARGV[2], 1) == 0 and #ARGV[7] > 1
    and string.byte(ARGV[7], 1) == 0 then
  local fpv, lease, retention = tonumber(ARGV[3]), tonumber(ARGV[5]), tonumber(ARGV[6])
  if fpv and int(fpv) == ARGV[3] and head_ms(lease) and head_ms(retention)
      and (tonumber(ARGV[8]) or 0) >= 1 and head_claimed() then
    local now, now_us = clock()
    local fp, aid, life = string.sub(ARGV[2], 2), string.sub(ARGV[7], 2), lease + retention
    local gen = next_generation(KEYS[#KEYS], now_us)
    -- fp fpv bind gen ver state(pending) n created updated lease aid reason result rdig rexp
    -- lexp, then the entry: aid gen (both the record's) reserve reserved new at (+0)
    redis.call('SET', KEYS[1], '\2' .. cmsgpack.pack(fp, fpv, ARGV[4], tonumber(gen), 1, 1, 1,
      now, 0, lease, aid, nil, nil, nil, life, life) .. cmsgpack.pack(nil, nil, 5, 9, 13, 0),
      'PX', int(life))
    return {'reserved', 'new', now, '', {ARGV[1], fp, ARGV[3], ARGV[4], gen, '1', 'pending',
      '1', int(now), int(now), int(now + lease), aid, false, false, false}}
  end
end

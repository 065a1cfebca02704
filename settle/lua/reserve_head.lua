-- reserve_head.lua: reserve.lua's fast paths (see _head.lua), for its three most repeated
-- calls. KEYS, ARGV and the reply are reserve.lua's. All need a shard claimed for the
-- caller's shard count (head_claimed in _head_write.lua). Anything else is left to reserve.lua.
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
--   TIME, HGET, HSET, SET.
-- * The takeover by a new attempt (rules R7, R8): a live record whose fingerprint and
--   binding are the caller's, provisional or pending with its lease ended, with a non-empty
--   attempt id; an attempt log head_log can pack again with room for one more entry under
--   the cap; an attempt id sent as stored bytes, a lease and a retention that are whole
--   positive numbers of ms. The record gets the next generation (next_generation, as
--   reserve.lua issues it), the next version and attempt count, the new attempt and lease,
--   no reason; the log's first entry is stored again against the new attempt and
--   generation, and the log gains `aid gen reserve reserved lease_expired|provisional now`
--   (commands: GET, TIME, HGET, HGET, HSET, SET).
-- tests/integration/test_write_heads.py holds every write path's value, expiry, reply and
-- the shard's last generation equal to the whole script's.
if #KEYS == 3 and #ARGV == 10 then  -- reserve.lua's shape (else the whole script answers)
  HEAD_BLOB, HEAD_NOW, HEAD_US = head_read(KEYS[1])  -- reserve.lua's too (see prelude.lua)
end
if HEAD_NOW then
  local now = HEAD_NOW
  local row, state, t = head_record(KEYS[1], HEAD_BLOB, now)
  if row and int(t[2]) == ARGV[3] and row[4] == ARGV[4] and string.byte(ARGV[2], 1) == 0
      and row[2] == string.sub(ARGV[2], 2) and head_claimed() then
    if state >= 3 then return {'replay', row[7], now, '', row} end
    -- the takeover (R7: a lease that ended; R8: provisional)
    local lease, retention = tonumber(ARGV[5]), tonumber(ARGV[6])
    local entries, at, last_aid, last_gen
    if (state == 2 or t[8] + t[9] + t[10] <= now) and type(t[11]) == 'string' and t[11] ~= ''
        and string.byte(ARGV[7], 1) == 0 and #ARGV[7] > 1 and head_ms(lease)
        and head_ms(retention) then
      entries, at, last_aid, last_gen = head_log(t, now, tonumber(ARGV[8]) or 0)
    end
    if entries then
      local aid, life = string.sub(ARGV[7], 2), lease + retention
      local detail, word = 2, 'provisional'  -- WORDS in _lib.lua
      if state == 1 then detail, word = 14, 'lease_expired' end
      local gen = next_generation(KEYS[#KEYS], HEAD_US)
      local g = tonumber(gen)
      -- the log's first entry against the new attempt and generation, then the new entry
      -- against the last one: an attempt id or a generation is stored where it differs
      local first_aid, first_gen, new_aid, new_gen = t[17] or t[11], t[18] or t[4], aid, g
      if first_aid == aid then first_aid = nil end
      if first_gen == g then first_gen = nil end
      if new_aid == last_aid then new_aid = nil end
      if new_gen == last_gen then new_gen = nil end
      local rest = ''
      if entries > 1 then rest = cmsgpack.pack(unpack(t, 23, t.n)) end
      -- fp fpv bind gen ver state(pending) n created updated lease aid reason result rdig
      -- rexp lexp, then the log
      redis.call('SET', KEYS[1], '\2' .. cmsgpack.pack(t[1], t[2], t[3], g, t[5] + 1, 1,
          t[7] + 1, t[8], now - t[8], lease, aid, nil, t[13], t[14], life, now + life - t[8])
        .. cmsgpack.pack(first_aid, first_gen, t[19], t[20], t[21], t[22]) .. rest
        .. cmsgpack.pack(new_aid, new_gen, 5, 9, detail, now - at),
        'PX', int(life))
      row[5], row[6], row[7], row[8] = g, t[5] + 1, 'pending', t[7] + 1
      row[10], row[11], row[12], row[13] = now, now + lease, aid, false
      return {'reserved', word, now, '', row}
    end
  end
elseif HEAD_BLOB == false and string.byte(ARGV[2], 1) == 0 and #ARGV[7] > 1
    and string.byte(ARGV[7], 1) == 0 then
  local fpv, lease, retention = tonumber(ARGV[3]), tonumber(ARGV[5]), tonumber(ARGV[6])
  if fpv and whole(fpv) and int(fpv) == ARGV[3] and head_ms(lease) and head_ms(retention)
      and (tonumber(ARGV[8]) or 0) >= 1 and head_claimed() then
    local now, now_us = clock()
    local fp, aid, life = string.sub(ARGV[2], 2), string.sub(ARGV[7], 2), lease + retention
    local gen = next_generation(KEYS[#KEYS], now_us)
    -- fp fpv bind gen ver state(pending) n created updated lease aid reason result rdig rexp
    -- lexp, then the entry: aid gen (both the record's) reserve reserved new at (+0)
    redis.call('SET', KEYS[1], '\2' .. cmsgpack.pack(fp, fpv, ARGV[4], tonumber(gen), 1, 1, 1,
      now, 0, lease, aid, nil, nil, nil, life, life) .. cmsgpack.pack(nil, nil, 5, 9, 13, 0),
      'PX', int(life))
    return {'reserved', 'new', now, '', {ARGV[1], fp, fpv, ARGV[4], tonumber(gen), 1,
      'pending', 1, now, now, now + lease, aid, false, false, false}}
  end
end

-- renew_head.lua: renew.lua's fast path (see _head.lua): the heartbeat of the attempt that
-- holds the operation (rule N6), sent every third of a lease while a long call runs. KEYS,
-- ARGV and the reply are renew.lua's. It answers only where renew.lua would renew and write
-- exactly this: a live pending record (head_record) whose fingerprint (sent as stored
-- bytes), fingerprint version, binding and generation are the caller's, whose lease has not
-- ended, with an attempt id and no reason; an attempt log head_log can pack again, whose
-- expiry sums exactly with the record's creation time; a lease and a retention that are
-- whole positive numbers of ms (in whatever text tonumber reads as those, as renew.lua reads
-- them); a shard claimed for the caller's shard count. The lease then ends `lease` ms from
-- now and the record expires `retention` ms after that; every other value, the log and its
-- expiry stay (a renewal is not observed), so the head packs them as they are (its
-- commands: GET, TIME, HGET, SET). Anything else is left to renew.lua, which reuses the
-- value and clock read here (HEAD_BLOB, HEAD_NOW).
if #KEYS == 3 and #ARGV == 8 then  -- renew.lua's shape (else the whole script answers)
  HEAD_BLOB, HEAD_NOW = head_read(KEYS[1])  -- renew.lua's too (see prelude.lua)
end
if HEAD_NOW then
  local now = HEAD_NOW
  local row, state, t = head_record(KEYS[1], HEAD_BLOB, now)
  local lease, retention = tonumber(ARGV[5]), tonumber(ARGV[6])
  if row and state == 1 and string.byte(ARGV[1], 1) == 0 and t[1] == string.sub(ARGV[1], 2)
      and int(t[2]) == ARGV[2] and row[4] == ARGV[3] and int(t[4]) == ARGV[4]
      and t[8] + t[9] + t[10] > now and type(t[11]) == 'string' and t[12] == nil
      and head_ms(lease) and head_ms(retention) and head_log(t, now)
      and whole(t[8] + t[16]) and head_claimed() then
    -- fp fpv bind gen ver state n created updated lease aid reason result rdig rexp lexp,
    -- then the log: the lease and the record's expiry are relative to updated
    local updated, ends = t[8] + t[9], now + lease
    t[10], t[15] = ends - updated, ends + retention - updated
    redis.call('SET', KEYS[1], '\2' .. cmsgpack.pack(unpack(t, 1, t.n)),
      'PX', int(math.max(ends + retention, t[8] + t[16]) - now))
    row[11] = ends
    return {'renewed', '', now, '', row}
  end
end

-- _head_settle.lua: the settlements' head (see _head.lua; on _head.lua's and
-- _head_write.lua's helpers).

-- complete_head.lua's, fail_head.lua's and mark_provisional_head.lua's fast paths: the
-- accepted settlement (rules S5, S6, S7) of the attempt that holds the operation, the most
-- repeated write after a new reserve, and the duplicate of a settlement (S8, S10, S11), a
-- repeat after a lost reply. Both need a live record (head_record) whose fingerprint (sent as
-- stored bytes), fingerprint version, binding and generation are the caller's; an attempt id
-- sent as non-empty stored bytes; an attempt log head_log can pack again, with room for one
-- more entry under the cap; a retention that is a whole positive number of ms (in whatever
-- text tonumber reads as one, as the whole script reads it); a shard claimed for the caller's
-- shard count; the call in _settle.lua's shape. The new log entry names its attempt and
-- generation where the last entry's differ, as save() stores it. A duplicate is a completed or
-- failed record, with no reason and an expiry whose sum with updated is exact, and the same
-- completion or failure again (state word `terminal` the record's, its digest sent as stored
-- bytes and the record's) or any mark_provisional, whatever version it carries: the record
-- stays as it is and the log gains `aid gen action absorbed '' now`, living as long as the
-- record or for the retention, whichever is longer. The accepted settlement is a pending or
-- provisional record whose attempt id and (when given) version are the caller's. A completion
-- or a failure also needs its digest sent as stored bytes, and makes the record terminal with
-- the result and its digest and no reason. A mark_provisional (terminal = 2, provisional)
-- needs a reason that is not a word (one save() stores as its WORDS index: they are listed
-- below between bars, and the unit tests hold the list to _lib.lua's) and, on a provisional
-- record, not the reason it holds (the same reason again is absorbed, S12); the record keeps
-- its result and digest and takes the reason. Either way the record gets the next version, no
-- lease, expiring after the retention, and the log gains `aid gen action accepted '' now`. A
-- value save() writes from either packs the same values, so the head packs them too (its
-- commands: GET, TIME, HGET, SET). Returns the reply, or nil to leave the call to the whole
-- script (which then reuses the value and clock read here: HEAD_BLOB, HEAD_NOW).
local function head_settle(action, terminal)
  if #KEYS ~= 6 or #ARGV ~= 16 then return nil end  -- not _settle.lua's shape: the rules'
  HEAD_BLOB, HEAD_NOW, HEAD_US = head_read(KEYS[1])
  local now = HEAD_NOW
  if not now then return nil end
  local row, state, t = head_record(KEYS[1], HEAD_BLOB, now)
  -- fpv, gen and the version compared as the whole script compares them, as text
  if not row or int(t[2]) ~= ARGV[3] or row[4] ~= ARGV[4] or int(t[4]) ~= ARGV[5]
      or string.byte(ARGV[2], 1) ~= 0 or t[1] ~= string.sub(ARGV[2], 2)
      or string.byte(ARGV[7], 1) ~= 0 or #ARGV[7] < 2 then
    return nil
  end
  local retention, cap = tonumber(ARGV[11]), tonumber(ARGV[12]) or 0
  local provisional, entries, at, last_aid, last_gen = terminal == 2, head_log(t, now, cap)
  if not entries or not head_ms(retention) then
    return nil
  end
  -- the new entry's attempt and generation, stored only where the last entry's differ
  local aid, gen = string.sub(ARGV[7], 2), t[4]
  if aid == last_aid then aid = nil end
  if gen == last_gen then gen = nil end
  if state > 2 then
    -- the duplicate (see above; a reason would be stored again as save() stores it, as its
    -- WORDS index where it is a word: a head leaves it to the rules)
    local rexp = t[15] and t[8] + t[9] + t[15]
    if not (provisional or (terminal == state and string.byte(ARGV[9], 1) == 0
          and t[14] == string.sub(ARGV[9], 2)))
        or t[12] ~= nil or not rexp or not whole(rexp) or not head_claimed() then
      return nil
    end
    local ttl = math.max(rexp - now, retention)
    -- fp fpv bind gen ver state n created updated lease aid reason result rdig rexp, lexp
    redis.call('SET', KEYS[1], '\2' .. cmsgpack.pack(unpack(t, 1, 15))
        .. cmsgpack.pack(now + ttl - t[8], unpack(t, 17, t.n))
        .. cmsgpack.pack(aid, gen, action, 11, '', now - at),
      'PX', int(ttl))
    return {'absorbed', '', now, '', row, 0}
  end
  if (ARGV[6] ~= '' and ARGV[6] ~= int(t[5])) or type(t[11]) ~= 'string' or t[11] == ''
      or t[11] ~= string.sub(ARGV[7], 2) then
    return nil
  end
  local reason, result, rdig = nil, ARGV[8], string.sub(ARGV[9], 2)
  if provisional then
    reason, result, rdig = ARGV[10], t[13], t[14]
    if string.find('|pending|provisional|completed|failed|reserve|complete|fail|'
        .. 'mark_provisional|reserved|accepted|absorbed|quarantined|new|lease_expired|resumed|'
        .. 'unknown_operation|misbound|stale_generation|version_conflict|'
        .. 'conflicting_settlement|', '|' .. reason .. '|', 1, true)
        or (state == 2 and t[12] == reason) then
      return nil
    end
  elseif string.byte(ARGV[9], 1) ~= 0 then
    return nil
  end
  if not head_claimed() then return nil end
  -- fp fpv bind gen ver state n created updated lease aid reason result rdig rexp lexp
  redis.call('SET', KEYS[1], '\2' .. cmsgpack.pack(t[1], t[2], t[3], t[4], t[5] + 1, terminal,
      t[7], t[8], now - t[8], nil, t[11], reason, result, rdig, retention,
      now + retention - t[8]) .. cmsgpack.pack(unpack(t, 17, t.n))
      .. cmsgpack.pack(aid, gen, action, 10, '', now - at),
    'PX', int(retention))
  row[6], row[7], row[10], row[11] = t[5] + 1, HEAD_STATES[terminal], now, false
  row[13], row[14], row[15] = reason or false, result or false, rdig or false
  return {'accepted', '', now, '', row, 0}
end

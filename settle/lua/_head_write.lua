-- _head_write.lua: what the write heads check, and the replay's shard check (see _head.lua;
-- on _head.lua's helpers).

-- Whether the shard is claimed for the caller's shard count, what guard() checks first
-- (redis.pcall: a state of another type is an error table, never equal, and guard() answers
-- corrupt_state); a head answers nothing on a shard that is not.
local function head_claimed()
  return redis.pcall('HGET', KEYS[#KEYS], 'shards') == ARGV[#ARGV - 1]
end

-- A lease or a retention a write head takes: a whole positive number of ms (below 2^40, so
-- every sum with the clock stays exact).
local function head_ms(x)
  return whole(x) and x > 0 and x < 2^40
end

-- The most entries a write head packs in one call (see head_log).
local HEAD_LOG = 400

-- A word of the attempt log stored as its index (what save() writes for every word): a
-- whole number from 1 to 20 (whole() written out).
local function head_word(x)
  return type(x) == 'number' and x % 1 == 0 and x >= 1 and x <= 20
end

-- The attempt log in t (head_record's values) when a write head can pack it again value for
-- value as save() would: alive at now (its expiry a whole number of ms), one to HEAD_LOG
-- entries (and, with a cap, room for one more under it: checked first, so a log at its cap
-- costs no more than its length), their words stored as indexes (the detail may be ''), every
-- time a whole number and their running sum exact, an entry's attempt id (when stored: else
-- the previous entry's) a non-empty string and its generation a whole number. save() encodes
-- the first entry again against the record's attempt and generation, as nil where they are the
-- same: one stored as the record's own (a value settle does not write) is left to the scripts.
-- Returns the number of entries, the last entry's time (ms), attempt id and generation (the
-- record's where no entry names another), or nil. (At most HEAD_LOG entries: a head packs the
-- log in one cmsgpack.pack call, which takes 3000 values at most; save() packs a longer one in
-- parts.)
local function head_log(t, now, cap)
  local entries = (t.n - 16) / 6
  if entries < 1 or entries > HEAD_LOG or (cap and entries + 1 > cap) or not whole(t[16])
      or t[8] + t[16] <= now
      or (t[17] ~= nil and t[17] == t[11]) or (t[18] ~= nil and t[18] == t[4]) then
    return nil
  end
  local at, aid, gen = t[8], t[11], t[4]
  for i = 17, t.n, 6 do
    local a, g = t[i], t[i + 1]
    if a ~= nil then
      if type(a) ~= 'string' or a == '' then return nil end
      aid = a
    end
    if g ~= nil then
      if not whole(g) then return nil end
      gen = g
    end
    if not head_word(t[i + 2]) or not head_word(t[i + 3])
        or not (head_word(t[i + 4]) or t[i + 4] == '') or not whole(t[i + 5]) then
      return nil
    end
    at = at + t[i + 5]
    if not whole(at) then return nil end  -- save() would compute it otherwise (rounded)
  end
  return entries, at, aid, gen
end

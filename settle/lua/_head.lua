-- _head.lua: the fast paths of get.lua, reserve.lua, complete.lua, fail.lua,
-- mark_provisional.lua and renew.lua (their *_head.lua files) and what they share. settle
-- assembles a script with a head as: the runtime's prelude, this file, the head, then the
-- core's libraries and the script's own file (settle._runtime.scripts). So on Redis 6.2,
-- where every EVALSHA defines every helper of _lib.lua again, a call that the head answers
-- defines none of them; as a FUNCTION (Redis 7+, Valkey) the head runs first in the callback.
--
-- A head answers only when it is certain that the whole script would give the very same reply
-- and make the very same writes. A read head (get, the replay of reserve) writes nothing: it
-- answers from a packed value (see _lib.lua) whose record it checked field by field as
-- unpack_value and valid do. A write head (a new operation's reserve and its takeover, the
-- accepted complete, fail or mark_provisional and their duplicates, the renewal of a live
-- lease) answers only the one case it is built for, in argument forms whose outcome it can
-- tell (settle's own calls among them; never a call with another number of keys or arguments
-- than its script's), and writes what write, observe and save would. On anything else (the
-- previous layout, a record expired, a field in a form it does not check, a fingerprint or
-- binding that does not match, an unclaimed shard; for a read head, a settlement or a renewal,
-- no value) it answers nil and the whole script runs as before.
-- tests/integration/test_read_heads.py and test_write_heads.py hold both paths' replies, and
-- the write heads' values, expiries and generations, equal.

-- A whole number a double holds exactly (what settle stores as an integer): int() writes
-- it as _lib.lua's unnum does. A sum of them is checked with whole() again where
-- unpack_value's unrel_int checks it (updated, the lease end); the record's expiry is a sum
-- unrel makes through text, the same number below 2^63. (The prelude's exact() written out:
-- a head calls whole() a dozen times and more per call, and a Lua call each costs.)
local function whole(x)
  return type(x) == 'number' and x % 1 == 0 and x > -9007199254740992
    and x < 9007199254740992
end

local HEAD_STATES = {'pending', 'provisional', 'completed', 'failed'}

-- The values a pcall'd cmsgpack.unpack returned, with their count (nil values included).
local function head_values(ok, ...)
  if ok then return {n = select('#', ...), ...} end
  return nil
end

-- The record key's value as GET gives it (false when there is none; redis.pcall, so a key
-- of another type gives an error table) and, only when it holds a packed value, the server
-- clock (ms, µs) the head reads for it. The script behind the head reuses both (HEAD_BLOB and
-- HEAD_NOW in prelude.lua), so a reserve of a new operation runs one GET and one TIME.
local function head_read(key)
  local blob = redis.pcall('GET', key)
  if type(blob) == 'string' and string.byte(blob, 1) == 2 then return blob, clock() end
  return blob
end

-- The live record in blob (head_read's, of key) as the scripts reply it (the row in
-- _lib.lua's FIELDS order), its state's word index and the decoded values, or nil when the
-- head is not certain (see above).
local function head_record(key, blob, now)
  local t = head_values(pcall(cmsgpack.unpack, string.sub(blob, 2)))
  if not t then return nil end
  -- fp fpv bind gen ver state n created updated lease aid reason result rdig rexp lexp
  if t.n < 16 or (t.n - 16) % 6 ~= 0 then return nil end
  local state = t[6]
  if not (type(t[1]) == 'string' and whole(t[2]) and type(t[3]) == 'string' and whole(t[4])
      and whole(t[5]) and whole(state) and state >= 1 and state <= 4 and whole(t[7])
      and whole(t[8]) and whole(t[9]) and (t[10] == nil or whole(t[10]))
      and (t[11] == nil or type(t[11]) == 'string') and (t[12] == nil or type(t[12]) == 'string')
      and (t[13] == nil or type(t[13]) == 'string') and (t[14] == nil or type(t[14]) == 'string')
      and (t[15] == nil or whole(t[15]))
      and (t[16] == nil or whole(t[16]))) then
    return nil
  end
  local updated = t[8] + t[9]
  -- unrel_int refuses an updated or a lease end past 2^53 (the record is corrupt)
  if not whole(updated) or (t[10] ~= nil and not whole(updated + t[10])) then return nil end
  if state == 1 and t[10] == nil then return nil end  -- pending without a lease: corrupt
  if t[15] ~= nil and updated + t[15] <= now then return nil end  -- the record expired
  local lease = false
  if t[10] ~= nil then lease = int(updated + t[10]) end
  local at = string.find(key, '}:op:', 1, true)
  if not at then return nil end  -- not a record's key: guard() or load_record() answers
  return {string.sub(key, at + 5), t[1], int(t[2]), t[3], int(t[4]), int(t[5]),
    HEAD_STATES[state], int(t[7]), int(t[8]),
    int(updated), lease, t[11] or false, t[12] or false, t[13] or false, t[14] or false},
    state, t
end

-- The next fencing generation of a shard: a hybrid logical clock, max(last + 1, server time
-- in microseconds). Strictly increasing while the state lives; after the state was lost
-- (restart without persistence, FLUSHALL, eviction, a failover that lost the latest writes)
-- it restarts from the server clock, above every generation issued before, as long as the
-- server clock did not step back and generations were issued no faster than one per
-- microsecond (docs/concepts.md, "Generations"). Below 2^53 until the year 2255. (Here, not
-- in _lib.lua: reserve.lua and its head, the only scripts that issue generations, both call it.)
local function next_generation(key, now_us)
  local stored_gen = redis.call('HGET', key, 'gen')
  local last = decimal(stored_gen) and tonumber(stored_gen) or 0
  local gen = math.max(last + 1, now_us)
  redis.call('HSET', key, 'gen', int(gen))
  return int(gen)
end

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
  if not row or row[3] ~= ARGV[3] or row[4] ~= ARGV[4] or row[5] ~= ARGV[5]
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
  if (ARGV[6] ~= '' and ARGV[6] ~= row[6]) or type(t[11]) ~= 'string' or t[11] == ''
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
  row[6], row[7], row[10], row[11] = int(t[5] + 1), HEAD_STATES[terminal], int(now), false
  row[13], row[14], row[15] = reason or false, result or false, rdig or false
  return {'accepted', '', now, '', row, 0}
end

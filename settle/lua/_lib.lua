-- _lib.lua: the core's helpers, shared by every core script. settle prepends the runtime's
-- prelude (settle/_runtime/lua/prelude.lua: clock, now_ms, exact, int, decimal, reply) and
-- then this file to each script body when it loads them; it is never run on its own.
--
-- A record and its attempt log are ONE packed STRING at the record key (docs/concepts.md,
-- "The record in Redis"; settle/_core/layout.py is the same format in Python): MAGIC, then
-- one cmsgpack.pack of the values, so a script decodes and encodes it in one C call each:
--   the record's (or one nil when only the log is left):
--     fp fpv bind gen ver state n created updated lease aid reason result rdig rexp
--   (updated relative to created; lease and rexp, the record's own expiry in ms, relative
--   to updated), then lexp (the log's expiry, relative to the record's created, or absolute
--   without a record) and the attempt log's entries, six values each: aid gen action verdict
--   detail at (aid and gen nil when equal to the previous entry's, the first entry's
--   previous being the record's aid, gen and created; at relative to the previous entry's).
-- Digests and attempt ids of hex digits are stored as the bytes they spell (other text as
-- a one-element array), integers as msgpack integers, words (states, actions, verdicts,
-- details) as their index in WORDS, bind and result as they are. The key expires with the
-- later of its two parts; a part whose own expiry has passed reads as absent.
-- As the scripts see it, a record has the fields:
--   op fp fpv bind gen ver state n created updated   (always; op is read from the key)
--   lease aid                                         (pending: lease end in ms, attempt id)
--   reason                                            (provisional)
--   result rdig                                       (completed / failed: bytes, digest)
-- where fp, aid and rdig are as stored (hexed: the bytes their hex digits spell, or {text}),
-- so they are compared with same() against arg_stored(ARGV[i]) and replied as they are (the
-- client turns them back into hex: settle/_core/codec.py decode_record);
-- and the attempt log is a list of 'aid|gen|action|verdict|detail|at' strings, oldest first.
-- A record written by settle before this layout (a HASH, its attempt log a LIST at the
-- ':log:' key the writing scripts still name) is read as it is and rewritten packed by the
-- next write, which deletes the old list.
-- Each shard has a state HASH that never expires: gen (the last generation issued there) and
-- shards (the namespace's shard count the shard was claimed for).
-- Every writing script is called with that key as its LAST key and (shard count, claim flag)
-- as its last two arguments, and calls guard() before it writes anything.
-- Every script returns {code, detail, now_ms, quarantine_id, payload}; payload is the
-- record as a positional list of FIELDS (false where a field is absent), or a list of
-- entries for the read scripts.

-- The order of FIELDS is the reply format: settle/_core/codec.py RECORD_FIELDS matches it.
local FIELDS = {'op', 'fp', 'fpv', 'bind', 'gen', 'ver', 'state', 'n', 'created', 'updated',
  'lease', 'aid', 'reason', 'result', 'rdig'}
local REQUIRED = 10  -- the first ten are always present
local STATES = {pending = true, provisional = true, completed = true, failed = true}
local MAGIC = '\2'
-- The words stored as a small number; append only (layout.py WORDS is the same list).
local WORDS = {'pending', 'provisional', 'completed', 'failed', 'reserve', 'complete', 'fail',
  'mark_provisional', 'reserved', 'accepted', 'absorbed', 'quarantined', 'new',
  'lease_expired', 'resumed', 'unknown_operation', 'misbound', 'stale_generation',
  'version_conflict', 'conflicting_settlement'}
local WORD = nil  -- word -> index, made by the first word() of a call

-- Hex digits <-> bytes in one struct call each (only rare paths convert: the client sends
-- digests and attempt ids in stored form, see arg_stored). HEXF[n] = {struct format,
-- string.format format} for n bytes; nothing else is kept between calls (a FUNCTION
-- library's locals live as long as the library, so a memo of values would grow forever).
local HEXF = {}
local function hexfmt(n)
  local f = HEXF[n]
  if not f then
    local q, r = math.floor(n / 4), n % 4
    f = {'>' .. string.rep('I4', q), string.rep('%08x', q)}
    if r > 0 then f = {f[1] .. 'I' .. r, f[2] .. '%0' .. (2 * r) .. 'x'} end
    HEXF[n] = f
  end
  return f
end

-- Values of any length convert in chunks of CHUNK bytes: one struct call takes as many
-- values as Lua's C stack holds, and HEXF keeps one format per length up to CHUNK.
local CHUNK = 256

local function tohex(raw)
  if #raw > CHUNK then
    local parts = {}
    for i = 1, #raw, CHUNK do parts[#parts + 1] = tohex(string.sub(raw, i, i + CHUNK - 1)) end
    return table.concat(parts)
  end
  local f = hexfmt(#raw)
  return string.format(f[2], struct.unpack(f[1], raw))
end

-- Encoders (a field as the scripts see it -> its stored value) and decoders (the reverse;
-- they raise on a value of the wrong type). hexed: an even number of lowercase hex digits
-- as the bytes they spell, other text as {text}; num: a decimal integer as a number (other
-- text as it is); word: one of WORDS as its index; rel: an integer relative to base.
local function hexed(v)
  if v == nil then return nil end
  if #v == 0 or #v % 2 == 1 or string.find(v, '[^0-9a-f]') then return {v} end
  local parts = {}
  for c = 1, #v, 2 * CHUNK do
    local piece, nums = string.sub(v, c, c + 2 * CHUNK - 1), {}
    for i = 1, #piece, 8 do nums[#nums + 1] = tonumber(string.sub(piece, i, i + 7), 16) end
    parts[#parts + 1] = struct.pack(hexfmt(#piece / 2)[1], unpack(nums))
  end
  return table.concat(parts)
end

local function unhexed(v)
  if type(v) == 'string' then return tohex(v) end
  if v == nil then return nil end
  return v[1]
end

-- The client sends fp, aid and rdig in their stored form (settle/_core/layout.py
-- stored_arg): NUL and the bytes an even number of lowercase hex digits spell, other text as
-- it is (such text never starts with NUL). arg_stored(v) is hexed(text), with no hex to
-- convert; rare().arg_text(v) is the text itself (quarantine entries and identities hold it).
local function arg_stored(v)
  if string.byte(v, 1) == 0 then return string.sub(v, 2) end
  return {v}
end

-- The stored form of no attempt id (hexed('')): what the first log entry's aid is relative
-- to when there is no record.
local NOAID = {''}

-- The form hexed gives the text a stored hexed value stands for (settle writes no other).
local function canonical(v)
  if type(v) == 'table' then return hexed(v[1]) end
  if v == '' then return NOAID end
  return v
end

-- A stored hexed value, checked (the scripts keep fp, aid and rdig in this form: they are
-- compared with same() and replied as they are, so a read converts no hex).
local function stored(v)
  if v ~= nil and type(v) ~= 'string'
      and (type(v) ~= 'table' or type(v[1]) ~= 'string' or #v ~= 1) then
    error('type')
  end
  return v
end

-- Whether two hexed values stand for the same text (a crafted value may hold one in another
-- form than hexed gives: {'0f0f'} for the bytes '0f0f' spells, '' for {''}).
local function same(a, b)
  a, b = canonical(a), canonical(b)
  if type(a) == 'table' then return type(b) == 'table' and a[1] == b[1] end
  return a == b
end

local function num(v)
  if v == nil then return nil end
  local n = tonumber(v)
  if n and int(n) == v then return n end
  return v
end

local function unint(v)
  if type(v) == 'number' then
    if not exact(v) then error('range') end
    return int(v)
  end
  if v ~= nil and not decimal(v) then error('type') end
  return v
end

local function unnum(v)
  if type(v) == 'number' then return int(v) end
  if v ~= nil and type(v) ~= 'string' then error('type') end
  return v
end

local function word(v)
  if v == nil then return nil end
  if not WORD then
    -- WORDS reversed, as one constructor (tests/unit/test_lua_sources.py holds them equal).
    WORD = {pending = 1, provisional = 2, completed = 3, failed = 4, reserve = 5, complete = 6,
      fail = 7, mark_provisional = 8, reserved = 9, accepted = 10, absorbed = 11,
      quarantined = 12, new = 13, lease_expired = 14, resumed = 15, unknown_operation = 16,
      misbound = 17, stale_generation = 18, version_conflict = 19, conflicting_settlement = 20}
  end
  return WORD[v] or v
end

local function unword(v)
  if type(v) == 'number' then return WORDS[v] or error('word') end
  if v ~= nil and type(v) ~= 'string' then error('type') end
  return v
end

local function text(v)
  if v ~= nil and type(v) ~= 'string' then error('type') end
  return v
end

local function rel(v, base)
  if v == nil or v == false then return nil end
  return tonumber(v) - tonumber(base)
end

local function unrel(v, base)
  if v == nil then return nil end
  if type(v) ~= 'number' then error('type') end
  return int(assert(tonumber(base)) + v)
end

local function unrel_int(v, base)
  if v == nil then return nil end
  if type(v) ~= 'number' then error('type') end
  local x = assert(tonumber(base)) + v
  if not exact(x) then error('range') end
  return int(x)
end

local function values(...)
  return {n = select('#', ...), ...}
end

-- Decode a packed value into st: st.stored (the record as stored, live or not), st.rexp and
-- st.lexp (absolute ms), st.base, and the decoded values (st.t, the log from st.logpos)
-- for scan_log. Raises on anything malformed.
local function unpack_value(st, blob)
  if string.sub(blob, 1, 1) ~= MAGIC then error('magic') end
  local t = values(cmsgpack.unpack(string.sub(blob, 2)))
  local rec, i = nil, 2
  if t[1] ~= nil then
    if t.n < 16 then error('truncated') end
    rec = {fp = stored(t[1]), fpv = unint(t[2]), bind = text(t[3]), gen = unint(t[4]),
      ver = unint(t[5]), state = unword(t[6]), n = unint(t[7]), created = unint(t[8]),
      aid = stored(t[11]), reason = unword(t[12]), result = text(t[13]),
      rdig = stored(t[14])}
    rec.updated = unrel_int(t[9], rec.created)
    rec.lease = unrel_int(t[10], rec.updated)
    if t[15] ~= nil then st.rexp = tonumber(unrel(t[15], rec.updated)) end
    i = 16
  end
  if i > t.n or (t.n - i) % 6 ~= 0 then error('truncated') end
  if t[i] ~= nil then st.lexp = tonumber(unrel(t[i], rec and rec.created or '0')) end
  st.stored, st.t, st.logpos = rec, t, i + 1
  -- What the log's first entry is relative to (the record's fields change when it is written).
  st.base = {NOAID, '', 0}
  if rec then st.base = {rec.aid or NOAID, rec.gen, tonumber(rec.created)} end
end

-- The attempt log is kept as it was decoded: st.nold entries of six values in st.t from
-- st.logpos (the first st.drop of them dropped by the cap), then st.new, the entries this
-- call observed ({aid, gen, action, verdict, detail, at}: aid stored, at a number, the rest
-- text; an entry of the previous layout is all text but its aid). save() packs the kept
-- entries' values as they are and encodes again only the first of them (its aid, gen and
-- at are relative to the record's, which may have changed) and the new ones, so appending
-- to a long log costs no text work per entry. Attempt ids are kept in their stored form
-- (hexed) throughout, and compared with same().

-- Check the packed log's entries (raises on anything malformed) and note the last one's
-- aid, gen (as stored) and at (absolute, a number): a new entry is encoded against it.
local function scan_log(st)
  local t = st.t
  local aid, gen, at = st.base[1], st.base[2], st.base[3]
  for i = st.logpos, t.n, 6 do
    if t[i] ~= nil then aid = stored(t[i]) end
    if t[i + 1] ~= nil then gen = unnum(t[i + 1]) end
    unword(t[i + 2]); unword(t[i + 3]); unword(t[i + 4])
    if type(t[i + 5]) ~= 'number' then error('at') end
    at = at + t[i + 5]
  end
  st.nold, st.last = (t.n - st.logpos + 1) / 6, {aid, gen, at}
end

-- Make the packed log ready to be written: false when it does not decode (nothing may be
-- written then).
local function load_log(st)
  if st.nold == nil and not pcall(scan_log, st) then return false end
  return true
end

-- The absolute aid (stored), gen (text) and at (a number) of the packed log's entry j.
local function entry_at(st, j)
  local t = st.t
  local aid, gen, at = st.base[1], st.base[2], st.base[3]
  for i = st.logpos, st.logpos + 6 * (j - 1), 6 do
    if t[i] ~= nil then aid = t[i] end
    if t[i + 1] ~= nil then gen = unnum(t[i + 1]) end
    at = at + t[i + 5]
  end
  return aid, gen, at
end

-- The fields the rules compute with: integers wherever they are present (unpack_value
-- checks them as it reads a packed value; a record of the previous layout is all text).
local NUMBERS = {'fpv', 'gen', 'ver', 'n', 'created', 'updated', 'lease'}

local function valid(rec, text_numbers)
  for i = 2, REQUIRED do
    if rec[FIELDS[i]] == nil then return false end
  end
  if not STATES[rec.state] then return false end
  if text_numbers then
    for _, f in ipairs(NUMBERS) do
      if rec[f] ~= nil and not decimal(rec[f]) then return false end
    end
  end
  return rec.state ~= 'pending' or rec.lease ~= nil
end

-- The most entries one value may hold (layout.LOG_MAX, SettleConfig.attempt_log_size).
local LOG_MAX = 1000

-- The helpers only rare paths use, as rare().name: a record in the previous layout, the
-- attempt log as text, the quarantine's identities and deletions, an argument's text. On
-- Redis 6.2 every EVALSHA defines this library again and each helper is a closure made anew,
-- so these are made only in a call that needs them (the common paths saved 7-9 µs of server
-- time per write on 6.2, measured); a FUNCTION library makes them once.
local RARE = nil
local function rare()
  if RARE then return RARE end
  local r = {}

  function r.arg_text(v)
    if string.byte(v, 1) == 0 then return tohex(string.sub(v, 2)) end
    return v
  end

  function r.split(entry)
    local parts, from = {}, 1
    for _ = 1, 5 do
      local at = string.find(entry, '|', from, true)
      if not at then return nil end
      parts[#parts + 1] = string.sub(entry, from, at - 1)
      from = at + 1
    end
    parts[6] = string.sub(entry, from)
    return parts
  end

  -- A record in the layout before this one: a HASH, and its attempt log a LIST at log_key.
  function r.load_legacy(st, now)
    local row = redis.call('HMGET', st.key, unpack(FIELDS))
    local rec = {}
    for i = 1, #FIELDS do rec[FIELDS[i]] = row[i] or nil end
    if not row[1] or not valid(rec, true) then return false end
    rec.fp, rec.aid, rec.rdig = hexed(rec.fp), hexed(rec.aid), hexed(rec.rdig)
    st.legacy = true
    local ttl = redis.call('PTTL', st.key)
    if ttl >= 0 then st.rexp = now + ttl end
    if st.log_key then
      -- The newest LOG_MAX entries (layout.LOG_MAX): the HASH layout allowed longer logs, and
      -- a value holding more would not decode again.
      for _, entry in ipairs(redis.call('LRANGE', st.log_key, -LOG_MAX, -1)) do
        local e = r.split(entry)
        if e then e[1] = hexed(e[1]) end
        st.new[#st.new + 1] = e
      end
      ttl = redis.call('PTTL', st.log_key)
      if ttl >= 0 then st.lexp = now + ttl end
    end
    return rec
  end

  -- The attempt log as 'aid|gen|action|verdict|detail|at' strings, oldest first (the attempts
  -- script, and the rules that look for an earlier entry).
  function r.log_entries(st)
    local log = {}
    if st.drop < st.nold then
      local t, i = st.t, st.logpos + 6 * st.drop
      local aid, gen, at = entry_at(st, st.drop + 1)
      for _ = st.drop + 1, st.nold do
        if i > st.logpos + 6 * st.drop then
          if t[i] ~= nil then aid = t[i] end
          if t[i + 1] ~= nil then gen = unnum(t[i + 1]) end
          at = at + t[i + 5]
        end
        log[#log + 1] = table.concat({unhexed(aid), gen, unword(t[i + 2]) or '',
          unword(t[i + 3]) or '', unword(t[i + 4]) or '', int(at)}, '|')
        i = i + 6
      end
    end
    for _, e in ipairs(st.new) do
      local at = e[6]
      if type(at) == 'number' then at = int(at) end
      log[#log + 1] = table.concat({unhexed(e[1]), e[2], e[3], e[4], e[5], at}, '|')
    end
    return log
  end

  -- The quarantine's helpers (SPEC 3). A shard's quarantine is a STREAM of entries, a HASH of
  -- resolutions (entry id -> resolution JSON) and a HASH of identities (identity -> entry id)
  -- that keeps a rejected response delivered again to one entry. An entry's identity is the
  -- SHA-1 of everything the caller presented: the same attempt, action, payload digest, reason,
  -- tuple and expected version. Entries leave only with their resolution and their identity.

  -- Each field is length-prefixed ('<len>:<value>'): an operation id or a binding may hold any
  -- separator, and two different tuples must never share an identity.
  function r.identity(f)
    local parts = {}
    for i, v in ipairs({f.aid or '', f.action or '', f.pdig or '', f.reason or '', f.gen or '',
        f.fp or '', f.fpv or '', f.bind or '', f.op or '', f.ev or ''}) do
      parts[i] = #v .. ':' .. v
    end
    return redis.sha1hex(table.concat(parts))
  end

  function r.entry_fields(flat)
    local f = {}
    for i = 1, #flat, 2 do f[flat[i]] = flat[i + 1] end
    return f
  end

  -- Delete one stream entry {id, fields} with its resolution and its identity; returns whether
  -- it had been resolved.
  function r.drop_entry(stream, resolutions, seen, entry)
    local ident = r.identity(r.entry_fields(entry[2]))
    if redis.call('HGET', seen, ident) == entry[1] then redis.call('HDEL', seen, ident) end
    redis.call('XDEL', stream, entry[1])
    return redis.call('HDEL', resolutions, entry[1]) == 1
  end

  RARE = r
  return r
end

-- Returns (record table, positional row, st); (nil, nil, st) when there is no live record;
-- (false) when the key holds something that is not a settle value (another type, a string
-- of another format, fields missing). st carries the attempt log (see scan_log; as strings
-- from rare().log_entries()) and what save() needs; log_key is the previous layout's attempt log
-- (nil for readers of the record only). With lazy, the packed log is left unchecked for
-- load_log() when the caller writes. blob, when given, is what redis.pcall('GET', key) gave
-- the script's head (HEAD_BLOB, see prelude.lua), so the key is not read twice.
local function load_record(key, log_key, now, lazy, blob)
  local st = {key = key, log_key = log_key, nold = 0, drop = 0, new = {}}
  if blob == nil then blob = redis.pcall('GET', key) end
  local rec
  if type(blob) == 'table' then
    if redis.call('TYPE', key)['ok'] ~= 'hash' then return false end
    rec = rare().load_legacy(st, now)
    if not rec then return false end
  elseif blob then
    st.nold = nil
    if not pcall(unpack_value, st, blob) then return false end
    if st.lexp and st.lexp <= now then
      st.nold, st.lexp = 0, nil
    elseif not lazy and not load_log(st) then
      return false
    end
    rec = st.stored
    if rec then
      if not valid(rec) then return false end
      rec.op = string.sub(key, string.find(key, '}:op:', 1, true) + 5)
      if st.rexp and st.rexp <= now then rec = nil end
    end
  end
  st.rec = rec
  if not rec then return nil, nil, st end
  local row = {}
  for i = 1, #FIELDS do row[i] = rec[FIELDS[i]] or false end
  local t = st.t
  if t then
    -- a packed value's numbers as unpack_value checked them (exact, the sums too), so that
    -- replied() has none to make a number again; one stored as decimal text stays text
    row[3], row[5], row[6], row[8], row[9] = t[2], t[4], t[5], t[7], t[8]
    row[10] = t[8] + t[9]
    if t[10] ~= nil then row[11] = row[10] + t[10] end
  end
  return rec, row, st
end

-- Write field/value pairs to the record's table and its positional row (save() stores
-- them); a value of false deletes the field. Returns the row (what the record now holds, in
-- FIELDS order).
local function write(st, rec, row, pairs_)
  -- FIELDS reversed, made only by the scripts that write (tests/unit/test_lua_sources.py).
  local INDEX = {op = 1, fp = 2, fpv = 3, bind = 4, gen = 5, ver = 6, state = 7, n = 8,
    created = 9, updated = 10, lease = 11, aid = 12, reason = 13, result = 14, rdig = 15}
  for i = 1, #pairs_, 2 do
    local f, v = pairs_[i], pairs_[i + 1]
    if v == false then rec[f] = nil else rec[f] = v end
    row[INDEX[f]] = v
  end
  st.rec = rec
  return row
end

-- The row as the scripts reply it: its numbers (fpv gen ver n created updated lease) as Lua
-- numbers, which Redis replies as integers (a head's rows hold them so: _head.lua).
-- load_record puts a packed value's numbers in the row as they are (each exact: unpack_value
-- checked them); the rest are text the rules keep (a record of the previous layout is all
-- text, and write() gives int()'s text), each decimal() (valid, unint) or made by int() from
-- a whole number, so tonumber gives the very integer the text spells, below 2^53, and
-- Redis's conversion of the number (a cast to a 64-bit integer) replies it exactly. Only a
-- new record's fpv is the caller's text as sent: it is replied as a number only where it is
-- decimal(), as text otherwise (the client refuses text where an integer is due, as it
-- refused what int() could not read). Changes row in place (every caller replies it and is
-- done with it).
local function replied(row)
  local v = row[3]
  if type(v) == 'string' and decimal(v) then row[3] = tonumber(v) end
  for i = 5, 11 do
    v = row[i]
    if i ~= 7 and type(v) == 'string' then row[i] = tonumber(v) end
  end
  return row
end

-- cmsgpack.pack of values i..j of t (nil included), in parts the Lua stack holds: the
-- packing of several values is the concatenation of their packings. cmsgpack.pack checks
-- room for as many values again as it is given, under the C stack's limit of 8000 slots:
-- 3000 at a time fits. (A whole value is unpacked at once, so a log of at most 1000
-- entries, 6 values each: SettleConfig.attempt_log_size.)
local function pack_range(t, i, j)
  if i <= j and j - i < 3000 then return cmsgpack.pack(unpack(t, i, j)) end
  local parts = {}
  while i <= j do
    local k = math.min(j, i + 2999)
    parts[#parts + 1] = cmsgpack.pack(unpack(t, i, k))
    i = k + 1
  end
  return table.concat(parts)
end

-- Store st (its live record and attempt log) as one packed value that expires with the
-- later of the two; a value written before this layout leaves with its old attempt log.
local function save(st, now)
  local rec, v, aid, gen, at = st.rec, nil, NOAID, '', 0
  local expires = 0
  if rec then
    v = {rec.fp, num(rec.fpv), rec.bind, num(rec.gen), num(rec.ver), word(rec.state),
      num(rec.n), num(rec.created), rel(rec.updated, rec.created), rel(rec.lease, rec.updated),
      rec.aid, word(rec.reason), rec.result, rec.rdig, rel(st.rexp, rec.updated)}
    aid, gen, at = rec.aid or NOAID, rec.gen, tonumber(rec.created)
    expires = st.rexp or 0
  else
    v = {}
  end
  local n = rec and 16 or 2
  local kept, new = st.nold - st.drop, st.new
  if kept + #new > 0 then
    v[n] = rel(st.lexp, rec and rec.created or '0')
    -- A log without an expiry of its own (renew observes nothing) lives with the record.
    if st.lexp then expires = math.max(expires, st.lexp) end
  end
  local parts = {MAGIC, pack_range(v, 1, n)}
  -- Entries are encoded against the previous one (the first against the record): aid in the
  -- form hexed gives its text (a crafted value may hold another: {'abcd'} for the bytes
  -- 'abcd' spell), so aids compare as their texts do; gen as text, at a number.
  local e = {}
  aid = canonical(aid)
  local function encode(a, g, action, verdict, detail, when)
    e[1], e[2] = nil, nil
    a = canonical(a)
    if not same(a, aid) then e[1] = a end
    if g ~= gen then e[2] = num(g) end
    e[3], e[4], e[5], e[6] = word(action), word(verdict), word(detail), when - at
    parts[#parts + 1] = cmsgpack.pack(unpack(e, 1, 6))
    aid, gen, at = a, g, when
  end
  if kept > 0 then
    local t, j = st.t, st.drop + 1
    local i = st.logpos + 6 * st.drop
    local a, g, when = entry_at(st, j)
    encode(a, g, unword(t[i + 2]) or '', unword(t[i + 3]) or '', unword(t[i + 4]) or '', when)
    if kept > 1 then
      parts[#parts + 1] = pack_range(t, i + 6, t.n)
      aid, gen, at = canonical(st.last[1]), st.last[2], st.last[3]
    end
  end
  for _, x in ipairs(new) do encode(x[1], x[2], x[3], x[4], x[5], tonumber(x[6])) end
  local blob = table.concat(parts)
  if rec and not st.rexp then
    redis.call('SET', st.key, blob)
  else
    redis.call('SET', st.key, blob, 'PX', int(expires - now))
  end
  if st.legacy and st.log_key then redis.call('DEL', st.log_key) end
end
-- A pending record whose lease has passed reads as provisional (lease_expired).
local function effective_state(rec, now)
  -- rule: L1
  if rec.state == 'pending' and tonumber(rec.lease) <= now then
    return 'provisional'
  end
  return rec.state
end

local function is_terminal(state)
  return state == 'completed' or state == 'failed'
end

-- Append one observation to the operation's capped attempt log (save() stores it). The log
-- expires with the record: ttl is the record's remaining time to live when the caller knows
-- it, else nil (then the record's own: -2 when there is none). aid is in its stored form.
local function observe(st, cap, retention, ttl, aid, gen, action, verdict, detail, now)
  local new = st.new
  new[#new + 1] = {aid, gen, action, verdict, detail, now}
  local over = st.nold - st.drop + #new - tonumber(cap)
  while over > 0 and st.drop < st.nold do st.drop, over = st.drop + 1, over - 1 end
  while over > 0 and #new > 0 do table.remove(new, 1); over = over - 1 end
  if ttl == nil then
    ttl = -2
    if st.rec then ttl = st.rexp and st.rexp - now or -1 end
  end
  if ttl < retention then ttl = retention end
  st.lexp = now + ttl
end

-- The shard-count guard (SPEC 4), run before any write. A shard's state carries the shard
-- count it was claimed for, so a client configured with another count never writes, also
-- after the namespace metadata was lost and re-created. A shard whose state is missing
-- (never used, or lost: a restart without persistence, FLUSHALL, eviction) is claimed only
-- by a call that says the client has just checked the namespace metadata (claim flag '1');
-- otherwise the script answers 'unclaimed' and writes nothing, and the client checks the
-- metadata and calls again. A state key of another type answers 'corrupt_state' naming it
-- (something else wrote it; settle never overwrites what it cannot read).
-- Returns nil when the caller may write, else the reply to return. With hold (a call that
-- may yet refuse an argument, see arg_refused), a claim is not written: guard returns nil,
-- true and the caller claims (HSET of its 'shards', as here) just before its first write,
-- so a refused call writes nothing; one that writes nothing else claims nothing.
local function guard(hold)
  local key, shards, claim = KEYS[#KEYS], ARGV[#ARGV - 1], ARGV[#ARGV]
  local stored = redis.pcall('HGET', key, 'shards')
  if type(stored) == 'table' then return {'corrupt_state', key, now_ms(), '', {}} end
  if not stored then
    if claim ~= '1' then return {'unclaimed', '', now_ms(), '', {}} end
    if hold then return nil, true end
    redis.call('HSET', key, 'shards', shards)
  elseif stored ~= shards then
    return {'shard_mismatch', stored, now_ms(), '', {}}
  end
  return nil
end

-- Arguments settle's client never sends, but a call made by hand may: the scripts refuse
-- one they would use with an error reply naming it, before they write anything (a command
-- failing later, such as a SET with an expiry Redis refuses, would leave the call's earlier
-- writes in place: Redis does not undo them). arg_refused returns nil for an argument the
-- script can use, else the error's text (the caller answers redis.error_reply(text) where
-- it would use it, and holds guard()'s claim until then). form 'ms': a number of
-- milliseconds (in any text tonumber reads) of at least 1 and below 2^bits: 52 for a lease,
-- whose end must stay an exact integer; 62 for a retention, so that every expiry fits
-- Redis's 64-bit integers. 'number': any number (an attempt log cap: observe() compares
-- with it). 'count': a whole number of at least 1 (a quarantine maxlen, a scan budget, a
-- read's max matches: XRANGE counts). Any other form is the text of what the argument must be, for a check the
-- caller made itself. One function, not one per form: on Redis 6.2 every EVALSHA makes each
-- of _lib.lua's functions again.
local function arg_refused(script, i, what, form, bits)
  local x = tonumber(ARGV[i] or '')
  local must = form
  if form == 'ms' then
    if x and x >= 1 and x < 2 ^ bits then return nil end
    must = 'a number of milliseconds of at least 1 and below 2^' .. bits
  elseif form == 'number' then
    if x then return nil end
    must = 'a number'
  elseif form == 'count' then
    if x and x >= 1 and x % 1 == 0 then return nil end
    must = 'a whole number of at least 1'
  end
  return 'ERR settle: ' .. script .. ': ' .. what .. ' (ARGV[' .. i .. ']) must be ' .. must
end

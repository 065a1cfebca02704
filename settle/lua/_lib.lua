-- _lib.lua: the core's helpers, shared by every core script. settle prepends the runtime's
-- prelude (settle/_runtime/lua/prelude.lua: clock, now_ms, int, reply) and then this file
-- to each script body when it loads them; it is never run on its own.
--
-- A record and its attempt log are ONE packed STRING at the record key (docs/concepts.md,
-- "The record in Redis"; settle/_core/layout.py is the same format in Python):
--   MAGIC, then the record's tokens (or one absent token when only the log is left):
--     fp fpv bind gen ver state n created updated lease aid reason result rdig rexp
--   (updated is stored relative to created; lease and rexp, the record's own expiry in
--   ms, relative to updated), then lexp (the log's expiry, relative to the record's
--   created, or absolute without a record) and the attempt log's entries, six tokens
--   each: aid gen action verdict detail at (aid and gen absent when equal to the previous
--   entry's, the first entry's previous being the record's aid, gen and created; at
--   relative to the previous entry's).
-- A token is a LEB128 header h and its bytes: h = 0 absent, 4i word i of WORDS, 4n+1 n
-- bytes of text, 4n+2 / 4n+3 a lowercase hex string of 2n / 2n-1 digits packed into n
-- bytes (digests, attempt ids and the integers, which are all hex digits). The key expires
-- with the later of its two parts; a part whose own expiry has passed reads as absent.
-- As the scripts see it, a record has the fields:
--   op fp fpv bind gen ver state n created updated   (always; op is read from the key)
--   lease aid                                         (pending: lease end in ms, attempt id)
--   reason                                            (provisional)
--   result rdig                                       (completed / failed: bytes, digest)
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
local MAGIC = '\1'
-- The words stored as one byte; append only (layout.py WORDS is the same list).
local WORDS = {'pending', 'provisional', 'completed', 'failed', 'reserve', 'complete', 'fail',
  'mark_provisional', 'reserved', 'accepted', 'absorbed', 'quarantined', 'new',
  'lease_expired', 'resumed', 'unknown_operation', 'misbound', 'stale_generation',
  'version_conflict', 'conflicting_settlement'}

local function varint(n)
  if n < 128 then return string.char(n) end
  local out = {}
  while n >= 128 do
    out[#out + 1] = string.char(n % 128 + 128)
    n = math.floor(n / 128)
  end
  out[#out + 1] = string.char(n)
  return table.concat(out)
end

-- Hex digits <-> bytes, four bytes at a time with the struct library (a Lua loop per byte
-- would cost several microseconds per digest). HEX[n] = {struct format, string.format
-- format} for n bytes.
local HEX = {}
local function hexfmt(n)
  local f = HEX[n]
  if not f then
    local q, r = math.floor(n / 4), n % 4
    f = {'>' .. string.rep('I4', q), string.rep('%08x', q)}
    if r > 0 then f = {f[1] .. 'I' .. r, f[2] .. '%0' .. (2 * r) .. 'x'} end
    HEX[n] = f
  end
  return f
end

local function unhex(v)  -- an even number of lowercase hex digits
  local nums = {}
  for i = 1, #v, 8 do nums[#nums + 1] = tonumber(string.sub(v, i, i + 7), 16) end
  return struct.pack(hexfmt(#v / 2)[1], unpack(nums))
end

-- One value as a token; plain values (the result) are never packed.
local WORD = nil  -- word -> index, built by the first tok() of a call
local function tok(v, plain)
  if v == nil or v == false then return '\0' end
  if not plain then
    if not WORD then
      WORD = {}
      for i, w in ipairs(WORDS) do WORD[w] = i end
    end
    local w = WORD[v]
    if w then return varint(w * 4) end
    if #v > 0 and not string.find(v, '[^0-9a-f]') then
      local odd = #v % 2
      if odd == 1 then v = '0' .. v end
      return varint(#v / 2 * 4 + 2 + odd) .. unhex(v)
    end
  end
  return varint(#v * 4 + 1) .. v
end

-- The token at pos: (value or nil, next pos). Raises on a malformed value.
local function untok(s, pos)
  local h = string.byte(s, pos)
  if h == nil then error('truncated') end
  pos = pos + 1
  if h >= 128 then  -- a header of more than one byte (texts and hex of 32 bytes or more)
    local mul, b = 128, h
    h = h - 128
    repeat
      b = string.byte(s, pos)
      if b == nil then error('truncated') end
      pos = pos + 1
      h = h + (b % 128) * mul
      mul = mul * 128
    until b < 128
  end
  if h == 0 then return nil, pos end
  local kind = h % 4
  local n = (h - kind) / 4
  if kind == 0 then
    local w = WORDS[n]
    if w == nil then error('word') end
    return w, pos
  end
  local raw = string.sub(s, pos, pos + n - 1)
  if #raw ~= n then error('truncated') end
  pos = pos + n
  if kind == 1 then return raw, pos end
  local f = hexfmt(n)
  local hex = string.format(f[2], struct.unpack(f[1], raw))
  if kind == 3 then hex = string.sub(hex, 2) end
  return hex, pos
end

-- Integers stored relative to another field: rel() reads, delta() writes.
local function rel(v, base)
  if v == nil then return nil end
  return int(assert(tonumber(base)) + assert(tonumber(v)))
end

local function delta(v, base)
  if v == nil or v == false then return nil end
  return int(tonumber(v) - tonumber(base))
end

local PACKED = {'fp', 'fpv', 'bind', 'gen', 'ver', 'state', 'n', 'created', 'updated', 'lease',
  'aid', 'reason', 'result', 'rdig'}
local RELATIVE = {updated = true, lease = true}

local function split(entry)
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

-- Decode a packed value into st: st.stored (the record as stored, live or not), st.rexp,
-- st.log and st.lexp (absolute ms), and the tokens as read (st.toks, st.vals: field ->
-- token, value; st.etoks: an entry in its context -> its tokens), which save() writes back
-- unchanged instead of encoding again. Raises on anything malformed.
local function unpack_value(st, blob)
  if string.sub(blob, 1, 1) ~= MAGIC then error('magic') end
  local v, pos = untok(blob, 2)
  local rec = nil
  st.etoks = {}
  if v ~= nil then
    rec = {fp = v}
    local toks, vals = {fp = string.sub(blob, 2, pos - 1)}, {fp = v}
    for i = 2, #PACKED do
      local f, from = PACKED[i], pos
      rec[f], pos = untok(blob, pos)
      toks[f], vals[f] = string.sub(blob, from, pos - 1), rec[f]
    end
    st.toks, st.vals = toks, vals
    rec.updated = rel(rec.updated, rec.created)
    rec.lease = rel(rec.lease, rec.updated)
    v, pos = untok(blob, pos)
    if v ~= nil then st.rexp = tonumber(rel(v, rec.updated)) end
  end
  local lexp
  lexp, pos = untok(blob, pos)
  if lexp ~= nil then st.lexp = tonumber(rel(lexp, rec and rec.created or '0')) end
  st.stored, st.blob, st.logpos = rec, blob, pos
end

-- Decode the attempt log of st's packed value (st.log), once; readers of the record alone
-- never pay for it. Raises on anything malformed.
local function decode_log(st)
  local blob, pos, rec = st.blob, st.logpos, st.stored
  local aid, gen, at = '', '', '0'
  if rec then aid, gen, at = rec.aid or '', rec.gen, rec.created end
  local log = {}
  while pos <= #blob do
    local e, from, context = {}, pos, table.concat({aid, gen, at}, '|')
    for i = 1, 6 do e[i], pos = untok(blob, pos) end
    aid, gen, at = e[1] or aid, e[2] or gen, rel(e[6], at)
    log[#log + 1] = table.concat({aid, gen, e[3] or '', e[4] or '', e[5] or '', at}, '|')
    st.etoks[context .. '#' .. log[#log]] = string.sub(blob, from, pos - 1)
  end
  st.log = log
end

-- Make st.log available: false when the packed log does not decode (nothing may be written).
local function load_log(st)
  if st.log == nil and not pcall(decode_log, st) then return false end
  return true
end

local function valid(rec)
  for i = 2, REQUIRED do
    if rec[FIELDS[i]] == nil then return false end
  end
  if not STATES[rec.state] or tonumber(rec.gen) == nil or tonumber(rec.ver) == nil then
    return false
  end
  return rec.state ~= 'pending' or tonumber(rec.lease or '') ~= nil
end

-- A record in the layout before this one: a HASH, and its attempt log a LIST at log_key.
local function load_legacy(st, now)
  local row = redis.call('HMGET', st.key, unpack(FIELDS))
  local rec = {}
  for i = 1, #FIELDS do rec[FIELDS[i]] = row[i] or nil end
  if not row[1] or not valid(rec) then return false end
  st.legacy = true
  local ttl = redis.call('PTTL', st.key)
  if ttl >= 0 then st.rexp = now + ttl end
  st.log = {}
  if st.log_key then
    st.log = redis.call('LRANGE', st.log_key, 0, -1)
    ttl = redis.call('PTTL', st.log_key)
    if ttl >= 0 then st.lexp = now + ttl end
  end
  return rec
end

-- Returns (record table, positional row, st); (nil, nil, st) when there is no live record;
-- (false) when the key holds something that is not a settle value (another type, a string
-- of another format, fields missing). st carries the attempt log (st.log) and what save()
-- needs; log_key is the previous layout's attempt log (nil for readers of the record only).
-- With lazy, st.log is left nil for load_log() to decode when the caller needs it.
local function load_record(key, log_key, now, lazy)
  local st = {key = key, log_key = log_key, log = {}}
  local blob = redis.pcall('GET', key)
  local rec
  if type(blob) == 'table' then
    if redis.call('TYPE', key)['ok'] ~= 'hash' then return false end
    rec = load_legacy(st, now)
    if not rec then return false end
  elseif blob then
    st.log = nil
    if not pcall(unpack_value, st, blob) then return false end
    if st.lexp and st.lexp <= now then
      st.log, st.lexp = {}, nil
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
  return rec, row, st
end

-- Write field/value pairs to the record's table and its positional row (save() stores
-- them); a value of false deletes the field. Returns the row (what the record now holds, in
-- FIELDS order).
local function write(st, rec, row, pairs_)
  local INDEX = {}  -- built only by the scripts that write
  for i, f in ipairs(FIELDS) do INDEX[f] = i end
  for i = 1, #pairs_, 2 do
    local f, v = pairs_[i], pairs_[i + 1]
    if v == false then rec[f] = nil else rec[f] = v end
    row[INDEX[f]] = v
  end
  st.rec = rec
  return row
end

-- Store st (its live record and attempt log) as one packed value that expires with the
-- later of the two; a value written before this layout leaves with its old attempt log.
local function save(st, now)
  local out, rec = {MAGIC}, st.rec
  local toks, vals, etoks = st.toks or {}, st.vals or {}, st.etoks or {}
  local aid, gen, at = '', '', '0'
  local expires = 0
  if rec then
    local stored = {}
    for i, f in ipairs(PACKED) do stored[i] = rec[f] end
    stored[9] = delta(rec.updated, rec.created)
    stored[10] = delta(rec.lease, rec.updated)
    for i, f in ipairs(PACKED) do
      local v = stored[i]
      if toks[f] and not RELATIVE[f] and vals[f] == v then
        out[#out + 1] = toks[f]
      else
        out[#out + 1] = tok(v, f == 'result')
      end
    end
    out[#out + 1] = tok(delta(st.rexp, rec.updated))
    aid, gen, at = rec.aid or '', rec.gen, rec.created
    expires = st.rexp or 0
  else
    out[#out + 1] = '\0'
  end
  local log = st.log
  if #log > 0 then
    out[#out + 1] = tok(delta(st.lexp, rec and rec.created or '0'))
    expires = math.max(expires, st.lexp)
  else
    out[#out + 1] = '\0'
  end
  for _, entry in ipairs(log) do
    local e = split(entry)
    local known = etoks[table.concat({aid, gen, at}, '|') .. '#' .. entry]
    if known then
      out[#out + 1] = known
    else
      out[#out + 1] = e[1] == aid and '\0' or tok(e[1])
      out[#out + 1] = e[2] == gen and '\0' or tok(e[2])
      for i = 3, 5 do out[#out + 1] = tok(e[i]) end
      out[#out + 1] = tok(delta(e[6], at))
    end
    aid, gen, at = e[1], e[2], e[6]
  end
  if rec and not st.rexp then
    redis.call('SET', st.key, table.concat(out))
  else
    redis.call('SET', st.key, table.concat(out), 'PX', int(expires - now))
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
-- it, else nil (then the record's own: -2 when there is none).
local function observe(st, cap, retention, ttl, aid, gen, action, verdict, detail, now)
  local log = st.log
  log[#log + 1] = table.concat({aid, gen, action, verdict, detail, int(now)}, '|')
  while #log > tonumber(cap) do table.remove(log, 1) end
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
-- metadata and calls again. Returns nil when the caller may write, else the reply to return.
local function guard()
  local key, shards, claim = KEYS[#KEYS], ARGV[#ARGV - 1], ARGV[#ARGV]
  local stored = redis.call('HGET', key, 'shards')
  if not stored then
    if claim ~= '1' then return {'unclaimed', '', now_ms(), '', {}} end
    redis.call('HSET', key, 'shards', shards)
  elseif stored ~= shards then
    return {'shard_mismatch', stored, now_ms(), '', {}}
  end
  return nil
end

-- The next fencing generation of a shard: a hybrid logical clock, max(last + 1, server time
-- in microseconds). Strictly increasing while the state lives; after the state was lost
-- (restart without persistence, FLUSHALL, eviction, a failover that lost the latest writes)
-- it restarts from the server clock, above every generation issued before, as long as the
-- server clock did not step back and generations were issued no faster than one per
-- microsecond (docs/concepts.md, "Generations"). Below 2^53 until the year 2255.
local function next_generation(key, now_us)
  local last = tonumber(redis.call('HGET', key, 'gen') or '0') or 0
  local gen = math.max(last + 1, now_us)
  redis.call('HSET', key, 'gen', int(gen))
  return int(gen)
end

-- The quarantine's helpers (SPEC 3). A shard's quarantine is a STREAM of entries, a HASH of
-- resolutions (entry id -> resolution JSON) and a HASH of identities (identity -> entry id)
-- that keeps a rejected response delivered again to one entry. An entry's identity is the
-- SHA-1 of everything the caller presented: the same attempt, action, payload digest, reason,
-- tuple and expected version. Entries leave only with their resolution and their identity.

-- Each field is length-prefixed ('<len>:<value>'): an operation id or a binding may hold any
-- separator, and two different tuples must never share an identity.
local function identity(f)
  local parts = {}
  for i, v in ipairs({f.aid or '', f.action or '', f.pdig or '', f.reason or '', f.gen or '',
      f.fp or '', f.fpv or '', f.bind or '', f.op or '', f.ev or ''}) do
    parts[i] = #v .. ':' .. v
  end
  return redis.sha1hex(table.concat(parts))
end

local function entry_fields(flat)
  local f = {}
  for i = 1, #flat, 2 do f[flat[i]] = flat[i + 1] end
  return f
end

-- Delete one stream entry {id, fields} with its resolution and its identity; returns whether
-- it had been resolved.
local function drop_entry(stream, resolutions, seen, entry)
  local ident = identity(entry_fields(entry[2]))
  if redis.call('HGET', seen, ident) == entry[1] then redis.call('HDEL', seen, ident) end
  redis.call('XDEL', stream, entry[1])
  return redis.call('HDEL', resolutions, entry[1]) == 1
end

-- _lib.lua: the core's helpers, shared by every core script. settle prepends the runtime's
-- prelude (settle/_runtime/lua/prelude.lua: clock, now_ms, int, reply) and then this file
-- to each script body when it loads them; it is never run on its own.
--
-- A record is a HASH with the fields:
--   op fp fpv bind gen ver state n created updated   (always)
--   lease aid                                         (pending: lease end in ms, attempt id)
--   reason                                            (provisional)
--   result rdig                                       (completed / failed: bytes, digest)
-- The attempt log is a LIST of 'aid|gen|action|verdict|detail|at' strings, oldest first.
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

-- Returns (record table, positional list); (nil, nil) when missing; (false, nil) when the
-- key holds something that is not a settle record (another type, or fields missing).
local function load_record(key)
  local row = redis.pcall('HMGET', key, unpack(FIELDS))
  if row['err'] then return false, nil end
  if not row[1] then
    if redis.call('EXISTS', key) == 1 then return false, nil end
    return nil, nil
  end
  local rec = {}
  for i = 1, #FIELDS do
    if row[i] then rec[FIELDS[i]] = row[i] elseif i <= REQUIRED then return false, nil end
  end
  if not STATES[rec.state] or tonumber(rec.gen) == nil or tonumber(rec.ver) == nil then
    return false, nil
  end
  if rec.state == 'pending' and tonumber(rec.lease or '') == nil then return false, nil end
  return rec, row
end

-- Write field/value pairs to the record hash, its table and its positional row; a value of
-- false deletes the field. Returns the row (what the record now holds, in FIELDS order).
local function write(key, rec, row, pairs_)
  local INDEX = {}  -- built only by the scripts that write
  for i, f in ipairs(FIELDS) do INDEX[f] = i end
  local set, del = {}, {}
  for i = 1, #pairs_, 2 do
    local f, v = pairs_[i], pairs_[i + 1]
    if v == false then
      if rec[f] ~= nil then table.insert(del, f) end
      rec[f] = nil
    else
      table.insert(set, f); table.insert(set, v)
      rec[f] = v
    end
    row[INDEX[f]] = v
  end
  if #del > 0 then redis.call('HDEL', key, unpack(del)) end
  redis.call('HSET', key, unpack(set))
  return row
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

-- Append one observation to the operation's capped attempt log. The log expires with the
-- record: ttl is the record's remaining time to live when the caller knows it, else nil.
local function observe(log_key, record_key, cap, retention, ttl, aid, gen, action, verdict, detail, now)
  local n = redis.call('RPUSH', log_key,
    table.concat({aid, gen, action, verdict, detail, int(now)}, '|'))
  if n > tonumber(cap) then redis.call('LTRIM', log_key, -tonumber(cap), -1) end
  if ttl == nil then ttl = redis.call('PTTL', record_key) end
  if ttl < retention then ttl = retention end
  redis.call('PEXPIRE', log_key, ttl)
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

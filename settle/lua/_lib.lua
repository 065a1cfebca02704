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

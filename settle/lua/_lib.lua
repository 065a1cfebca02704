-- _lib.lua: helpers shared by every settle script. settle prepends this file to each
-- script body when it loads them; it is never run on its own.
--
-- A record is a HASH with the fields:
--   op fp fpv bind gen ver state n created updated   (always)
--   lease aid                                         (pending: lease end in ms, attempt id)
--   reason                                            (provisional)
--   result rdig                                       (completed / failed: bytes, digest)
-- Every script returns {code, detail, now_ms, quarantine_id, payload}; payload is the
-- record as a flat field/value list, or a list of entries for the read scripts.

redis.replicate_commands()

local REQUIRED = {'op', 'fp', 'fpv', 'bind', 'gen', 'ver', 'state', 'n', 'created', 'updated'}
local STATES = {pending = true, provisional = true, completed = true, failed = true}

-- The server clock: milliseconds, and microseconds (orders quarantine entries across shards).
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

local function now_ms()
  local ms = clock()
  return ms
end

local function int(x)
  return string.format('%d', x)
end

-- Returns (record table, flat list); (nil, nil) when missing; (false, nil) when the key
-- holds something that is not a settle record.
local function load_record(key)
  local kind = redis.call('TYPE', key)
  kind = kind['ok'] or kind
  if kind == 'none' then return nil, nil end
  if kind ~= 'hash' then return false, nil end
  local flat = redis.call('HGETALL', key)
  local rec = {}
  for i = 1, #flat, 2 do rec[flat[i]] = flat[i + 1] end
  for _, f in ipairs(REQUIRED) do
    if rec[f] == nil then return false, nil end
  end
  if not STATES[rec.state] or tonumber(rec.gen) == nil or tonumber(rec.ver) == nil then
    return false, nil
  end
  if rec.state == 'pending' and tonumber(rec.lease or '') == nil then return false, nil end
  return rec, flat
end

local function flat_of(key)
  return redis.call('HGETALL', key)
end

-- A pending record whose lease has passed reads as provisional (lease_expired).
local function effective_state(rec, now)
  if rec.state == 'pending' and tonumber(rec.lease) <= now then
    return 'provisional'
  end
  return rec.state
end

local function is_terminal(state)
  return state == 'completed' or state == 'failed'
end

-- Append one observation to the operation's capped attempt log, kept as long as the record.
local function observe(log_key, record_key, cap, retention, aid, gen, action, verdict, detail, now)
  redis.call('XADD', log_key, 'MAXLEN', cap, '*',
    'aid', aid, 'gen', gen, 'action', action, 'verdict', verdict, 'detail', detail, 'at', int(now))
  local ttl = redis.call('PTTL', record_key)
  if ttl < retention then ttl = retention end
  redis.call('PEXPIRE', log_key, ttl)
end

-- _lib.lua: helpers shared by every cursor script; settle.cursor prepends the runtime's
-- prelude (settle/_runtime/lua/prelude.lua: clock, now_ms, int, reply) and then this file to
-- each script when it loads them (it never runs on its own).
--
-- Every script gets the same five keys, all under the stream's hash tag
-- settle:{<namespace>:cursor:<stream>}, so each call touches one slot (Redis Cluster safe):
--   KEYS[1] checkpoint HASH  stream cursor cdig gen bound created updated waid [rgen]
--                            [pruned]
--   KEYS[2] witnesses HASH   '<aid>|<attr>' for attr in WITNESS_ATTRS
--   KEYS[3] witness index    ZSET member aid, score generation
--   KEYS[4] receipts HASH    event id -> 'pos digest gen aid outcome at_ms'
--   KEYS[5] receipt index    ZSET member event id, score position
-- Every script returns {code, detail, now_ms, checkpoint (flat field/value list), extra}.

local WITNESS_ATTRS = {'gen', 'input', 'cdig', 'events', 'succ', 'sdig', 'snap', 'cov',
  'class', 'nbound', 'disp', 'reason', 'created', 'updated'}

-- Whether v is an integer as settle writes one (no sign but '-', no leading zeros, below
-- 2^53): the scripts compare generations as text, so '01' would never match 1 (the
-- client's _canonical_int in _core.py is the same test).
local function canonical_int(v)
  return type(v) == 'string' and (string.find(v, '^%-?[1-9]%d*$') ~= nil or v == '0')
    and exact(tonumber(v))
end

-- (table, flat) for the checkpoint; (nil, {}) when absent; (false, {}) when not a checkpoint.
local function load_ckpt(key)
  local kind = redis.call('TYPE', key)
  kind = kind['ok'] or kind
  if kind == 'none' then return nil, {} end
  if kind ~= 'hash' then return false, {} end
  local flat = redis.call('HGETALL', key)
  local c = {}
  for i = 1, #flat, 2 do c[flat[i]] = flat[i + 1] end
  if c.cursor == nil or not canonical_int(c.gen) or not canonical_int(c.bound)
      or (c.pruned ~= nil and not canonical_int(c.pruned)) then
    return false, {}
  end
  return c, flat
end

local function wget(key, aid, attr)
  return redis.call('HGET', key, aid .. '|' .. attr)
end

local function wset(key, aid, attr, value)
  redis.call('HSET', key, aid .. '|' .. attr, value)
end

-- The witness as a flat list starting with 'aid', aid; {} when it does not exist.
local function witness_flat(key, aid)
  local fields = {}
  for i, a in ipairs(WITNESS_ATTRS) do fields[i] = aid .. '|' .. a end
  local values = redis.call('HMGET', key, unpack(fields))
  if not values[1] then return {} end
  local flat = {'aid', aid}
  for i, a in ipairs(WITNESS_ATTRS) do
    flat[#flat + 1] = a
    flat[#flat + 1] = values[i] or ''
  end
  return flat
end

local function witness_delete(key, index, aid)
  for _, a in ipairs(WITNESS_ATTRS) do redis.call('HDEL', key, aid .. '|' .. a) end
  redis.call('ZREM', index, aid)
end

-- 'pos digest gen aid outcome at' -> table
local function parse_receipt(value)
  local p = {}
  for part in string.gmatch(value, '%S+') do p[#p + 1] = part end
  return {pos = tonumber(p[1]), digest = p[2], gen = p[3], aid = p[4], outcome = p[5]}
end

-- _head.lua: the read fast path of get.lua and reserve.lua (their *_head.lua files). settle
-- assembles a script with a head as: the runtime's prelude, this file, the head, then the
-- core's libraries and the script's own file (settle._runtime.scripts). So on Redis 6.2,
-- where every EVALSHA defines every helper of _lib.lua again, a read that the head answers
-- defines none of them; as a FUNCTION (Redis 7+, Valkey) the head runs first in the callback.
--
-- A head answers only when it is certain that the whole script would give the very same
-- reply and write nothing: a packed value (see _lib.lua) whose record it checked field by
-- field as unpack_value and valid do. On anything else (no value, the previous layout, a
-- record expired, a field in a form it does not check, a fingerprint or binding that does
-- not match, an unclaimed shard) it answers nil and the whole script runs as before.
-- tests/integration/test_read_heads.py holds both paths' replies equal.

-- A whole number a double holds exactly (what settle stores as an integer): int() writes
-- it as _lib.lua's unnum does. A sum of them is checked with whole() again where
-- unpack_value's unrel_int checks it (updated, the lease end); the record's expiry is a sum
-- unrel makes through text, the same number below 2^63.
local function whole(x)
  return type(x) == 'number' and exact(x)
end

local function optional(x, kind)
  return x == nil or type(x) == kind
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
-- _lib.lua's FIELDS order) and its state's word index, or nil when the head is not certain
-- (see above).
local function head_record(key, blob, now)
  local t = head_values(pcall(cmsgpack.unpack, string.sub(blob, 2)))
  if not t then return nil end
  -- fp fpv bind gen ver state n created updated lease aid reason result rdig rexp lexp
  if t.n < 16 or (t.n - 16) % 6 ~= 0 then return nil end
  local state = t[6]
  if not (type(t[1]) == 'string' and whole(t[2]) and type(t[3]) == 'string' and whole(t[4])
      and whole(t[5]) and whole(state) and state >= 1 and state <= 4 and whole(t[7])
      and whole(t[8]) and whole(t[9]) and (t[10] == nil or whole(t[10]))
      and optional(t[11], 'string') and optional(t[12], 'string') and optional(t[13], 'string')
      and optional(t[14], 'string') and (t[15] == nil or whole(t[15]))
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
  local op = string.sub(key, string.find(key, '}:op:', 1, true) + 5)
  return {op, t[1], int(t[2]), t[3], int(t[4]), int(t[5]),
    HEAD_STATES[state], int(t[7]), int(t[8]),
    int(updated), lease, t[11] or false, t[12] or false, t[13] or false, t[14] or false}, state
end

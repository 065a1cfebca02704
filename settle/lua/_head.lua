-- _head.lua: the fast paths of get.lua, reserve.lua, complete.lua, fail.lua,
-- mark_provisional.lua and renew.lua (their *_head.lua files) and what they share: this
-- file (what every head reads with), _head_write.lua (the write heads' checks and the attempt
-- log; the replay's shard check), _head_gen.lua (the generations reserve issues) and
-- _head_settle.lua (the settlements' head). settle assembles a script with a head as: the
-- runtime's prelude, the head files its head uses (settle/_core/scripts.py, head_uses),
-- the head, then the core's libraries and the script's own file (settle._runtime.scripts).
-- So on Redis 6.2, where every EVALSHA defines every helper it holds again, a call that
-- the head answers defines none of _lib.lua's, and only the head helpers its head calls; as
-- a FUNCTION (Redis 7+, Valkey) every head file is defined once, at load, and the head runs
-- first in the callback.
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
  if t[10] ~= nil then lease = updated + t[10] end
  local at = string.find(key, '}:op:', 1, true)
  if not at then return nil end  -- not a record's key: guard() or load_record() answers
  -- the row's numbers as Lua numbers, which Redis replies as integers: each whole() above
  -- (an exact integer below 2^53), so the integer is the number (see replied, _lib.lua)
  return {string.sub(key, at + 5), t[1], t[2], t[3], t[4], t[5],
    HEAD_STATES[state], t[7], t[8],
    updated, lease, t[11] or false, t[12] or false, t[13] or false, t[14] or false},
    state, t
end

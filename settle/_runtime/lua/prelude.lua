-- prelude.lua: the helpers every settle script needs, whichever part it belongs to (the
-- core, settle.cursor, settle.progress). settle._runtime.scripts prepends it to each script,
-- before the part's own libraries; it is never run on its own.
--
-- Every script answers in one shape: {code, detail, now_ms, ...body} (see reply below);
-- settle._runtime.calls.parse_reply splits it and each part decodes its own body.
--
-- No redis.replicate_commands(): since Redis 5 scripts replicate by their effects by
-- default (Redis 7 has no other mode), and settle needs 6.2+; reading TIME before a write is
-- therefore safe, and every replica applies the same writes.

-- What a script's head read for the script behind it (a head: settle._runtime.scripts): the
-- value at its first key as redis.pcall('GET') gave it, and the clock it read (ms, µs), so
-- the script reads neither again. nil at the start of every call (a FUNCTION library's
-- callback clears them); nil in a script without a head, or where the head read nothing.
local HEAD_BLOB, HEAD_NOW, HEAD_US

-- The server clock: milliseconds, and microseconds (a quarantine entry's time: it orders the
-- entries of different shards with the same stream id, and a live follow's).
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

local function now_ms()
  local ms = clock()
  return ms
end

-- Whether the number x is an integer a double holds exactly: what settle stores as one
-- (every part's checks of a stored integer use it).
local function exact(x)
  return x % 1 == 0 and x > -9007199254740992 and x < 9007199254740992
end

-- An integer as Redis wants it in a command or a reply (no exponent, no fraction). A digit
-- (a record's version, attempt count, fingerprint version: most of a reply's numbers) is
-- made by string.char, about half of string.format's cost; the same text.
local function int(x)
  if x < 10 and x >= 0 then return string.char(48 + x) end
  return string.format('%d', x)
end

-- An integer as settle writes it in text: decimal digits (and a sign), at most 20
-- characters, of a magnitude a double holds exactly (tonumber alone would take '1e3', '0x10'
-- or 'inf'; the reference model's _is_int is the same test). The core checks a record's
-- integer fields and a shard's last generation with it.
local function decimal(v)
  return type(v) == 'string' and #v <= 20 and string.find(v, '^%-?%d+$') ~= nil
    and exact(tonumber(v))
end

-- The one reply shape: code, detail, the server time in ms, then the part's body.
local function reply(code, detail, now, ...)
  return {code, detail, now, ...}
end

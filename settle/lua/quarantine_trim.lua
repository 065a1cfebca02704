-- quarantine_trim.lua: explicit quarantine retention (SPEC 3). Deletes the shard's resolved
-- entries in an id range, with their resolutions and identities; unresolved evidence only
-- when the caller says so. Examines at most a budget of entries per call.
-- KEYS[1] quarantine stream  KEYS[2] resolutions hash  KEYS[3] identities hash
-- KEYS[4] the last trim's reply (a STRING: token, then the reply)  KEYS[5] shard state (see
-- _lib.lua)
-- ARGV[1] lowest id ('-', or '(' id to resume past it)
-- ARGV[2] minimum age in ms on the server clock ('' for any age)
-- ARGV[3] '1': unresolved entries too  ARGV[4] scan budget  ARGV[5] the call's token
-- ARGV[6] shard count  ARGV[7] claim flag
-- Returns {more | done, last, now, '', {removed, of which unresolved}}: done when the range
-- is exhausted; last is the id of the last entry examined ('' if none).
-- A call repeated with its token (its reply was lost: settle sends it again as it was) gets
-- the first run's reply back, kept a day in KEYS[4]: the repeat finds the entries that run
-- deleted gone, and counted nothing, so a trim reported fewer deletions than it made.
-- An age, budget or lowest id it cannot use is refused with an error reply (see arg_refused
-- in _lib.lua) before anything is written: the claim waits for the first XRANGE, which checks
-- the lowest id; an age reaching back before the epoch leaves nothing old enough.
local refused, held = guard(true)
if refused then return refused end
local now = now_ms()
local token = ARGV[5]
if token ~= '' then
  -- A key of another type there holds no reply of ours: read as none, and the SET below
  -- replaces it (a WRONGTYPE would fail every trim of the shard while the key stays).
  local kept = redis.pcall('GET', KEYS[4])
  if type(kept) == 'string' and string.sub(kept, 1, #token + 1) == token .. '|' then
    local code, last, removed, unresolved =
      string.match(string.sub(kept, #token + 2), '^([^|]*)|([^|]*)|(%d+)|(%d+)$')
    if code then return {code, last, now, '', {tonumber(removed), tonumber(unresolved)}} end
  end
end
-- The reply, kept for a repeat of this call (see above) before it is returned.
local function answer(code, last, removed, unresolved)
  if token ~= '' then
    redis.call('SET', KEYS[4], table.concat({token, code, last, removed, unresolved}, '|'),
      'PX', 86400000)
  end
  return {code, last, now, '', {removed, unresolved}}
end
local low, high = ARGV[1], '+'
local bad = arg_refused('quarantine_trim', 4, 'scan budget', 'count')
if bad then return redis.error_reply(bad) end
if ARGV[2] ~= '' then
  local age = tonumber(ARGV[2] or '')
  if not (age and age >= 0 and age < math.huge) then
    return redis.error_reply(arg_refused('quarantine_trim', 2, 'minimum age',
      "'' or a finite number of milliseconds of at least 0"))
  end
  high = '0-0'  -- no entry has that id (XADD refuses it): none is that old
  if now - age >= 1 then high = '(' .. int(now - age) .. '-0' end
end
local everything = ARGV[3] == '1'
local budget = tonumber(ARGV[4])
local examined, removed, unresolved, last = 0, 0, 0, ''
while examined < budget do
  local want = math.min(256, budget - examined)
  local entries = redis.pcall('XRANGE', KEYS[1], low, high, 'COUNT', want)
  if entries.err then  -- only the first can fail: the later ones start after an entry's id
    if string.sub(entries.err, 1, 9) == 'WRONGTYPE' then return entries end  -- not the id's
    return redis.error_reply(arg_refused('quarantine_trim', 1, 'lowest id',
      "'-' or a stream id, after '(' to resume past it: " .. entries.err))
  end
  if held then redis.call('HSET', KEYS[#KEYS], 'shards', ARGV[#ARGV - 1]); held = nil end
  for _, entry in ipairs(entries) do
    examined = examined + 1
    last = entry[1]
    low = '(' .. entry[1]
    if everything or redis.call('HEXISTS', KEYS[2], entry[1]) == 1 then
      if not rare().drop_entry(KEYS[1], KEYS[2], KEYS[3], entry) then
        unresolved = unresolved + 1
      end
      removed = removed + 1
    end
  end
  if #entries < want then return answer('done', last, removed, unresolved) end
end
return answer('more', last, removed, unresolved)

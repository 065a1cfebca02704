-- quarantine_read.lua: read one shard's quarantine stream with the filters applied here,
-- so a filtered listing does not ship every entry to the client.
-- KEYS[1] quarantine stream  KEYS[2] resolutions hash (entry id -> resolution JSON), or absent:
-- every entry then reads as unresolved and ARGV[7] filters nothing; the caller reads the
-- resolutions apart (a Redis Cluster slot whose keys are split by a migration: a node runs a
-- script only if it holds all of its keys, and one key it follows after ASK).
-- ARGV[1] lowest id ('-' or '(' id for exclusive)  ARGV[2] highest id ('+' or '(' id)
-- ARGV[3] max matches  ARGV[4] scan budget (entries examined in this call)
-- ARGV[5] kind ('' any)  ARGV[6] operation id ('' any)  ARGV[7] '1': unresolved only
-- ARGV[8] '1': newest first  ARGV[9] '1': headers only, '0' or absent: whole entries
-- ARGV[10] since, ARGV[11] until: a window by each entry's own time in ms (its field us over
-- 1000, as settle shows it, else at, else the id's millisecond), both ends included; '' or
-- absent: open. An
-- entry's at can be before its id's time (a stream whose last id ran ahead of the clock):
-- the caller reads ids past until, and the entries there outside the window are examined
-- but neither matched nor sent.
-- Returns {more | done, last, now, '', matches}: done when the range is exhausted; last is the
-- id of the last entry examined ('' if none); a match is {id, {field, value, ...}, resolution
-- JSON or ''}. A header is {id, {field, value, ...} of the fields kind, at and us only (as
-- stored, in their order), '1' if resolved else ''}: what a count by kind, time and status
-- needs, without the payload (up to quarantine_payload_bytes an entry) or anything else.
-- A max matches or scan budget that is not a whole number of at least 1, or a headers flag of
-- another form, is refused with an error reply (see arg_refused in _lib.lua): a count of 0 or
-- below (or nan) answered 'more' with nothing examined and no id to resume after, 1.5
-- matches read 2, a budget of 1.5 failed inside XRANGE, and a non-number failed comparing
-- with nil.
local bad = arg_refused('quarantine_read', 3, 'max matches', 'count')
  or arg_refused('quarantine_read', 4, 'scan budget', 'count')
if bad then return redis.error_reply(bad) end
local headers = ARGV[9] == '1'
if not (headers or ARGV[9] == nil or ARGV[9] == '0') then
  return redis.error_reply(arg_refused('quarantine_read', 9, 'headers flag',
    "'1' (headers only) or '0' (whole entries)"))
end
local window = {}
for i = 10, 11 do
  if ARGV[i] ~= nil and ARGV[i] ~= '' then
    local x = tonumber(ARGV[i])
    if not x or x ~= x then
      return redis.error_reply(arg_refused('quarantine_read', i, i == 10 and 'since' or 'until',
        "a number of milliseconds, or '' (open)"))
    end
    window[i] = x
  end
end
local since_at, until_at = window[10], window[11]
local now = now_ms()
local limit, budget = tonumber(ARGV[3]), tonumber(ARGV[4])
local low, high = ARGV[1], ARGV[2]
local newest_first = ARGV[8] == '1'
local out, examined, last, exhausted = {}, 0, '', false
while #out < limit and examined < budget do
  local want = math.min(256, budget - examined)
  local entries
  if newest_first then
    entries = redis.call('XREVRANGE', KEYS[1], high, low, 'COUNT', want)
  else
    entries = redis.call('XRANGE', KEYS[1], low, high, 'COUNT', want)
  end
  local used = 0
  for _, e in ipairs(entries) do
    used = used + 1
    examined = examined + 1
    last = e[1]
    if newest_first then high = '(' .. e[1] else low = '(' .. e[1] end
    local f = {}
    for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end
    local res = KEYS[2] and redis.call('HGET', KEYS[2], e[1]) or ''
    local t = (since_at or until_at) and tonumber(f.us)
    if t then t = math.floor(t / 1000)
    elseif since_at or until_at then t = tonumber(f.at) or tonumber(string.match(e[1], '^%d+')) end
    if (ARGV[5] == '' or f.kind == ARGV[5]) and (ARGV[6] == '' or f.op == ARGV[6])
        and (ARGV[7] ~= '1' or res == '')
        and (not since_at or t >= since_at) and (not until_at or t <= until_at) then
      if headers then
        local h = {}
        for i = 1, #e[2], 2 do
          local name = e[2][i]
          if name == 'kind' or name == 'at' or name == 'us' then
            h[#h + 1] = name
            h[#h + 1] = e[2][i + 1]
          end
        end
        table.insert(out, {e[1], h, res ~= '' and '1' or ''})
      else
        table.insert(out, {e[1], e[2], res})
      end
      if #out >= limit then break end
    end
  end
  if #entries < want and used == #entries then exhausted = true; break end
end
if exhausted then return {'done', last, now, '', out} end
return {'more', last, now, '', out}

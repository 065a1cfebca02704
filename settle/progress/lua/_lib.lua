-- _lib.lua: helpers shared by the progress scripts; settle.progress prepends the runtime's
-- prelude (settle/_runtime/lua/prelude.lua: clock, now_ms, int, reply) and then this file to
-- each progress script when it loads them.
--
-- Every progress script of one (consumer, scope) takes the same KEYS, all under the
-- consumer's hash tag {<namespace>:progress:<consumer>} (one slot, so Cluster-safe):
--   KEYS[1] meta       HASH  floor, replay, pf_last, pf_oldest, pf_pending, pf_at, ver, updated
--   KEYS[2] applied    HASH  delivery id -> emission id   (exact applied deliveries above floor)
--   KEYS[3] resolved   HASH  delivery id -> emission id   (dead-lettered deliveries above floor)
--   KEYS[4] gaps       HASH  delivery id -> first seen ms (known unapplied ids below an applied one)
--   KEYS[5] intents    HASH  delivery id -> JSON {kind, emission, at}   (the settle-intent log)
--   KEYS[6] deferred   HASH  delivery id -> JSON {emission, reason, at}
--   KEYS[7] dead       STREAM dead-letter evidence (never trimmed by settle)
--   KEYS[8] receipts   STREAM settlement receipts (what the provider said), capped
--   KEYS[9] scopes     HASH  scope id -> JSON scope (the consumer's scope index)
--   KEYS[10] emission  HASH  state (applying | applied), scope, delivery, attempt, attempts, at
-- Every script returns the runtime's one shape with this body (progress_reply below):
-- {code, detail, now_ms, meta, applied, resolved, gaps, intents, deferred}
-- (the last six as flat field/value lists, gaps as a list of ids).

-- Digit strings without leading zeros compare by length, then lexically (no float rounding).
local function num_lt(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

-- A delivery id as settle writes one: <ms>-<seq>, decimal without leading zeros (num_lt
-- compares such digits by length); nil for anything else.
local function parse_id(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if not ms or (#ms > 1 and string.byte(ms, 1) == 48)
      or (#seq > 1 and string.byte(seq, 1) == 48) then
    return nil
  end
  return ms, seq
end

-- a < b for stream entry ids <ms>-<seq>
local function id_lt(a, b)
  local am, as = parse_id(a)
  local bm, bs = parse_id(b)
  if am ~= bm then return num_lt(am, bm) end
  return num_lt(as, bs)
end

-- What settle never writes in the (consumer, scope)'s keys or the emission's, found before
-- a script writes anything (a script that fails after a write keeps that write): the
-- reason, or nil. The client raises CorruptRecord on the 'corrupt' reply. Every script
-- checks what it reads (the floor, the version, the emission); with scan_ids (observe,
-- whose advance() compares every applied, resolved and gap id) the ids too.
local function stored_corrupt(scan_ids)
  local meta = redis.call('HMGET', KEYS[1], 'floor', 'ver')
  if meta[1] and meta[1] ~= '' and not parse_id(meta[1]) then return 'floor' end
  if meta[2] and not string.find(meta[2], '^%d+$') then return 'version' end
  if scan_ids then
    for _, k in ipairs({KEYS[2], KEYS[3], KEYS[4]}) do
      for _, id in ipairs(redis.call('HKEYS', k)) do
        if not parse_id(id) then return 'delivery id' end
      end
    end
  end
  local em = redis.call('HMGET', KEYS[10], 'state', 'attempts')
  if em[1] and em[1] ~= 'applying' and em[1] ~= 'applied' then return 'emission state' end
  if em[2] and not string.find(em[2], '^%d+$') then return 'emission attempts' end
  return nil
end

local function floor_of()
  local f = redis.call('HGET', KEYS[1], 'floor')
  if not f or f == '' then return '0-0' end
  return f
end

-- 'floor' | 'applied' | 'dead_lettered' | nil. With `emission`, a delivery applied or
-- dead-lettered as ANOTHER emission (or as an unknown one, '') is not covered: the provider handed out one id twice
-- (explicit ids, a stream deleted and made again, a failover that lost the tail), and the
-- emission now at that id was never applied (its own emission state still says so). At or
-- below the floor the emission is no longer kept, and the floor covers it.
local function coverage(delivery, emission)
  if not id_lt(floor_of(), delivery) then return 'floor' end
  local applied = redis.call('HGET', KEYS[2], delivery)
  if applied and (emission == nil or applied == emission) then return 'applied' end
  local dead = redis.call('HGET', KEYS[3], delivery)
  if dead and (emission == nil or dead == emission) then return 'dead_lettered' end
  return nil
end

local function touch(scope_id, scope_json, now)
  redis.call('HSETNX', KEYS[9], scope_id, scope_json)
  redis.call('HINCRBY', KEYS[1], 'ver', 1)
  redis.call('HSET', KEYS[1], 'updated', int(now))
end

local function intent(delivery, kind, emission, now)
  redis.call('HSET', KEYS[5], delivery,
    cjson.encode({kind = kind, emission = emission, at = now}))
end

local function progress_reply(code, detail)
  return reply(code, detail, now_ms(),
    redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]),
    redis.call('HGETALL', KEYS[3]), redis.call('HKEYS', KEYS[4]),
    redis.call('HGETALL', KEYS[5]), redis.call('HGETALL', KEYS[6]))
end

-- Whether the floor may pass `id`: applied or dead-lettered, and not deferred (a deferred
-- delivery at an id recorded for another emission, handed out again, is not resolved).
local function resolved(id)
  return (redis.call('HEXISTS', KEYS[2], id) == 1 or redis.call('HEXISTS', KEYS[3], id) == 1)
    and redis.call('HEXISTS', KEYS[6], id) == 0
end

-- Advance the cumulative floor along a provider listing: the ids that exist after `after`,
-- ascending and contiguous (XRANGE (after + COUNT n). The floor moves over listed ids that
-- are applied or dead-lettered and stops at the first one that is not; such an id below
-- the highest applied one is recorded as a gap. `holds` names the group's pending ids
-- (comma-separated, then ';' and the last of them when the pending listing was cut, ''
-- for none): a pending delivery the listing does not show (its entry was deleted while it
-- was pending: XDEL, MAXLEN) is not resolved until it is dead-lettered or applied, so the
-- floor stops below the first pending id progress has not resolved, and never passes the
-- cut. Returns 'advanced', 'unchanged' or 'unproven' (the listing starts above the floor,
-- so it proves nothing about the prefix).
local function advance(after, ids, now, holds)
  local floor = floor_of()
  if id_lt(floor, after) then return 'unproven' end
  local top = nil
  for _, k in ipairs({KEYS[2], KEYS[3]}) do
    for _, id in ipairs(redis.call('HKEYS', k)) do
      if top == nil or id_lt(top, id) then top = id end
    end
  end
  local list, cut = string.match(holds or '', '^([^;]*);?(.*)$')
  local hold = nil
  for p in string.gmatch(list, '[^,]+') do
    if not resolved(p) and id_lt(floor, p) and (hold == nil or id_lt(p, hold)) then hold = p end
  end
  if hold ~= nil and top ~= nil and id_lt(hold, top) then
    redis.call('HSETNX', KEYS[4], hold, int(now))
  end
  if cut == '' then cut = nil end
  local cur = floor
  local blocked = false
  for _, id in ipairs(ids) do
    if (hold ~= nil and not id_lt(id, hold)) or (cut ~= nil and id_lt(cut, id)) then
      blocked = true
    end
    if id_lt(floor, id) then
      if resolved(id) then
        if not blocked then cur = id end
      else
        blocked = true
        if top ~= nil and id_lt(id, top) then redis.call('HSETNX', KEYS[4], id, int(now)) end
      end
    end
  end
  if cur == floor then return 'unchanged' end
  for _, k in ipairs({KEYS[2], KEYS[3], KEYS[4]}) do
    for _, id in ipairs(redis.call('HKEYS', k)) do
      if not id_lt(cur, id) then redis.call('HDEL', k, id) end
    end
  end
  redis.call('HSET', KEYS[1], 'floor', cur, 'replay', cur)
  return 'advanced'
end

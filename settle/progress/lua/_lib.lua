-- _lib.lua: helpers shared by the progress scripts; settle.progress prepends the runtime's
-- prelude (settle/_runtime/lua/prelude.lua: clock, now_ms, int, reply) and then this file to
-- each progress script when it loads them.
--
-- Every progress script of one (consumer, scope) takes the same KEYS, all under the
-- consumer's hash tag {<namespace>:progress:<consumer>} (one slot, so Cluster-safe):
--   KEYS[1] meta       HASH  floor, replay, pf_last, pf_oldest, pf_pending, pf_at, ver, updated,
--                            claimed (ms: when the scope's state was created; see unclaimed())
--   KEYS[2] applied    HASH  delivery id -> emission id   (exact applied deliveries above floor)
--   KEYS[3] resolved   HASH  delivery id -> emission id   (dead-lettered deliveries above floor)
--   KEYS[4] gaps       HASH  delivery id -> first seen ms (known unapplied ids below an applied one)
--   KEYS[5] intents    HASH  delivery id -> JSON {kind, emission, reason, at}   (the settle-intent
--                            log; reason: a dead_letter's or a defer's, absent in older intents)
--   KEYS[6] deferred   HASH  delivery id -> JSON {emission, reason, at}
--   KEYS[7] dead       STREAM dead-letter evidence (never trimmed by settle)
--   KEYS[8] receipts   STREAM settlement receipts (what the provider said), capped
--   KEYS[9] scopes     HASH  scope id -> JSON scope (the consumer's scope index)
--   KEYS[10] emission  HASH  state (applying | applied), scope, delivery, attempt, attempts, at
--   KEYS[11] holds     ZSET  the ids of KEYS[4] and KEYS[6] (gaps and deferrals: unresolved),
--                            each as hold_member(id), all at score 0, so ZRANGEBYLEX gives the
--                            smallest; and the member 'built' (it sorts after every id): the
--                            index holds every gap and deferral (see holds_index())
-- Every writing script's ARGV starts ARGV[1] scope id, ARGV[2] scope JSON, ARGV[3] the claim
-- flag: '1' when the caller may create the scope's state (the store's own calls, or a stream
-- consumer that has just checked on the stream's server that this incarnation never had a
-- delivery of its group acknowledged), '' otherwise. A scope's state exists once its meta
-- (KEYS[1]) does. A writing script on a scope with no state and no flag writes nothing and
-- answers 'unclaimed' (claimed() below): the state is new, or the progress server lost it
-- (a restart without persistence, FLUSHALL, a DEL), and only the caller can tell which.
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

-- Whether the scope has no state and the call may not create it (the script then answers
-- 'unclaimed' and writes nothing). With the flag, the scope's state is created now: its
-- meta records when it was claimed, at version 0.
local function unclaimed(flag, now)
  if redis.call('EXISTS', KEYS[1]) == 1 then return false end
  if flag ~= '1' then return true end
  redis.call('HSET', KEYS[1], 'claimed', int(now), 'ver', 0)
  return false
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
-- below the floor the emission is no longer kept, and the floor covers it, unless it is
-- still deferred: the floor never passes a deferral (advance()), but an earlier settle let
-- it pass one whose entry was trimmed; still unapplied, it is not covered, so applying
-- (or dead-lettering) it does what it would have done above the floor.
local function coverage(delivery, emission)
  if not id_lt(floor_of(), delivery) then
    if redis.call('HEXISTS', KEYS[6], delivery) == 1 then return nil end
    return 'floor'
  end
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

-- `reason`: a dead_letter's or a defer's (the stream-side dead-letter entry of a dead_letter
-- intent carried out by recover() names it); nil for an ack.
local function intent(delivery, kind, emission, now, reason)
  redis.call('HSET', KEYS[5], delivery,
    cjson.encode({kind = kind, emission = emission, reason = reason, at = now}))
end

-- A delivery id as a member of the holds index: both parts zero-padded to 20 digits (a part
-- is at most 2^64 - 1), so the members' lexical order is the ids' order.
local function hold_member(id)
  local ms, seq = parse_id(id)
  return string.rep('0', 20 - #ms) .. ms .. '-' .. string.rep('0', 20 - #seq) .. seq
end

-- Hold the floor below `id`, a gap or a deferral, until it is resolved (unhold()).
local function add_hold(id)
  redis.call('ZADD', KEYS[11], 0, hold_member(id))
end

-- Record `id` as a gap first seen `now`, holding the floor; 1 when it was not one yet.
local function gap(id, now)
  add_hold(id)
  return redis.call('HSETNX', KEYS[4], id, int(now))
end

-- `id` is applied or dead-lettered: no longer a gap or a deferral, and no longer held.
local function unhold(id)
  redis.call('HDEL', KEYS[4], id)
  redis.call('HDEL', KEYS[6], id)
  redis.call('ZREM', KEYS[11], hold_member(id))
end

-- Build the holds index of a scope written before settle kept one (or whose index was
-- deleted): every gap and deferral above the floor, then 'built'. Once, before the caller
-- writes anything else; the reason when a stored id is not one settle writes (nothing is
-- written then), else nil.
local function holds_index()
  if redis.call('ZSCORE', KEYS[11], 'built') then return nil end
  local floor = floor_of()
  local members = {}
  for _, k in ipairs({KEYS[4], KEYS[6]}) do
    for _, id in ipairs(redis.call('HKEYS', k)) do
      if not parse_id(id) then return 'delivery id' end
      if id_lt(floor, id) then members[#members + 1] = hold_member(id) end
    end
  end
  for _, m in ipairs(members) do redis.call('ZADD', KEYS[11], 0, m) end
  redis.call('ZADD', KEYS[11], 0, 'built')
  return nil
end

-- The smallest gap or deferral above `floor`, or nil, read from the holds index. A member
-- that names neither (removed by hand, or resolved by an older settle) is dropped: the gaps
-- and deferrals are the record, the index only finds their smallest.
local function first_hold(floor)
  local low = '(' .. hold_member(floor)
  while true do
    local m = redis.call('ZRANGEBYLEX', KEYS[11], low, '+', 'LIMIT', 0, 1)[1]
    if m == nil or m == 'built' then return nil end
    local ms, seq = string.match(m, '^0*(%d+)-0*(%d+)$')
    local id = ms and (ms .. '-' .. seq)
    if id and (redis.call('HEXISTS', KEYS[4], id) == 1
        or redis.call('HEXISTS', KEYS[6], id) == 1) then
      return id
    end
    redis.call('ZREM', KEYS[11], m)
  end
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
-- cut. Nor does it pass a recorded gap or deferral, listed or not: a deferral's entry was
-- acknowledged, and a lost one's is pending for nobody, so a trim or an XDEL removes them
-- like any settled entry (first_hold(): the smallest, from the holds index, which the
-- caller has built: holds_index()). Returns 'advanced', 'unchanged' or 'unproven' (the
-- listing starts above the floor, so it proves nothing about the prefix).
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
  if hold ~= nil and top ~= nil and id_lt(hold, top) then gap(hold, now) end
  local held = first_hold(floor)
  if held ~= nil and (hold == nil or id_lt(held, hold)) then hold = held end
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
        if top ~= nil and id_lt(id, top) then gap(id, now) end
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

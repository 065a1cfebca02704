-- _settle.lua: the settlement rules shared by complete.lua, fail.lua and mark_provisional.lua
-- (SPEC 2, settlement table). Prepended after _lib.lua; each of those scripts is one call.
-- KEYS[1] record (packed, see _lib.lua)   KEYS[2] the previous layout's attempt log
-- KEYS[3] quarantine stream
-- KEYS[4] quarantine resolutions hash  KEYS[5] quarantine identities hash
-- KEYS[6] shard state (see _lib.lua)
-- ARGV[1] operation id  ARGV[2] fingerprint  ARGV[3] fingerprint version  ARGV[4] binding
-- ARGV[5] generation    ARGV[6] expected version ('' for none)             ARGV[7] attempt id
-- ARGV[8] payload (result / failure bytes; '' for mark_provisional)        ARGV[9] its digest
-- ARGV[10] reason (mark_provisional)  ARGV[11] retention ms  ARGV[12] attempt log cap
-- ARGV[13] quarantine payload cap     ARGV[14] quarantine maxlen ('' for none)
-- ARGV[15] shard count  ARGV[16] claim flag
-- (the fingerprint, attempt id and digest in stored form: arg_stored in _lib.lua)
-- Returns {verdict, kind, now, quarantine id, record, dropped[, 1]}: verdict accepted |
-- absorbed | quarantined | corrupt (or unclaimed | shard_mismatch from guard, nothing
-- written); the record row is omitted when none exists or the tuple is misbound; dropped
-- counts the unresolved entries quarantine_maxlen pushed out of the stream to make room for
-- the entry (0 normally; a repeat answers the count its entry's write made); a trailing 1
-- says the quarantine id is an earlier entry's (the same rejected response delivered again:
-- nothing was appended).

local TERMINAL_OF = {complete = 'completed', fail = 'failed'}

-- The rules' rare paths, as rules().name (made only in a call that needs them: see rare()
-- in _lib.lua).
local RULES = nil
local function rules()
  if RULES then return RULES end
  local r = {}

  -- Whether the attempt log holds this attempt's accepted settlement with this action.
  function r.observed(log, aid, gen, action)
    local prefix = table.concat({aid, gen, action, 'accepted'}, '|') .. '|'
    for _, entry in ipairs(log) do
      if string.sub(entry, 1, #prefix) == prefix then return true end
    end
    return false
  end

  -- Make room for one entry in a stream of at most maxlen (the last resort of
  -- quarantine_maxlen): the oldest go with their resolutions and identities. Returns how
  -- many were unresolved.
  function r.cap_stream(maxlen)
    local over = redis.call('XLEN', KEYS[3]) + 1 - maxlen
    local unresolved = 0
    if over <= 0 then return 0 end
    for _, entry in ipairs(redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', over)) do
      if not rare().drop_entry(KEYS[3], KEYS[4], KEYS[5], entry) then
        unresolved = unresolved + 1
      end
    end
    return unresolved
  end

  -- Append the rejected response to the shard's quarantine stream, once: the same response
  -- delivered again gets the id of its first entry. Returns (entry id, unresolved dropped,
  -- 1 for that repeat: nil when the entry is new). An entry whose write pushed unresolved
  -- ones out holds their count ('dropped'), and a repeat answers it again: the repeat of a
  -- call whose reply was lost answered 0, and the deletion of evidence was never said.
  function r.quarantine(kind, action, rec, now, now_us)
    local payload = ARGV[8]
    local cap = tonumber(ARGV[13])
    local text = rare().arg_text
    local aid, pdig, fp = text(ARGV[7]), text(ARGV[9]), text(ARGV[2])
    local ident = rare().identity({aid = aid, action = action, pdig = pdig, reason = ARGV[10],
      gen = ARGV[5], fp = fp, fpv = ARGV[3], bind = ARGV[4], op = ARGV[1], ev = ARGV[6]})
    local known = redis.call('HGET', KEYS[5], ident)
    local found = known and redis.call('XRANGE', KEYS[3], known, known)[1]
    if found then
      return known, tonumber(rare().entry_fields(found[2]).dropped or '0') or 0, 1
    end
    local dropped = 0
    if ARGV[14] ~= '' then dropped = r.cap_stream(tonumber(ARGV[14])) end
    local fields = {'op', ARGV[1], 'kind', kind, 'action', action,
      'fp', fp, 'fpv', ARGV[3], 'bind', ARGV[4], 'gen', ARGV[5], 'ev', ARGV[6],
      'aid', aid, 'reason', ARGV[10],
      'payload', string.sub(payload, 1, cap), 'psize', int(#payload), 'pdig', pdig,
      'at', int(now), 'us', int(now_us)}
    if rec then
      table.insert(fields, 'cstate'); table.insert(fields, effective_state(rec, now))
      table.insert(fields, 'cgen'); table.insert(fields, rec.gen)
      table.insert(fields, 'cver'); table.insert(fields, rec.ver)
    end
    if dropped > 0 then
      table.insert(fields, 'dropped'); table.insert(fields, int(dropped))
    end
    local id = redis.call('XADD', KEYS[3], '*', unpack(fields))
    redis.call('HSET', KEYS[5], ident, id)
    return id, dropped
  end

  RULES = r
  return r
end

local function settle(action)
  -- Arguments it cannot use (see arg_refused in _lib.lua), refused before anything is
  -- written: the retention and the log cap, which every settlement that gets past the record
  -- uses, and the quarantine maxlen, which only a quarantined one does.
  local bad = arg_refused(action, 11, 'retention', 'ms', 62)
    or arg_refused(action, 12, 'log cap', 'number')
  local bad_maxlen = ARGV[14] ~= '' and arg_refused(action, 14, 'quarantine maxlen', 'count')
  local refused, held = guard(bad or bad_maxlen)
  if refused then return refused end
  -- What the script's head (head_settle in _head_settle.lua) read when it left the call to these
  -- rules.
  local now, now_us = HEAD_NOW, HEAD_US
  if not now then now, now_us = clock() end
  local rec, row, st = load_record(KEYS[1], KEYS[2], now, false, HEAD_BLOB)
  if rec == false then return {'corrupt', '', now, '', {}} end
  if bad then return redis.error_reply(bad) end
  local retention = tonumber(ARGV[11])
  local kind = nil
  local verdict = nil
  local ttl = nil
  local aid = arg_stored(ARGV[7])
  if not rec then
    kind = 'unknown_operation'  -- rule: S1
  elseif not same(rec.fp, arg_stored(ARGV[2])) or rec.fpv ~= ARGV[3] or rec.bind ~= ARGV[4] then
    kind = 'misbound'  -- rule: S2
  elseif rec.gen ~= ARGV[5] then
    local r = rare()
    if action == 'mark_provisional'
        and rules().observed(r.log_entries(st), r.arg_text(ARGV[7]), ARGV[5], action) then
      -- rule: S13
      -- The repeat of an accepted mark_provisional whose reply was lost, arriving after
      -- another attempt took over: it already counted, it is not a stale response.
      verdict = 'absorbed'
    else
      kind = 'stale_generation'  -- rule: S3
    end
  else
    local state = effective_state(rec, now)
    if is_terminal(state) then
      -- rule: S8, S10, S11
      -- A duplicate of the settlement that made the record terminal is absorbed, also when
      -- it carries the version it saw before that settlement; success is never downgraded.
      if action == 'mark_provisional'
          or (TERMINAL_OF[action] == state and same(rec.rdig, arg_stored(ARGV[9]))) then
        verdict = 'absorbed'
      elseif ARGV[6] ~= '' and ARGV[6] ~= rec.ver then
        kind = 'version_conflict'  -- rule: S4
      else
        kind = 'conflicting_settlement'  -- rule: S9
      end
    elseif action == 'mark_provisional' and rec.state == 'provisional'
        and rec.reason == ARGV[10] then
      -- rule: S12
      -- The same uncertainty reported again (a repeat after a lost reply): nothing to
      -- update, so it is absorbed, whatever version the repeat carries.
      verdict = 'absorbed'
    elseif ARGV[6] ~= '' and ARGV[6] ~= rec.ver then
      kind = 'version_conflict'  -- rule: S4
    else
      verdict = 'accepted'
      local ver = int(tonumber(rec.ver) + 1)
      if action == 'mark_provisional' then
        -- rule: S6, S7
        row = write(st, rec, row, {'state', 'provisional', 'reason', ARGV[10], 'ver', ver,
          'updated', int(now), 'lease', false})
      else
        -- rule: S5
        row = write(st, rec, row, {'state', TERMINAL_OF[action], 'result', ARGV[8],
          'rdig', arg_stored(ARGV[9]), 'ver', ver, 'updated', int(now), 'lease', false,
          'reason', false})
      end
      st.rexp = now + retention
      ttl = retention
    end
  end
  if kind and bad_maxlen then return redis.error_reply(bad_maxlen) end
  if held then  -- held for a maxlen this settlement does not use
    redis.call('HSET', KEYS[#KEYS], 'shards', ARGV[#ARGV - 1])
  end
  local qid, dropped, repeated = '', 0, nil
  if kind then
    verdict = 'quarantined'
    qid, dropped, repeated = rules().quarantine(kind, action, rec, now, now_us)
  end
  observe(st, ARGV[12], retention, ttl, aid, ARGV[5], action, verdict, kind or '', now)
  save(st, now)
  -- rule: S2 (a misbound caller gets no record: it would show one principal's result to another)
  if not rec or kind == 'misbound' then row = {} else row = replied(row) end
  if repeated then return {verdict, kind or '', now, qid, row, dropped, 1} end
  return {verdict, kind or '', now, qid, row, dropped}
end

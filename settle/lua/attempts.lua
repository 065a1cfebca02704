-- attempts.lua: read an operation's attempt log, oldest first (it lives in the record's
-- packed value, see _lib.lua; a record written before that layout keeps it in KEYS[2]).
-- KEYS[1] record  KEYS[2] the previous layout's attempt log
-- Returns {ok | corrupt, '', now, '', entries}; each entry is 'aid|gen|action|verdict|detail|at'.
local now = now_ms()
local rec, _, st = load_record(KEYS[1], KEYS[2], now)
if rec == false then return {'corrupt', '', now, '', {}} end
return {'ok', '', now, '', rare().log_entries(st)}

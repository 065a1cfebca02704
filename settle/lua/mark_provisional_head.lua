-- mark_provisional_head.lua: mark_provisional.lua's fast path (see _head_settle.lua, head_settle):
-- the accepted report of an uncertain outcome (rules S6, S7) by the attempt that holds the
-- operation, what a call that timed out sends before its retry. KEYS, ARGV and the reply are
-- _settle.lua's; when the head does not answer, mark_provisional.lua runs the rules.
local answer = head_settle(8, 2)  -- mark_provisional, provisional (WORDS in _lib.lua)
if answer then return answer end

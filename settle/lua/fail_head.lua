-- fail_head.lua: fail.lua's fast path (see _head_settle.lua, head_settle): the accepted failure of
-- the attempt that holds the operation. KEYS, ARGV and the reply are _settle.lua's; when
-- the head does not answer, fail.lua runs the rules.
local answer = head_settle(7, 4)  -- fail, failed (WORDS in _lib.lua)
if answer then return answer end

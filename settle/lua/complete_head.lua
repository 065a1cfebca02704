-- complete_head.lua: complete.lua's fast path (see _head_settle.lua, head_settle): the accepted
-- completion of the attempt that holds the operation. KEYS, ARGV and the reply are
-- _settle.lua's; when the head does not answer, complete.lua runs the rules.
local answer = head_settle(6, 3)  -- complete, completed (WORDS in _lib.lua)
if answer then return answer end

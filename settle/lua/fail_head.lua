-- fail_head.lua: fail.lua's fast path (see _head.lua, head_settle): the accepted failure of
-- the attempt that holds the operation.
local answer = head_settle(7, 4)  -- fail, failed (WORDS in _lib.lua)
if answer then return answer end

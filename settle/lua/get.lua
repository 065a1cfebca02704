-- get.lua: read a record with the server's clock, so every reader sees the same
-- effective state (an expired pending lease reads as provisional).
-- KEYS[1] record (packed, see _lib.lua)
-- Returns {found | missing | corrupt, '', now, '', record}.
local now = HEAD_NOW or now_ms()  -- HEAD_*: what get_head.lua read (see prelude.lua)
local rec, row = load_record(KEYS[1], nil, now, true, HEAD_BLOB)
if rec == false then return {'corrupt', '', now, '', {}} end
if not rec then return {'missing', '', now, '', {}} end
return {'found', '', now, '', replied(row)}

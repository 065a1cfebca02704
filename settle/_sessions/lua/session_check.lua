-- session_check.lua: a console session and its principal's current epoch, read in one round
-- trip for every request (settle/web/_security.py decides whether the session holds).
-- KEYS[1] the session: settle:{<ns>}:console:session:<SHA-256 of its id>, a JSON string
-- KEYS[2] the principals' epochs: settle:{<ns>}:console:epochs, a hash
-- Returns {} when there is no session; {session} when the session names no principal digest
-- ("pd") this script can read; else {session, epoch}, epoch '' when the principal has none
-- (never signed in, or the epoch was lost: every session of the principal is over).
local session = redis.call('GET', KEYS[1])
if not session then return {} end
local ok, value = pcall(cjson.decode, session)
if not ok or type(value) ~= 'table' or type(value.pd) ~= 'string' then return {session} end
return {session, redis.call('HGET', KEYS[2], value.pd) or ''}

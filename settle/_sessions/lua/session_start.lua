-- session_start.lua: start a console session under its principal's current epoch, making
-- one when the principal has none (the first sign-in, or the epoch was lost: every older
-- session of the principal stays over, as it never held this new epoch).
-- KEYS[1] the new session: settle:{<ns>}:console:session:<SHA-256 of its id>
-- KEYS[2] the principals' epochs: settle:{<ns>}:console:epochs, a hash
-- ARGV[1] the principal, ARGV[2] its SHA-256 (the field of KEYS[2]), ARGV[3] the SHA-256
-- of the session's CSRF token, ARGV[4] a new random epoch (32 hex digits), used when the
-- principal has none, ARGV[5] the session's max age in seconds
-- Returns {'started', epoch}, or {'garbled', ''} when the principal's epoch is not one
-- settle writes (then nothing was written). Repeated, it starts the same session again.
local epoch = redis.call('HGET', KEYS[2], ARGV[2])
if not epoch then
  epoch = ARGV[4]
  redis.call('HSET', KEYS[2], ARGV[2], epoch)
end
if #epoch ~= 32 or string.find(epoch, '[^0-9a-f]') then return {'garbled', ''} end
local session = cjson.encode({principal = ARGV[1], pd = ARGV[2], csrf = ARGV[3], epoch = epoch})
redis.call('SET', KEYS[1], session, 'EX', ARGV[5])
return {'started', epoch}

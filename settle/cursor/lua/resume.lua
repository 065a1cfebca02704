-- resume.lua: a worker resumes a pending witness (an exact replay of its response, SPEC 9).
-- The resume is the witness's progress: its `updated` becomes now, so a shorter copy of it
-- stands down while it is worked on (stand_down_for, docs/cursor-checkpoints.md), however
-- long it lay idle before.
-- KEYS[1..5] see _lib.lua
-- ARGV[1] attempt id (the witness)  ARGV[2] the generation the step read
-- Returns {code, '', now, checkpoint, {}}: resumed, or superseded (the checkpoint left that
-- generation, or the witness is gone or no longer pending: nothing written).
local now = now_ms()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
local aid = ARGV[1]
if c and c.gen == ARGV[2] and wget(KEYS[2], aid, 'gen') == ARGV[2]
    and wget(KEYS[2], aid, 'disp') == 'pending' then
  wset(KEYS[2], aid, 'updated', int(now))
  return {'resumed', '', now, flat, {}}
end
return {'superseded', '', now, flat, {}}

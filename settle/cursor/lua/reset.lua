-- reset.lua: recovery. Move a checkpoint to a cursor the operator vouches for (a stable
-- boundary or the start of a fresh snapshot), as a compare-and-swap on its generation.
-- KEYS[1..5] see _lib.lua
-- ARGV[1] expected generation  ARGV[2] cursor  ARGV[3] cursor digest  ARGV[4] boundary
-- ARGV[5] '1': accept a boundary below the checkpoint's 'pruned' (else '')
-- Returns {reset | stale | missing | corrupt, '', now, checkpoint, {}} (reset's detail: the
-- highest pruned position when ARGV[5] let the boundary below it, else ''), or {pruned,
-- <highest pruned position>, now, checkpoint, {}}: the boundary is below a position whose
-- receipt the receipt horizon pruned, so its event would be handed over again as new;
-- nothing written. Pending witnesses of the old generation are abandoned (reason
-- 'reset'); receipts are kept, so events delivered again are recognised and not applied
-- twice (those the receipt horizon kept: see 'pruned'). 'rgen' (the generation of the
-- last reset) bounds the cursors the checkpoint counts as passed: after a reset, a
-- provider may hand out the cursors of the positions it walks again.
local now = now_ms()
local c, flat = load_ckpt(KEYS[1])
if c == false then return {'corrupt', '', now, {}, {}} end
if not c then return {'missing', '', now, {}, {}} end
if c.gen ~= ARGV[1] then return {'stale', '', now, flat, {}} end
local again = ''
if c.pruned and tonumber(ARGV[4]) < tonumber(c.pruned) then
  if ARGV[5] ~= '1' then return {'pruned', c.pruned, now, flat, {}} end
  again = c.pruned
end
for _, aid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], c.gen, c.gen)) do
  if wget(KEYS[2], aid, 'disp') == 'pending' then
    wset(KEYS[2], aid, 'disp', 'abandoned')
    wset(KEYS[2], aid, 'reason', 'reset')
    wset(KEYS[2], aid, 'updated', int(now))
  end
end
redis.call('HSET', KEYS[1], 'cursor', ARGV[2], 'cdig', ARGV[3],
  'gen', int(tonumber(c.gen) + 1), 'bound', ARGV[4], 'updated', int(now), 'waid', '',
  'rgen', int(tonumber(c.gen) + 1))
local _, after = load_ckpt(KEYS[1])
return {'reset', again, now, after, {}}

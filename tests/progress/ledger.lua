-- ledger.lua (tests): the effect of one emission, counted on the progress server.
-- KEYS[1] effects HASH (emission -> times the effect took hold)
-- KEYS[2] done HASH (idempotency key -> 1)  KEYS[3] invocations HASH (emission -> calls)
-- ARGV[1] emission id  ARGV[2] idempotency key
-- The effect is idempotent under the key it is handed, as the docs ask of every effect;
-- `invocations` counts how often settle.progress ran it at all.
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
if redis.call('HSETNX', KEYS[2], ARGV[2], '1') == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  return 1
end
return 0

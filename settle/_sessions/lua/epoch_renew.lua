-- epoch_renew.lua: give a principal a new epoch, which ends every session it holds (the
-- sessions recorded the old one; settle/web/_security.py's end_sessions). A script rather
-- than an HSET so that, with min_replicas, it is followed by WAIT: a failover that lost the
-- new epoch would revive every session it ended.
-- KEYS[1] the principals' epochs: settle:{<ns>}:console:epochs, a hash
-- ARGV[1] the SHA-256 of the principal (the field), ARGV[2] a new random epoch (32 hex digits)
-- Returns {'renewed'}. Repeated (after a lost reply), another new epoch: as good.
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {'renewed'}

-- wait_probe.lua: the write that makes WAIT count everything a call read (settle._runtime:
-- the min_replicas path sends it after the call's script, before WAIT, on one connection).
--
-- WAIT waits for the replicas to hold its connection's last write. A script that wrote
-- nothing (a reserve that replays, an absorbed repeat) leaves that offset where it was on
-- Valkey and Redis 7.2+, so WAIT answered at once while the record the script read (another
-- client's write) was not on any replica yet. This write moves the connection's offset to
-- the server's, past every earlier write of every client.
--
-- KEYS[1]: settle:{<the call's hash tag>}:wait, one per tag (a namespace's shard, a cursor's
-- stream, a progress consumer), kept a week after its last use. PEXPIRE of the existing key
-- is a write that is allowed on a full server (it is not deny-oom); only the first probe of a
-- tag creates it.
-- ARGV[1] '1': sent behind ASKING to the importing node of a migrating slot, whose key may
-- still be on the migrating node: a missing one is written and deleted (two writes, no key),
-- so the two nodes never both hold it (a MIGRATE without REPLACE would fail with BUSYKEY).
if redis.call('PEXPIRE', KEYS[1], 604800000) == 0 then
  redis.call('SET', KEYS[1], '', 'PX', 604800000)
  if ARGV[1] == '1' then redis.call('DEL', KEYS[1]) end
end
return 1

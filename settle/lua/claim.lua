-- claim.lua: claim one shard for the namespace's shard count at start-up, right after the
-- namespace metadata was checked, so that the first write on each shard needs no second
-- round trip (see guard in _lib.lua). A shard already claimed for this count is left as it
-- is; one claimed for another count is refused, nothing written. With claim flag '0' it only
-- checks (a missing state answers 'unclaimed'): before missing metadata is created.
-- KEYS[1] the shard's state key (settle:{<ns>:<shard>}:gen)
-- ARGV[1] shard count  ARGV[2] claim flag ('1': the metadata was just checked)
-- Returns {ok | shard_mismatch | unclaimed | corrupt_state, stored shard count on a mismatch
-- (corrupt_state: the key; ok: 'claimed' when this call made the state, else ''), now, '',
-- {}}. A state made under metadata older than its creator's claims is a loss (engine.py).
-- HGET, as guard reads it (a user's ACL may refuse EXISTS): a state always holds 'shards'.
local had = redis.pcall('HGET', KEYS[1], 'shards')
local refused = guard()
if refused then return refused end
return {'ok', had and '' or 'claimed', now_ms(), '', {}}

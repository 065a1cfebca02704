-- session_end.lua: end one console session (a sign-out, or the session a new sign-in in the
-- same browser replaces); a script rather than a DEL so that, with min_replicas, it is
-- followed by WAIT as a sign-in is (a failover that lost the delete would revive it).
-- KEYS[1] the session: settle:{<ns>}:console:session:<SHA-256 of its id>
-- Returns {'ended', n}: n 1 when the session was there, 0 when it was already over.
-- Repeated, it ends nothing more.
return {'ended', redis.call('DEL', KEYS[1])}

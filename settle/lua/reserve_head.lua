-- reserve_head.lua: reserve.lua's fast path (see _head.lua) for the replay of a settled
-- operation (rules R4, R5), the one reserve that writes nothing and is the most repeated:
-- a completed or failed record whose fingerprint and binding are the caller's, on a shard
-- claimed for the caller's shard count (what guard() checks first; redis.pcall: a state of
-- another type is an error table, never equal, and guard() answers corrupt_state). Anything
-- else is left to reserve.lua.
HEAD_BLOB, HEAD_NOW, HEAD_US = head_read(KEYS[1])  -- reserve.lua's too (see prelude.lua)
if HEAD_NOW then
  local row, state = head_record(KEYS[1], HEAD_BLOB, HEAD_NOW)
  if row and state >= 3 and row[3] == ARGV[3] and row[4] == ARGV[4]
      and string.byte(ARGV[2], 1) == 0 and row[2] == string.sub(ARGV[2], 2)
      and redis.pcall('HGET', KEYS[#KEYS], 'shards') == ARGV[#ARGV - 1] then
    return {'replay', row[7], HEAD_NOW, '', row}
  end
end

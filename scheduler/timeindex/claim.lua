-- claim.lua: atomically take the due members of one time-index bucket.
--
-- KEYS[1]  the bucket: a sorted set `<prefix>:schedule:<PRIORITY>:<YYYYMMDDHHMM>:<sub>`.
--          The only key the script touches, so it runs unchanged on Redis Cluster.
-- ARGV[1]  the highest score to take, inclusive (scores are relative to the bucket's minute,
--          so the caller converts `now_ms` the same way).
-- ARGV[2]  how many members to take at most.
--
-- Returns {taken, next}: `taken` is a flat list member1, score1, member2, score2, ... in score
-- order, already removed from the bucket; `next` is the lowest score left in the bucket, or
-- nil when the bucket is now empty (Redis deletes an emptied sorted set).

local taken = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))

-- ZREM in chunks: unpack() of a long table overflows Lua's C stack (about 8,000 values).
local chunk = {}
for i = 1, #taken, 2 do
    chunk[#chunk + 1] = taken[i]
    if #chunk == 500 then
        redis.call('ZREM', KEYS[1], unpack(chunk))
        chunk = {}
    end
end
if #chunk > 0 then
    redis.call('ZREM', KEYS[1], unpack(chunk))
end

local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {taken, head[2] or false}

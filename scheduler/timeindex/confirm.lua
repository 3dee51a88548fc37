-- confirm.lua: settle which claimed copies of runs are the live ones, and retire them.
--
-- KEYS[1]  one shard of the id directory: a hash `<prefix>:ids:<n>` whose fields are hashes of
--          run ids and whose values are the tag of the one copy that counts (its bucket and
--          score). The only key the script touches, so it runs unchanged on Redis Cluster.
-- ARGV     pairs: field1, tag1, field2, tag2, ...
--
-- Returns one integer per pair: 1 when the field held that tag (the field is then deleted: the
-- run has left the index), 0 when it held another tag or none (the copy was stale: the run was
-- re-added elsewhere, discarded, or already claimed through another copy).

local out = {}
for i = 1, #ARGV, 2 do
    if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
        redis.call('HDEL', KEYS[1], ARGV[i])
        out[#out + 1] = 1
    else
        out[#out + 1] = 0
    end
end
return out

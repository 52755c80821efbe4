-- register.lua: a replica's heartbeat in its scope's registry.
--
-- KEYS[1] replicas  ZSET  replica id -> expiry (µs)
-- ARGV[1] this replica's id   ARGV[2] how long an entry lives unrenewed
-- (µs; 0: read only, the entry is not renewed)   ARGV[3] how long (µs) a
-- lapsed entry is kept, and named, after its expiry
--
-- Returns {live, lapsed, expiries, added}: the ids of the live replicas
-- (this one included when renewed), of those whose entry lapsed within
-- ARGV[3], which may be sending on their own, the live entries' expiries
-- (µs, in the order of `live`: an entry's last renewal was its expiry
-- less the TTL, and that renewal read every entry there was then), and 1
-- when this renewal added this replica's entry (it was not there: its
-- first, or Redis lost it), else 0. A value of the wrong type is
-- replaced: it cannot name replicas.
local key, id, ttl, keep = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = clock()
if not pcall(redis.call, 'ZREMRANGEBYSCORE', key, '-inf', int(now - keep)) then
  redis.call('DEL', key)
end
local added = 0
if ttl > 0 then
  added = redis.call('ZADD', key, int(now + ttl), id)
  extend(key, ttl + keep)
end
local entries = redis.call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf', 'WITHSCORES')
local live, expiries = {}, {}
for i = 1, #entries, 2 do
  live[#live + 1] = entries[i]
  expiries[#expiries + 1] = entries[i + 1]
end
return {live, redis.call('ZRANGEBYSCORE', key, '-inf', int(now)), expiries, added}

-- register.lua: a replica's heartbeat in its scope's registry.
--
-- KEYS[1] replicas  ZSET  replica id -> expiry (µs)
-- ARGV[1] this replica's id   ARGV[2] how long an entry lives unrenewed (µs)
--
-- Returns the ids of the live replicas, this one included. A value of the
-- wrong type is replaced: it cannot name replicas.
local key, id, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local now = clock()
if not pcall(redis.call, 'ZREMRANGEBYSCORE', key, '-inf', int(now)) then
  redis.call('DEL', key)
end
redis.call('ZADD', key, int(now + ttl), id)
extend(key, ttl)
return redis.call('ZRANGE', key, 0, -1)

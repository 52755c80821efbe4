-- agree.lua: record the settings a scope admits with, or name the ones it has.
--
-- KEYS[1] config  STRING  the settings every replica of the scope admits
--                         with, as RedisLimiter describes them
-- ARGV[1] this replica's settings   ARGV[2] how long the record outlives
--                                   the last replica that agreed (µs)
--
-- Returns {1} when the record is (now) these settings, its life extended,
-- or {0, settings} when another configuration holds the scope. A value of
-- the wrong type is replaced: it cannot name a configuration.
local key, mine, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local ok, current = pcall(redis.call, 'GET', key)
if ok and current and current ~= mine then
  return {0, current}
end
if not ok then
  redis.call('DEL', key)
end
redis.call('SET', key, mine, 'PX', int(math.ceil(ttl / 1000)))
return {1}

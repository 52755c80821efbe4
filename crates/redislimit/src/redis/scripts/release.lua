-- release.lua: a request is complete (or its acquire was abandoned).
--
-- KEYS[1] gate   KEYS[2] leases   KEYS[3] admits   (layout in acquire.lua)
-- ARGV[1] token   ARGV[2] min_delay   ARGV[3] cluster_concurrency
-- ARGV[4] 1 when the acquire was abandoned before its caller saw the
--         admission: undo it without counting a completion
--
-- Returns 1 when the token still held its slot, 0 when it no longer did
-- (its lease lapsed, or it was never admitted).
local gate, leases, admits = KEYS[1], KEYS[2], KEYS[3]
local token, min_delay = ARGV[1], tonumber(ARGV[2])
local cap, abandoned = tonumber(ARGV[3]), ARGV[4] == '1'
local now = clock()

if abandoned then
  redis.call('ZREM', admits, token)
end

if cap ~= 0 then
  -- Lease mode spaces sends only; a completion moves nothing.
  return redis.call('ZREM', leases, token)
end

local state = redis.call('HMGET', gate, 'next', 'holder')
if state[2] ~= token then
  return 0
end
local nxt = number(state[1])
if nxt == nil then
  return corrupt(gate)
end
redis.call('HDEL', gate, 'holder', 'busy')
if not abandoned then
  -- Serialized mode: the next send waits min_delay from this completion.
  nxt = math.max(nxt, now + min_delay)
  redis.call('HSET', gate, 'next', int(nxt))
  extend(gate, nxt - now)
end
return 1

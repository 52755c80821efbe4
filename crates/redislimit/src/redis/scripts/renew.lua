-- renew.lua: extend the lease of a request still in flight.
--
-- KEYS[1] gate   KEYS[2] leases   (docs/DESIGN.md, "Keys in Redis")
-- ARGV[1] token   ARGV[2] cluster_concurrency   ARGV[3] lease_ttl
-- ARGV[4] min_delay (serialized mode: owed after a dead holder's deadline)
-- ARGV[5] weight (its members in leases)
--
-- Returns 1 when the lease was extended, 0 when the token had lost its slot
-- (or the host's state was garbage and has been replaced: see heal).
local gate, leases = KEYS[1], KEYS[2]
local token, cap, lease_ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local min_delay, weight = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = clock()
local deadline = now + lease_ttl

return guarded(KEYS, function()

if cap == 0 then
  if redis.call('HGET', gate, 'holder') ~= token then
    return 0
  end
  redis.call('HSET', gate, 'busy', int(deadline))
  extend(gate, lease_ttl + min_delay)
  return 1
end

if not redis.call('ZSCORE', leases, token) then
  return 0
end
zadd_all(leases, int(deadline), token, weight, 'XX')
extend(leases, lease_ttl)
return 1
end, now, lease_ttl, 0)

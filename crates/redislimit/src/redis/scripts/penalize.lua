-- penalize.lua: hold a host back (Retry-After) on every replica.
--
-- KEYS[1] gate   (docs/DESIGN.md, "Keys in Redis")
-- ARGV[1] hold (µs, already capped by the configured maximum penalty)
-- ARGV[2] lease_ttl (how long garbage state is held off, see heal)
-- ARGV[3] '1': a byte charge (max_bytes_per_sec): ARGV[1] is added to the
--         host's byte debt, kept as the instant it is paid in the gate's
--         field 'bytes', and the host is held until then;
--         '2': a cap the host stated (RateLimit-Policy qu=concurrent-requests):
--         no more than ARGV[4] requests in flight (lease mode) for the next
--         ARGV[1] µs, kept in the gate's 'cap' and 'cap_until' (acquire.lua
--         reads them); nothing is held
--
-- Only ever extends the hold. Returns 1 when it extended it, 0 when a
-- longer hold was already in place.
local gate = KEYS[1]
local now = clock()
local hold = tonumber(ARGV[1])

return guarded(KEYS, function()
local nxt = number(redis.call('HGET', gate, 'next'))
if nxt == nil then
  garbage()
end
if ARGV[3] == '2' then
  local stated = tonumber(ARGV[4])
  if stated == nil or stated < 1 then
    return 0
  end
  redis.call('HSET', gate, 'cap', int(stated), 'cap_until', int(now + hold))
  extend(gate, hold)
  return 1
end
if ARGV[3] == '1' then
  local paid = number(redis.call('HGET', gate, 'bytes'))
  if paid == nil then
    garbage()
  end
  local free = math.max(now, paid) + hold
  redis.call('HSET', gate, 'bytes', int(free))
  hold = free - now
end
-- A hold the host's next send already covers must still outlast an
-- abandoned admission's rollback of that send (see release.lua).
redis.call('HDEL', gate, 'booked')
local hold_until = now + hold
if hold_until <= nxt then
  return 0
end
redis.call('HSET', gate, 'next', int(hold_until))
extend(gate, hold_until - now)
return 1
end, now, math.max(hold, tonumber(ARGV[2])), 1)

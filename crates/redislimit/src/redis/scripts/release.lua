-- release.lua: a request is complete (or its acquire was abandoned).
--
-- KEYS[1] gate   KEYS[2] leases   KEYS[3] admits   KEYS[4] void
-- KEYS[5] waiting                                     (docs/DESIGN.md, "Keys in Redis")
-- ARGV[1] token   ARGV[2] min_delay   ARGV[3] cluster_concurrency
-- ARGV[4] 1 when the acquire was abandoned before its caller saw the
--         admission (or before its booked slot came): undo it without
--         counting a completion, and if it has not run yet, make sure it
--         books nothing when it does; an acquire dropped while it
--         waited is abandoned too, and leaves the waiting line
-- ARGV[5] lease_ttl (how long an abandoned acquire may still arrive)
-- ARGV[6] weight (its members in leases and admits)
-- ARGV[7] bucket width (µs; 0: admits keeps each admission by token)
-- ARGV[8] when it was admitted (µs, Redis clock; 0: unknown), for buckets
--
-- Returns 1 when the token still held its slot, 0 when it no longer did
-- (its lease lapsed, or it was never admitted, or the host's state was
-- garbage and has been replaced: see heal in common.lua).
local gate, leases, admits, void, waiting = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, min_delay = ARGV[1], tonumber(ARGV[2])
local cap, abandoned, lease_ttl = tonumber(ARGV[3]), ARGV[4] == '1', tonumber(ARGV[5])
local weight, width, admitted = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local now = clock()

return guarded(KEYS, function()
local held
if cap ~= 0 then
  held = zrem_all(leases, token, weight) > 0
else
  held = redis.call('HGET', gate, 'holder') == token
end

if abandoned then
  -- An acquire dropped while it waited leaves the line.
  redis.call('HDEL', waiting, token)
  if width == 0 then
    zrem_all(admits, token, weight)
  elseif admitted > 0 and held then
    -- Counted down only while the token holds its slot: an abandon sent
    -- again (its first attempt ran, its reply was lost) must not count
    -- its bucket down twice; a lapsed lease leaves its unit counted.
    bucket_remove(admits, admitted, weight, width)
  end
  if not held then
    -- The acquire may still be on its way (a timed-out call, a frozen
    -- server): void its token until it could no longer matter.
    redis.call('ZREMRANGEBYSCORE', void, '-inf', int(now))
    redis.call('ZADD', void, int(now + lease_ttl), token)
    extend(void, lease_ttl)
    return 0
  end
end

if abandoned and held then
  -- Never sent: the gap its booking opened closes again, unless something
  -- moved `next` since (another booking, a penalty, a completion).
  local b = redis.call('HMGET', gate, 'booked', 'booked_next', 'before', 'next')
  if b[1] == token then
    local booked_next, before, current = number(b[2]), number(b[3]), number(b[4])
    if booked_next == nil or before == nil or current == nil then
      garbage()
    end
    if current == booked_next then
      redis.call('HSET', gate, 'next', int(before))
    end
    redis.call('HDEL', gate, 'booked', 'booked_next', 'before')
  end
end

if cap ~= 0 then
  -- Lease mode spaces sends only; a completion moves nothing.
  return held and 1 or 0
end
if not held then
  return 0
end
local nxt = number(redis.call('HGET', gate, 'next'))
if nxt == nil then
  garbage()
end
redis.call('HDEL', gate, 'holder', 'busy')
if not abandoned then
  -- Serialized mode: the next send waits min_delay from this completion.
  nxt = math.max(nxt, now + min_delay)
  redis.call('HSET', gate, 'next', int(nxt))
  extend(gate, nxt - now)
end
return 1
end, now, lease_ttl, 0)

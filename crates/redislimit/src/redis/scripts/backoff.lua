-- backoff.lua: move a host's adaptive backoff gap, shared by every
-- replica, and hold the host for the gap now in force.
--
-- KEYS[1] gate   (docs/DESIGN.md, "Keys in Redis"; the gap is its `backoff` field)
-- ARGV[1] step: 1 widens (an overload signal), 2 narrows (a success)
-- ARGV[2] start (µs): the first gap, and the floor below which a
--         narrowed gap is dropped
-- ARGV[3] max (µs, already capped by the configured maximum penalty)
-- ARGV[4] lease_ttl (how long garbage state is held off, see heal)
--
-- Widening doubles the gap (from start, up to max); narrowing takes it to
-- three quarters. Like penalize, the hold only ever extends `next`.
-- Returns the gap in force (µs), 0 when the host is not backing off.
-- Garbage in the state is healed (holding the host for at least start);
-- a widen then reports start.
local gate = KEYS[1]
local now = clock()
local step = tonumber(ARGV[1])
local start = tonumber(ARGV[2])
local max = tonumber(ARGV[3])

return guarded(KEYS, function()
local state = redis.call('HMGET', gate, 'next', 'backoff')
local nxt = number(state[1])
local gap = number(state[2])
if nxt == nil or gap == nil then
  garbage()
end
-- Its hold must outlast an abandoned admission's rollback (release.lua).
redis.call('HDEL', gate, 'booked')
if step == 1 then
  gap = math.min(math.max(gap * 2, start), max)
else
  gap = math.floor(gap * 0.75)
  if gap < start then
    redis.call('HDEL', gate, 'backoff')
    return 0
  end
end
redis.call('HSET', gate, 'backoff', int(gap))
local hold_until = now + gap
if hold_until > nxt then
  redis.call('HSET', gate, 'next', int(hold_until))
end
-- The gap outlives the hold: a signal again within `max` goes on from it.
extend(gate, math.max(gap, max))
return gap
end, now, math.max(start, tonumber(ARGV[4])), step == 1 and start or 0)

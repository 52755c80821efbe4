-- adopt.lua: count a request already in flight, admitted in-process while
-- Redis was unavailable, against the host's shared limits.
--
-- KEYS[1] gate   KEYS[2] leases   KEYS[3] admits   (docs/DESIGN.md, "Keys in Redis")
-- ARGV[1] token   ARGV[2] cluster_concurrency   ARGV[3] lease_ttl
-- ARGV[4] min_delay   ARGV[5] how long ago it was sent (µs)
-- ARGV[6] quota (0 = off)   ARGV[7] window   ARGV[8] weight
-- ARGV[9] bucket width (µs; 0: admits keeps each admission)
--
-- Returns 1 when the request now holds a slot (renewed and released like
-- any other), 0 when another holder has the host (serialized mode): the
-- overlap already happened and is not made worse by taking its place.
local gate, leases, admits = KEYS[1], KEYS[2], KEYS[3]
local token, cap, lease_ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local min_delay, ago = tonumber(ARGV[4]), tonumber(ARGV[5])
local quota, window, weight = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local width = tonumber(ARGV[9])
local now = clock()
local sent = now - ago


return guarded(KEYS, function()
local state = redis.call('HMGET', gate, 'next', 'holder', 'busy')
local nxt, holder, busy = number(state[1]), state[2], number(state[3])
if nxt == nil or busy == nil then
  garbage()
end
-- The gap of this request, sent already, must outlast an abandoned
-- admission's rollback (release.lua).
redis.call('HDEL', gate, 'booked')
nxt = math.max(nxt, sent + min_delay)
if cap == 0 and holder and holder ~= token and busy > now then
  return 0
end
book(gate, leases, token, cap, nxt, now, now, lease_ttl, min_delay, weight, nil)
if quota > 0 and sent + window > now and width > 0 then
  bucket_add(admits, sent, weight, width, window, now, nil)
elseif quota > 0 and sent + window > now then
  zadd_all(admits, int(sent), token, weight)
  extend(admits, sent + window - now)
end
return 1
end, now, lease_ttl, 0)

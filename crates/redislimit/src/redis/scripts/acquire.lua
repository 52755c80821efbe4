-- acquire.lua: admit one request to a host, or say how long to wait.
--
-- KEYS[1] gate   KEYS[2] leases   KEYS[3] admits   KEYS[4] void
-- KEYS[5] waiting   (what each holds: "Keys in Redis" in docs/DESIGN.md)
-- ARGV[1] token   ARGV[2] min_delay   ARGV[3] cluster_concurrency (0 = serialized;
--         lowered while the gate holds a cap the host stated, see penalize.lua)
-- ARGV[4] lease_ttl   ARGV[5] quota (0 = off)   ARGV[6] window   ARGV[7] max_wait
-- ARGV[8] weight: slots of the cap and units of the quota it takes (1 in
--         serialized mode)
-- ARGV[9] horizon: a wait at most this long (µs) is booked now, for a send
--         at its end (0: only a free host admits)
-- ARGV[10] bucket: 0 when `admits` keeps each admission (a ZSET), else the
--         width (µs) of its buckets (a HASH; see buckets in common.lua)
-- ARGV[11] patience: 0 when this acquire stays out of the waiting line (a
--         request heavier than 1), else how long (µs) after the wait it is
--         told it will have asked again at the latest; it keeps its place
--         in line until then
-- ARGV[12] room: how late (µs) after its slot the caller's send may leave,
--         as its process measured its own lateness: an admission counts as
--         sent at the end of it for the quota, and in lease mode with a
--         min_delay the next send waits min_delay after it (0 in serialized
--         mode, where the gap counts from each completion)
-- ARGV[13..] (only while replicas cut off from Redis share the host, in
--         lease mode): a turn's tolerance (µs), n, then the turns (0..n-1)
--         of those replicas. Each sends on its own at the start of its
--         turns (slots `index`, `index + n`, ... of `min_delay` on the
--         clock), up to the tolerance late: no admission here comes closer
--         to one than `min_delay` less the tolerance (see clear_of_turns),
--         and a cap the host stated is less their parts of it.
--
-- Returns `now` (an integer, the Redis clock in µs) when admitted at once,
-- {1, now, ahead} when booked for a send in `ahead` µs (the slot is booked
-- for then), or {0, wait, full}: no send for `wait` µs,
-- and full = 1 when the host's in-flight cap is taken (retry soon after),
-- or {0, 0, 2} when this acquire had already been abandoned, or
-- {0, lease_ttl, 3} when the host's state was of the wrong type or
-- unparseable: it was replaced by fresh state holding the host for
-- lease_ttl (see heal in common.lua), and nothing else was written.
-- The earliest time from `at` at which a send (leaving up to `room`
-- later) keeps at least `d` - `tol` from every send of the cut-off
-- replicas in the turns ARGV[15..] of `n` (each up to `tol` into its
-- turn); nil when none is found within a period (turns too close together
-- to fit a send between them).
local function clear_of_turns(at, d, room)
  local tol, n = tonumber(ARGV[13]), tonumber(ARGV[14])
  local period = n * d
  if period <= 0 then
    return at
  end
  for _ = 13, #ARGV do
    local moved = false
    for i = 15, #ARGV do
      local o = tonumber(ARGV[i]) * d
      -- The first of this turn's starts `s` whose keep-out (s - d + tol,
      -- s + d) has not ended by `at`.
      local s = o + (math.floor((at - o - d) / period) + 1) * period
      if at + room > s - d + tol then
        at = s + d
        moved = true
      end
    end
    if not moved then
      return at
    end
  end
  return nil
end

local gate, leases, admits, void, waiting = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token = ARGV[1]
-- The window, the bucket width, the longest wait and the patience are
-- parsed only where they are used (see num in common.lua).
local min_delay, cap, lease_ttl = num(ARGV[2]), num(ARGV[3]), num(ARGV[4])
local quota, weight, horizon = num(ARGV[5]), num(ARGV[8]), num(ARGV[9])
local in_line_wanted = ARGV[11] ~= '0'
local now = clock()

-- Everything this script decides on is read (and checked) before anything
-- is written; the only writes before the check drop expired entries.
local none_left = false
local ok_void, voided = pcall(redis.call, 'ZSCORE', void, token)
local ok, state = pcall(redis.call, 'HMGET', gate, 'next', 'holder', 'busy', 'cap', 'cap_until')
local nxt, holder, busy
if ok then
  nxt, holder, busy = number(state[1]), state[2], number(state[3])
  -- A cap the host stated (penalize.lua's cap mode) lowers the configured
  -- one until it lapses; a request heavier than it goes alone. The
  -- replicas cut off from Redis (turns ARGV[15..] of n) keep their parts
  -- of it, as of the configured cap (ARGV[3] is less theirs): turn i's is
  -- floor(stated / n), one more when i < stated % n (stated_share in
  -- fallback/plan.rs). With nothing left, nothing is admitted here.
  local stated, stated_until = tonumber(state[4]), tonumber(state[5])
  if cap ~= 0 and stated and stated_until and stated_until > now then
    local n = tonumber(ARGV[14])
    if n and n > 0 then
      local each, extra = math.floor(stated / n), stated % n
      for i = 15, #ARGV do
        stated = stated - each
        if tonumber(ARGV[i]) < extra then
          stated = stated - 1
        end
      end
    end
    if stated < 1 then
      none_left = true
    elseif stated < cap then
      cap = math.max(stated, weight)
    end
  end
end
-- Anything but garbage (out of memory, say) is raised, not healed.
local err = (not ok_void and voided) or (not ok and state) or nil
ok = ok and ok_void and nxt ~= nil and busy ~= nil
-- Leases in flight (lease mode), the lapsed ones dropped.
local in_flight = 0
if ok and cap ~= 0 then
  ok, in_flight = pcall(trimmed_count, leases, now)
  if not ok then
    err = in_flight
  end
end
local window, width = 0, 0
if quota > 0 then
  window, width = num(ARGV[6]), num(ARGV[10])
end
-- Admissions counted in the window: buckets (see buckets in common.lua),
-- or each admission, of which those that left the window are dropped (an
-- admission at `a` counts while a <= now < a + window).
local live, stale, counted
if ok and quota > 0 and width > 0 then
  ok, live, stale, counted = pcall(buckets, admits, now, window)
  if not ok then
    err = live
  end
elseif ok and quota > 0 then
  ok, counted = pcall(trimmed_count, admits, now - window)
  if not ok then
    err = counted
  end
end
-- Waiters in line before this one, when this one joined it, whether it is
-- in line, and whether anyone is.
local ahead, arrival, in_line, lined = 0, now, false, false
if ok and in_line_wanted then
  ok, ahead, arrival, in_line, lined = pcall(line, waiting, token, now)
  if not ok then
    err, ahead, arrival, in_line = ahead, 0, now, false
  end
end
if not ok and err and not is_garbage(err) then
  error(err)
end
if not ok then
  heal(KEYS, now, lease_ttl)
  return {0, lease_ttl, 3}
end

if voided then
  redis.call('ZREM', void, token)
  return {0, 0, 2}
end

local full = 0
if cap == 0 then
  if holder then
    if busy > now then
      full = 1
    else
      -- The holder's lease lapsed (its replica died): its request counts as
      -- ending at the lease deadline, so the gap after it is still kept.
      nxt = math.max(nxt, busy + min_delay)
    end
  end
elseif in_flight + weight > cap or none_left then
  full = 1
end

local wait = nxt - now
if quota > 0 and width > 0 then
  if counted + weight > quota then
    wait = math.max(wait, bucket_wait(live, counted, quota - weight, now, window))
  end
elseif quota > 0 then
  -- Room for `weight` more once at most quota - weight are left: once the
  -- newest record beyond those has left the window.
  if counted + weight > quota then
    local i = counted - quota + weight - 1
    local oldest = redis.call('ZRANGE', admits, i, i, 'WITHSCORES')
    wait = math.max(wait, tonumber(oldest[2]) + window - now)
  end
end

-- Waiters that joined the line earlier go first. With a gap, or in
-- serialized mode, one at a time: this one is refused (told when its turn
-- could come: a gap after each waiter ahead, or as when full); in lease
-- mode without a gap, each waiter ahead keeps a slot of the cap.
local behind = false
if ahead > 0 and cap ~= 0 and min_delay == 0 then
  if in_flight + ahead + weight > cap then
    full = 1
  end
elseif ahead > 0 then
  behind = true
  if cap == 0 then
    full = 1
  elseif full == 0 then
    wait = math.max(wait, 0) + ahead * min_delay
  end
end

-- The turns of replicas cut off from Redis, which send on their own: a
-- send between them, or none this period (asked again a period later).
local shunned = false
if ARGV[13] and full == 0 and min_delay > 0 then
  -- A send later than a turn's tolerance is the lateness hand-back's to
  -- catch: counted whole, a busy process's room would leave no time
  -- between two such turns, and the host would starve.
  local room = 0
  if cap ~= 0 then
    room = math.min(num(ARGV[12]), tonumber(ARGV[13]))
  end
  local at = clear_of_turns(now + math.max(wait, 0), min_delay, room)
  if at then
    wait = at - now
  else
    wait, shunned = math.max(wait, 0) + tonumber(ARGV[14]) * min_delay, true
  end
end

if full == 1 or wait > horizon or behind or shunned then
  -- A clock that stepped back, or a value from elsewhere, never asks for
  -- more than the longest wait this configuration can produce.
  wait = math.min(math.max(wait, 0), num(ARGV[7]))
  if in_line_wanted then
    join(waiting, token, arrival, now + wait + num(ARGV[11]), now, not lined)
  end
  return {0, wait, full}
end

-- Admitted now, or booked for the end of a wait within the horizon: the
-- request counts (in flight, in the quota, for the gap) from its slot.
if in_line then
  redis.call('HDEL', waiting, token)
end
local soon = math.max(wait, 0)
local at = now + soon
local before = nxt
-- A send may leave up to `room` after its slot: it counts from the end of it.
local room = num(ARGV[12])
local gap_room = 0
if cap ~= 0 and min_delay > 0 then
  gap_room = room
end
nxt = math.max(nxt, at + min_delay + gap_room)
book(gate, leases, token, cap, nxt, now, at, lease_ttl, min_delay, weight, before, in_flight == 0)
if quota > 0 and width > 0 then
  bucket_add(admits, at + room, weight, width, window, now, stale)
elseif quota > 0 then
  zadd_all(admits, int(at + room), token, weight)
  extend(admits, at + room + window - now, counted == 0)
end
if soon == 0 then
  return now
end
return {1, now, soon}

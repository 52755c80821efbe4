-- common.lua: helpers prepended to every redislimit script.
-- Times are integer microseconds on the Redis server's own clock.

-- Integers go to Redis through %d (Lua's %d formats a C long), at less than
-- half the cost of %.0f, where tostring() would switch to exponent notation
-- and drop digits. Only integral values are formatted; one beyond 2^53-1
-- (only garbage read from a key can be) goes through %.0f, which keeps its
-- digits where a C long would overflow.
local function int(n)
  if n > 9007199254740991 or n < -9007199254740991 then
    return string.format('%.0f', n)
  end
  return string.format('%d', n)
end

-- A number argument, with '0' and '1' (the most common values of most of
-- them) read without parsing: parsing a number (strtod) costs more than
-- most commands do.
local function num(s)
  if s == '0' then
    return 0
  elseif s == '1' then
    return 1
  end
  return tonumber(s)
end

-- Microseconds since the epoch, from the server's clock (TIME). Every script
-- reads the time here and nowhere else: the differential test
-- (tests/model/main.rs) defines clock() again after this file to set it.
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A stored number: 0 when absent, nil when the value is not a finite number
-- (the caller then replaces the corrupt state instead of trusting it).
local function number(v)
  if not v then
    return 0
  end
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then
    return nil
  end
  return n
end


-- Keeps `key` alive for at least `us` more microseconds, plus one second of
-- slack for a replica whose clock trails its master's. Never shortens a TTL;
-- `fresh` says this script created the key (it did not exist before its
-- write), so it has no TTL to keep and none is read.
local function extend(key, us, fresh)
  local ms = math.ceil(us / 1000) + 1000
  if fresh or redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, int(ms))
  end
end

-- Raised by a script that meets a value it cannot use (an unparseable
-- number); caught by `guarded` like a command's WRONGTYPE.
local GARBAGE = 'redislimit: garbage state'

local function garbage()
  error(GARBAGE)
end

-- Whether an error raised inside a script says the state is garbage (a
-- key of the wrong type, a value that does not parse) rather than
-- something else (out of memory, a script bug), which is raised on.
local function is_garbage(err)
  local msg = type(err) == 'table' and err.err or tostring(err)
  return string.find(msg, 'WRONGTYPE', 1, true) ~= nil
    or string.find(msg, GARBAGE, 1, true) ~= nil
end

-- The members a request of `weight` is kept as in a ZSET: its token, then
-- token#2 .. token#weight (a token is hex, so these are never tokens).
local function members(token, weight)
  local out = {token}
  for i = 2, weight do
    out[i] = token .. '#' .. i
  end
  return out
end

-- Calls `cmd` on `key` with `pre` arguments and then `args`, in batches
-- (Lua's unpack has a limit); returns the sum of the integer replies.
local function batched(cmd, key, pre, args, step)
  local total = 0
  for i = 1, #args, step do
    local call = {cmd, key}
    for _, a in ipairs(pre) do
      call[#call + 1] = a
    end
    for j = i, math.min(i + step - 1, #args) do
      call[#call + 1] = args[j]
    end
    total = total + redis.call(unpack(call))
  end
  return total
end

-- Adds the members of `token` (of `weight`) to ZSET `key` at `score`;
-- `flag` ('XX') only updates those present.
local function zadd_all(key, score, token, weight, flag)
  if weight == 1 then
    if flag then
      return redis.call('ZADD', key, flag, score, token)
    end
    return redis.call('ZADD', key, score, token)
  end
  local args = {}
  for _, m in ipairs(members(token, weight)) do
    args[#args + 1] = score
    args[#args + 1] = m
  end
  return batched('ZADD', key, flag and {flag} or {}, args, 512)
end

-- How many members ZSET `key` holds once those scored at or below `upto`
-- are dropped; an empty (absent) set is counted and not trimmed, so 0 also
-- says the key does not exist.
local function trimmed_count(key, upto)
  local n = redis.call('ZCARD', key)
  if n == 0 then
    return 0
  end
  return n - redis.call('ZREMRANGEBYSCORE', key, '-inf', int(upto))
end

-- Removes the members of `token` (of `weight`) from ZSET `key`; returns
-- how many were there.
local function zrem_all(key, token, weight)
  if weight == 1 then
    return redis.call('ZREM', key, token)
  end
  return batched('ZREM', key, {}, members(token, weight), 256)
end

-- Quotas above a few dozen keep buckets, not instants: `admits` is then a
-- HASH whose field floor(t / width) holds "<count> <latest>", the units
-- admitted in that stretch of the clock and the latest of their instants.
-- A bucket counts while its latest admission is inside the window, so an
-- admission can be counted for up to one bucket's width after it left
-- (never the other way round): the quota is never exceeded, and a burst
-- (one instant) is counted exactly.

-- The buckets of `admits` still counting at `now` (as {field, count,
-- latest}), their total, and the fields that no longer count.
local function buckets(admits, now, window)
  local raw = redis.call('HGETALL', admits)
  local live, stale, total = {}, {}, 0
  for i = 1, #raw, 2 do
    local b = tonumber(raw[i])
    local c, l = string.match(raw[i + 1], '^(%d+) (%d+)$')
    if b == nil or c == nil then
      garbage()
    end
    c, l = tonumber(c), tonumber(l)
    if l + window > now then
      live[#live + 1] = {b, c, l}
      total = total + c
    else
      stale[#stale + 1] = raw[i]
    end
  end
  -- Oldest first by their latest admission (rules of other windows that
  -- share a key keep buckets of other widths beside these).
  table.sort(live, function(x, y) return x[3] < y[3] end)
  return live, stale, total
end

-- How long from `now` until at most `room` units count, given `live`
-- (as buckets returns it) totalling `total`.
local function bucket_wait(live, total, room, now, window)
  local freed = 0
  for _, e in ipairs(live) do
    if total - freed <= room then
      break
    end
    freed = freed + e[2]
    if total - freed <= room then
      return e[3] + window - now
    end
  end
  -- Only a weight above the quota (refused before it gets here) cannot
  -- fit: wait a whole window rather than admit it.
  return window
end

-- Adds `weight` units admitted at `at` to their bucket (of `width` µs),
-- dropping the `stale` fields, and keeps `admits` for the window.
local function bucket_add(admits, at, weight, width, window, now, stale)
  local b = math.floor(at / width)
  local v = redis.call('HGET', admits, b)
  local c, l = 0, at
  if v then
    local vc, vl = string.match(v, '^(%d+) (%d+)$')
    if vc == nil then
      garbage()
    end
    c, l = tonumber(vc), math.max(tonumber(vl), at)
  end
  redis.call('HSET', admits, b, int(c + weight) .. ' ' .. int(l))
  if stale and #stale > 0 then
    redis.call('HDEL', admits, unpack(stale))
  end
  extend(admits, l + window - now)
end

-- Takes `weight` units admitted at `at` out of their bucket.
local function bucket_remove(admits, at, weight, width)
  local b = math.floor(at / width)
  local v = redis.call('HGET', admits, b)
  if not v then
    return
  end
  local c, l = string.match(v, '^(%d+) (%d+)$')
  if c == nil then
    garbage()
  end
  c = tonumber(c) - weight
  if c > 0 then
    redis.call('HSET', admits, b, int(c) .. ' ' .. l)
  else
    redis.call('HDEL', admits, b)
  end
end

-- The waiting line: requests of weight 1 that were told to wait join it
-- (HASH `waiting`: token -> "<arrival> <by>", Redis clock, µs) and keep
-- their place while they ask again before `by`; one that does not (its
-- acquire dropped, its replica dead) is dropped from the line when another
-- waiter finds it lapsed (a late waiter that asks again first keeps its
-- place: asking shows it is alive). A waiter goes before every other that
-- joined later (ties: by token), so each replica's waiters take their
-- turns in the order they began to wait.

-- How many live waiters of `waiting` are in line before `token`, when
-- `token` joined (`now` when it is not in line yet), whether it is in
-- line, and whether the line is left with anyone in it (else its key is
-- gone); drops the other entries whose `by` has passed.
local function line(waiting, token, now)
  local raw = redis.call('HGETALL', waiting)
  if #raw == 0 then
    return 0, now, false, false
  end
  local entries, dead = {}, {}
  local arrival, present = now, false
  for i = 1, #raw, 2 do
    local a, b = string.match(raw[i + 1], '^(%d+) (%d+)$')
    if a == nil then
      garbage()
    end
    a, b = tonumber(a), tonumber(b)
    if raw[i] == token then
      arrival, present = a, true
    elseif b <= now then
      dead[#dead + 1] = raw[i]
    else
      entries[#entries + 1] = {raw[i], a}
    end
  end
  if #dead > 0 then
    batched('HDEL', waiting, {}, dead, 256)
  end
  local ahead = 0
  for _, e in ipairs(entries) do
    if e[2] < arrival or (e[2] == arrival and e[1] < token) then
      ahead = ahead + 1
    end
  end
  return ahead, arrival, present, present or #entries > 0
end

-- Puts `token` in line (or keeps its place), joined at `arrival`, to ask
-- again before `by`; `fresh` when the line was empty (no key).
local function join(waiting, token, arrival, by, now, fresh)
  redis.call('HSET', waiting, token, int(arrival) .. ' ' .. int(by))
  extend(waiting, by - now, fresh)
end

-- Books `token` a slot on a host for a send at `at` (now, or a moment
-- ahead), until `at + lease_ttl`: in serialized mode (cap 0) as the holder
-- of the gate, in lease mode as `weight` leases; and no send before `nxt`.
-- With `undo` (what `next` was before), the gate records the booking
-- (booked, booked_next, before) so that an abandon can take back the gap it
-- opened while nothing else has moved `next` since (see release.lua).
-- `fresh` when the leases set was empty (no key) before this booking; only
-- lease mode reads it (serialized mode books no lease).
local function set_next(gate, nxt, token, undo, ...)
  local n = int(nxt)
  if undo then
    redis.call('HSET', gate, 'next', n, 'booked', token, 'booked_next', n, 'before', int(undo), ...)
  else
    redis.call('HSET', gate, 'next', n, ...)
  end
end

local function book(gate, leases, token, cap, nxt, now, at, lease_ttl, min_delay, weight, undo, fresh)
  local deadline = at + lease_ttl
  if cap == 0 then
    set_next(gate, nxt, token, undo, 'holder', token, 'busy', int(deadline))
    -- A holder that dies still owes the gap after its lease deadline.
    extend(gate, math.max(nxt, deadline + min_delay) - now)
  else
    if nxt > now then
      set_next(gate, nxt, token, undo)
      extend(gate, nxt - now)
    end
    zadd_all(leases, int(deadline), token, weight)
    extend(leases, deadline - now, fresh)
  end
end

-- Replaces a host's state that is of the wrong type or unparseable (it can
-- only come from outside: a hand-made key, another program) with fresh
-- state holding the host for `hold` µs: whatever the garbage stood for (a
-- holder, leases) has lapsed by then, and the host is paced afresh.
local function heal(keys, now, hold)
  redis.call('DEL', unpack(keys))
  redis.call('HSET', keys[1], 'next', int(now + hold))
  extend(keys[1], hold)
end

-- Runs `body` and returns what it returns; when it meets garbage, replaces
-- the host's state in `keys` (see heal, holding it for `hold`) and returns
-- `instead`. A script runs atomically, so what `body` wrote before is never
-- seen. (The keys are passed: in a function library, these helpers are
-- defined once at load, where no KEYS exists.)
local function guarded(keys, body, now, hold, instead)
  local ok, result = pcall(body)
  if ok then
    return result
  end
  if not is_garbage(result) then
    error(result)
  end
  heal(keys, now, hold)
  return instead
end

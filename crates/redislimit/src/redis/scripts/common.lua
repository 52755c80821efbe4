-- common.lua: helpers prepended to every redislimit script.
-- Times are integer microseconds on the Redis server's own clock.

-- Integers go to Redis through %.0f: exact up to 2^53-1, where tostring()
-- would switch to exponent notation and drop digits.
local function int(n)
  return string.format('%.0f', n)
end

-- Microseconds since the epoch, from the server's clock (TIME).
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
-- slack for a replica whose clock trails its master's. Never shortens a TTL.
local function extend(key, us)
  local ms = math.ceil(us / 1000) + 1000
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, int(ms))
  end
end

-- Whether a host's keys hold what the scripts write there: KEYS[1] (the
-- gate) a HASH whose numbers parse, the others sorted sets; absent keys
-- are fine. For the scripts off the admission path (acquire checks as it
-- reads, without these calls).
local function sound(keys)
  for i, key in ipairs(keys) do
    local kind = redis.call('TYPE', key)['ok']
    local want = (i == 1) and 'hash' or 'zset'
    if kind ~= 'none' and kind ~= want then
      return false
    end
  end
  local g = redis.call('HMGET', keys[1], 'next', 'busy')
  return number(g[1]) ~= nil and number(g[2]) ~= nil
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

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
-- (the caller then refuses the corrupt state instead of trusting it).
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

local function corrupt(key)
  return redis.error_reply('redislimit: corrupt pacing state at ' .. key)
end

-- Keeps `key` alive for at least `us` more microseconds, plus one second of
-- slack for a replica whose clock trails its master's. Never shortens a TTL.
local function extend(key, us)
  local ms = math.ceil(us / 1000) + 1000
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, int(ms))
  end
end


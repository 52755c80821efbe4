-- register.lua: a replica's heartbeat in its scope's registry, or its
-- leaving.
--
-- KEYS[1] replicas  ZSET  replica id -> expiry (µs)
-- KEYS[2] joined    HASH  replica id -> when its entry was added (µs), then
--                   for a replica that left, a space and when it left
-- ARGV[1] this replica's id   ARGV[2] how long an entry lives unrenewed
-- (µs; 0: read only, the entry is not renewed)   ARGV[3] how long (µs) a
-- lapsed entry is kept, and named, after its expiry, and a departure
-- after it   ARGV[4] 1 when the replica leaves: its entry is taken out,
-- and its departure kept
--
-- Returns {live, lapsed, expiries, added, lapsed_expiries, joined,
-- lapsed_joined, left, left_joined, left_at}: the ids of the live replicas
-- (this one included when renewed), of those whose entry lapsed within
-- ARGV[3], which may be sending on their own, the live entries' expiries
-- (µs, in the order of `live`: an entry's last renewal was its expiry
-- less the TTL, and that renewal read every entry there was then), 1 when
-- this renewal added this replica's entry (it was not there: its first,
-- or Redis lost it), else 0, the lapsed entries' expiries (in the order
-- of `lapsed`), when each live and each lapsed entry was added (0 when not
-- known: an entry added by a replica of an earlier version), and the ids
-- of the replicas that left within ARGV[3], when each was added and when
-- it left. A replica cut off from Redis read, at its last renewal, the
-- entries added before it and not gone by then.
-- A value of the wrong type is replaced: it cannot name replicas.
local key, joined = KEYS[1], KEYS[2]
local id, ttl, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = clock()
if not pcall(redis.call, 'ZREMRANGEBYSCORE', key, '-inf', int(now - keep)) then
  redis.call('DEL', key)
end
if not pcall(redis.call, 'HLEN', joined) then
  redis.call('DEL', joined)
end
if ARGV[4] == '1' then
  -- Kept as written (a number made a string again may not be in digits).
  local at = redis.call('HGET', joined, id)
  if redis.call('ZREM', key, id) == 1 and at and string.match(at, '^%d+$') then
    redis.call('HSET', joined, id, at .. ' ' .. int(now))
    extend(joined, keep)
  end
end
-- The additions of entries forgotten, and departures older than ARGV[3],
-- go; the departures within it are named.
local left, left_joined, left_at = {}, {}, {}
if redis.call('HLEN', joined) > redis.call('ZCARD', key) then
  local all = redis.call('HGETALL', joined)
  for i = 1, #all, 2 do
    local other = all[i]
    if not redis.call('ZSCORE', key, other) then
      local added, gone = string.match(all[i + 1], '^(%d+) (%d+)$')
      if gone and tonumber(gone) > now - keep then
        left[#left + 1] = other
        left_joined[#left_joined + 1] = tonumber(added)
        left_at[#left_at + 1] = tonumber(gone)
      else
        redis.call('HDEL', joined, other)
      end
    end
  end
end
local added = 0
if ttl > 0 and ARGV[4] ~= '1' then
  added = redis.call('ZADD', key, int(now + ttl), id)
  extend(key, ttl + keep)
  if added == 1 then
    redis.call('HSET', joined, id, int(now))
  end
  extend(joined, ttl + keep)
end
-- Ids and scores of the entries in (min, max], and when each was added.
local function entries(min, max)
  local found = redis.call('ZRANGEBYSCORE', key, min, max, 'WITHSCORES')
  local ids, scores = {}, {}
  for i = 1, #found, 2 do
    ids[#ids + 1] = found[i]
    scores[#scores + 1] = found[i + 1]
  end
  local added_at = {}
  if #ids > 0 then
    for i, at in ipairs(redis.call('HMGET', joined, unpack(ids))) do
      added_at[i] = tonumber(at) or 0
    end
  end
  return ids, scores, added_at
end
local live, expiries, live_joined = entries('(' .. int(now), '+inf')
local lapsed, lapsed_expiries, lapsed_joined = entries('-inf', int(now))
return {live, lapsed, expiries, added, lapsed_expiries, live_joined, lapsed_joined,
  left, left_joined, left_at}

-- agree.lua: record the settings a scope admits with, or name the ones it has.
--
-- KEYS[1] config        STRING  the settings every replica of the scope admits
--                               with, as RedisLimiter describes them
-- KEYS[2] config since  STRING  when (µs, this server's clock) those settings
--                               were first recorded; kept when a replica puts
--                               them back
-- ARGV[1] this replica's settings   ARGV[2] how long the record outlives
--                                   the last replica that agreed (µs)
-- ARGV[3] the `since` of the record this replica agreed with, while it is
--         in use (see agreement.rs); 0 otherwise
-- ARGV[4] 1 to extend the record's life (an acquire); 0 to leave a record
--         of these settings as it is, and only put one back (the heartbeat:
--         the record still lapses once no replica acquires with it)
--
-- Returns {1, since, back} when the record is (now) these settings, its
-- life extended (back is 1 when this put back a record this replica had
-- agreed with, which was missing or displaced; else 0), or {0, settings}
-- when another configuration holds the scope.
-- A record of other settings recorded after the one this replica agreed
-- with took the place of a record Redis lost (a restart, a failover, a
-- flush) while this replica was live: it is put back, so that the replica
-- started meanwhile is refused, not those already running. A value of the
-- wrong type is replaced: it cannot name a configuration.
-- Settings of policies published to the scope end in ` policy=N`, their
-- version (none: 0): a newer version takes the record over from an older
-- one (its replicas follow it), and an older one never puts itself back
-- over a newer one.
local key, since_key = KEYS[1], KEYS[2]
local mine, ttl, claim, extend = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local ok, current = pcall(redis.call, 'GET', key)
local since_ok, since = pcall(redis.call, 'GET', since_key)
since = since_ok and num(since) or nil
-- Only a time this script could have written is one.
if since and (since < 0 or since > 9007199254740991 or since ~= math.floor(since)) then
  since = nil
end
if not ok then
  redis.call('DEL', key)
  current = nil
end
local back = 0
local function version(settings)
  return tonumber(string.match(settings, ' policy=(%d+)$') or '0') or 0
end
if current and current ~= mine then
  local ours, theirs = version(mine), version(current)
  if ours > theirs then
    since = clock()
  elseif ours == theirs and claim > 0 and since and since > claim then
    since, back = claim, 1
  else
    return {0, current}
  end
elseif not current then
  if claim > 0 then
    since, back = claim, 1
  else
    since = clock()
  end
else
  if extend == '0' and since then
    return {1, tostring(int(since)), '0'}
  end
  since = since or (claim > 0 and claim) or clock()
end
local px = int(math.ceil(ttl / 1000))
redis.call('SET', key, mine, 'PX', px)
redis.call('SET', since_key, int(since), 'PX', px)
return {1, tostring(int(since)), tostring(back)}

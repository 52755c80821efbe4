//! Published policies in Redis: publishing the next version, reading it
//! back, and putting the version in force back when the scope lost it
//! (see `live.rs` for the limiter that follows them).

use deadpool_redis::redis::{Value, cmd};

use super::backend::Backend;
use super::keys::RedisKeys;
use super::limiter::RedisLimiter;
use crate::{ConfigError, Error, Op, Policies};

/// Publishes: the version goes up by one, past any version the scope's
/// configuration record names (a policy key deleted by hand restarts at
/// no older version than the replicas run).
const PUBLISH: &str = r"
local seen = 0
local ok, record = pcall(redis.call, 'GET', KEYS[2])
if ok and type(record) == 'string' then
  seen = tonumber(string.match(record, ' policy=(%d+)$') or '0') or 0
end
local ok2, kept = pcall(redis.call, 'HGET', KEYS[1], 'version')
if not ok2 then
  redis.call('DEL', KEYS[1])
  kept = nil
end
local version = math.max(tonumber(kept or '0') or 0, seen) + 1
redis.call('HSET', KEYS[1], 'version', version, 'text', ARGV[1])
redis.call('HDEL', KEYS[1], 'put_back')
return version
";

/// Puts the version in force back (`ARGV[1]`, its text `ARGV[2]`) when
/// the scope holds none, or an older one put back by a replica that had
/// not switched yet (marked `put_back`); returns 1. An older one that was
/// published (an operator's, after Redis lost the count of versions) is
/// the newest policies: it is renumbered past this version and any the
/// configuration record (`KEYS[2]`) names, so every replica switches to
/// it; returns 2. A newer one, or something that is not a hash of
/// policies, is left as it is: 0.
const PUT_BACK: &str = r"
local ok, kept = pcall(redis.call, 'HMGET', KEYS[1], 'version', 'put_back')
if not ok then
  return 0
end
local mine = tonumber(ARGV[1])
if kept[1] then
  local version = tonumber(kept[1])
  if version == nil or version >= mine then
    return 0
  end
  if not kept[2] then
    local seen = 0
    local ok2, record = pcall(redis.call, 'GET', KEYS[2])
    if ok2 and type(record) == 'string' then
      seen = tonumber(string.match(record, ' policy=(%d+)$') or '0') or 0
    end
    redis.call('HSET', KEYS[1], 'version', math.max(mine, seen) + 1)
    return 2
  end
end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'text', ARGV[2], 'put_back', 1)
return 1
";

impl RedisLimiter {
    /// Publishes `policies` to this limiter's scope, as the next version:
    /// every [`LiveLimiter`](super::LiveLimiter) of the scope paces with them within a quarter
    /// of its `lease_ttl` (plus a call to Redis), keeping each host's state.
    /// Returns the version.
    ///
    /// They are refused first, and nothing is published, when this
    /// limiter's builder would refuse them (the scope's own settings, such
    /// as `cluster_concurrency`, are this limiter's): an error
    /// [`Error::InvalidConfig`] naming the rule. The replicas compare what
    /// they then admit with as before (see
    /// [`check_config`](Self::check_config)): one whose own settings differ
    /// from the publisher's is refused, naming both.
    pub async fn publish_policies(&self, policies: &Policies) -> Result<u64, Error> {
        self.rebuilder(policies.clone(), 1).build()?;
        let settings = &self.core.settings;
        let key = RedisKeys::policy(&settings.prefix, &settings.scope);
        let mut publish = cmd("EVAL");
        publish
            .arg(PUBLISH)
            .arg(2)
            .arg(&key)
            .arg(RedisKeys::config(&settings.prefix, &settings.scope))
            .arg(policies.to_record());
        self.core
            .backend
            .command::<u64>(&key, &publish)
            .await
            .map_err(|e| e.into_error(Op::Policies))
    }

    /// The policies published to this limiter's scope, with their version;
    /// `None` when none are. Policies that cannot be read back (written by
    /// a newer version of this crate, or by something else) are
    /// [`Error::InvalidConfig`] with [`ConfigError::InvalidPublished`].
    pub async fn published_policies(&self) -> Result<Option<(u64, Policies)>, Error> {
        let settings = &self.core.settings;
        let key = RedisKeys::policy(&settings.prefix, &settings.scope);
        let mut get = cmd("HMGET");
        get.arg(&key).arg("version").arg("text");
        let reply = self.core.backend.command::<Value>(&key, &get).await;
        let bad = |reason: &str| {
            Error::from(ConfigError::InvalidPublished {
                reason: reason.to_owned(),
            })
        };
        let fields = match reply {
            Ok(Value::Array(fields)) => fields,
            Ok(_) => return Err(bad("Redis answered HMGET with something else")),
            Err(e) => {
                let err = e.into_error(Op::Policies);
                return Err(if err.is_unavailable() {
                    err
                } else {
                    bad(&format!("{key} is not a hash of policies: {err}"))
                });
            }
        };
        let text = |v: &Value| match v {
            Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
            _ => None,
        };
        match fields.as_slice() {
            [Value::Nil, Value::Nil] => Ok(None),
            [version, body] => {
                let version = text(version)
                    .and_then(|v| v.parse::<u64>().ok())
                    .filter(|&v| v > 0)
                    .ok_or_else(|| bad("its version is not a positive whole number"))?;
                let body = text(body).ok_or_else(|| bad("it has no text"))?;
                Ok(Some((version, Policies::from_record(&body)?)))
            }
            _ => Err(bad("Redis answered HMGET with another number of fields")),
        }
    }
}

/// The policy version a scope's configuration record names (its settings
/// end in ` policy=N`); 0 when it names none.
pub(super) fn named_version(record: &str) -> u64 {
    record
        .rsplit_once(" policy=")
        .and_then(|(_, version)| version.parse().ok())
        .unwrap_or(0)
}

/// Puts `version`, the policies `redis` paces with, back in its scope
/// (see [`PUT_BACK`]); whether the scope's policies changed (put back, or
/// an older publication renumbered past it).
pub(super) async fn put_back(redis: &RedisLimiter, version: u64) -> Result<bool, Error> {
    let settings = &redis.core.settings;
    let back = PutBack::new(
        &settings.prefix,
        &settings.scope,
        version,
        redis.policies().to_record(),
    );
    back.run(&redis.core.backend).await
}

/// A limiter's published policies, as [`PUT_BACK`] puts them back: the
/// scope's policy and configuration keys, the version and its text.
#[derive(Debug)]
pub(super) struct PutBack {
    key: String,
    config: String,
    version: u64,
    text: String,
}

impl PutBack {
    pub(super) fn new(prefix: &str, scope: &str, version: u64, text: String) -> Self {
        Self {
            key: RedisKeys::policy(prefix, scope),
            config: RedisKeys::config(prefix, scope),
            version,
            text,
        }
    }

    /// Runs [`PUT_BACK`]; whether the scope's policies changed.
    pub(super) async fn run(&self, backend: &Backend) -> Result<bool, Error> {
        let mut put = cmd("EVAL");
        put.arg(PUT_BACK)
            .arg(2)
            .arg(&self.key)
            .arg(&self.config)
            .arg(self.version)
            .arg(&self.text);
        let wrote = backend
            .command::<u64>(&self.key, &put)
            .await
            .map_err(|e| e.into_error(Op::Policies))?;
        let version = self.version;
        match wrote {
            1 => tracing::info!(
                version,
                "the scope had lost the policies in force: put them back"
            ),
            2 => tracing::warn!(
                version,
                "policies were published as an older version after the scope lost the version \
                 in force: renumbered past it, so that every replica follows them"
            ),
            _ => {}
        }
        Ok(wrote != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::named_version;

    #[test]
    fn the_version_a_record_names_is_read_from_its_end() {
        assert_eq!(
            named_version("mode=serialized min_delay=30ms policy=12"),
            12
        );
        assert_eq!(named_version("mode=serialized min_delay=30ms"), 0);
        assert_eq!(named_version("policy=1 mode=lease policy=x"), 0);
        assert_eq!(named_version(""), 0);
    }
}

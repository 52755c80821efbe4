//! The Lua scripts, one per operation, and how they are run: EVALSHA, and
//! EVAL when the server answers NOSCRIPT (a restart, a new Cluster node).

use std::sync::LazyLock;

use deadpool_redis::redis::{self, Cmd, FromRedisValue, ParsingError, Value};
use tokio::time::Instant;

use super::pool::{Connections, QueryError};

/// One script: its source (the shared helpers, then the operation) and its
/// SHA-1, computed once.
#[derive(Debug)]
pub(crate) struct LuaScript {
    source: &'static str,
    sha: String,
}

impl LuaScript {
    fn new(source: &'static str) -> Self {
        Self {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// Runs the script on `keys`, with the arguments `args` appends.
    ///
    /// One EVALSHA when the server has the script cached; otherwise EVAL,
    /// which also caches it on the node that serves these keys.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        redis: &Connections,
        keys: &[&str],
        args: impl Fn(&mut Cmd),
    ) -> Result<T, QueryError> {
        self.run_timed(redis, keys, args).await.0
    }

    /// [`run`](Self::run), and when the call that ran it was sent (the
    /// EVAL, after a NOSCRIPT).
    pub(crate) async fn run_timed<T: FromRedisValue>(
        &self,
        redis: &Connections,
        keys: &[&str],
        args: impl Fn(&mut Cmd),
    ) -> (Result<T, QueryError>, Instant) {
        let call = |name: &str, body: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(body).arg(keys.len()).arg(keys);
            args(&mut cmd);
            cmd
        };
        let sent = Instant::now();
        match redis.query(&call("EVALSHA", &self.sha)).await {
            Err(err) if err.is_noscript() => {
                let sent = Instant::now();
                (redis.query(&call("EVAL", self.source)).await, sent)
            }
            result => (result, sent),
        }
    }
}

macro_rules! script {
    ($file:literal) => {
        LazyLock::new(|| {
            LuaScript::new(concat!(
                include_str!("scripts/common.lua"),
                include_str!(concat!("scripts/", $file))
            ))
        })
    };
}

pub(crate) static ACQUIRE: LazyLock<LuaScript> = script!("acquire.lua");
pub(crate) static RELEASE: LazyLock<LuaScript> = script!("release.lua");
pub(crate) static RENEW: LazyLock<LuaScript> = script!("renew.lua");
pub(crate) static PENALIZE: LazyLock<LuaScript> = script!("penalize.lua");
pub(crate) static BACKOFF: LazyLock<LuaScript> = script!("backoff.lua");
pub(crate) static AGREE: LazyLock<LuaScript> = script!("agree.lua");
pub(crate) static REGISTER: LazyLock<LuaScript> = script!("register.lua");
pub(crate) static ADOPT: LazyLock<LuaScript> = script!("adopt.lua");

/// What acquire.lua answers, as three integers (see its header): an
/// admission at once comes as the Redis clock alone (an integer reply costs
/// the server less than a table) and reads as `[1, now, 0]`.
#[derive(Debug)]
pub(crate) struct AcquireReply(pub(crate) Vec<i64>);

impl FromRedisValue for AcquireReply {
    fn from_redis_value_ref(v: &Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(now) => Ok(Self(vec![1, *now, 0])),
            other => Vec::from_redis_value_ref(other).map(Self),
        }
    }

    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        Self::from_redis_value_ref(&v)
    }
}

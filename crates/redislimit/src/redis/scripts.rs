//! The Lua scripts, one per operation, and how they are run: EVALSHA, and
//! EVAL when the server answers NOSCRIPT (a restart, a new Cluster node).
//! Each script's arguments and replies are read and written in the module
//! beside its `.lua` file (`scripts/acquire.rs` for `scripts/acquire.lua`).

pub(super) mod acquire;
pub(super) mod adopt;
pub(super) mod agree;
pub(super) mod backoff;
pub(super) mod penalize;
pub(super) mod register;
pub(super) mod release;
pub(super) mod renew;

use std::sync::LazyLock;

use deadpool_redis::redis::{self, Cmd, FromRedisValue};
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

static ACQUIRE: LazyLock<LuaScript> = script!("acquire.lua");
static RELEASE: LazyLock<LuaScript> = script!("release.lua");
static RENEW: LazyLock<LuaScript> = script!("renew.lua");
static PENALIZE: LazyLock<LuaScript> = script!("penalize.lua");
static BACKOFF: LazyLock<LuaScript> = script!("backoff.lua");
static AGREE: LazyLock<LuaScript> = script!("agree.lua");
static REGISTER: LazyLock<LuaScript> = script!("register.lua");
static ADOPT: LazyLock<LuaScript> = script!("adopt.lua");

/// Why a script call gave no answer its caller can use.
#[derive(Debug)]
pub(crate) enum ScriptError {
    /// The call failed (see [`QueryError`]).
    Query(QueryError),
    /// Redis answered something the script never returns.
    BadReply(String),
}

impl From<QueryError> for ScriptError {
    fn from(err: QueryError) -> Self {
        Self::Query(err)
    }
}

//! The Lua scripts, one per operation, and how they are run.
//!
//! Where the server has Redis Functions (Redis 7 and later, Valkey), the
//! scripts are one function library, loaded once per server: the shared
//! helpers are then defined at load, not again on every call, and each
//! operation is one `FCALL`. The library's name carries a hash of its
//! source, so replicas of two versions rolled out side by side each run
//! their own. A server without the library (a restart, a new Cluster node)
//! answers that the function is missing: the library is loaded (`FUNCTION
//! LOAD REPLACE`, one load at a time) and the call sent again. A server
//! without Functions (before Redis 7), or a user not allowed to load them,
//! is sent `EVALSHA` from then on (through these connections, until the
//! process restarts), and `EVAL` when it answers NOSCRIPT. The operations
//! that free what a host holds run on a server out of memory (see
//! `library.rs`).
//!
//! Each script's arguments and replies are read and written in the module
//! beside its `.lua` file (`scripts/acquire.rs` for `scripts/acquire.lua`).

pub(super) mod acquire;
pub(super) mod adopt;
pub(super) mod agree;
pub(super) mod backoff;
mod functions;
mod library;
pub(super) mod penalize;
pub(super) mod register;
pub(super) mod release;
pub(super) mod renew;

use std::sync::LazyLock;

use deadpool_redis::redis::{self, Cmd, FromRedisValue};
use tokio::time::Instant;

use self::functions::{is_missing_function, refuses_functions};
use super::pool::{Connections, QueryError};

/// The helpers every operation shares.
const COMMON: &str = include_str!("scripts/common.lua");

/// Each operation: its name in the library, and its body.
const OPS: [(&str, &str); 8] = [
    ("acquire", include_str!("scripts/acquire.lua")),
    ("release", include_str!("scripts/release.lua")),
    ("renew", include_str!("scripts/renew.lua")),
    ("penalize", include_str!("scripts/penalize.lua")),
    ("backoff", include_str!("scripts/backoff.lua")),
    ("agree", include_str!("scripts/agree.lua")),
    ("register", include_str!("scripts/register.lua")),
    ("adopt", include_str!("scripts/adopt.lua")),
];

/// The function library: its source, computed once.
static LIBRARY: LazyLock<Library> = LazyLock::new(Library::new);

struct Library {
    /// `redislimit_` and the first 12 hex digits of the SHA-1 of the
    /// source it would have under a fixed name: a new version of any
    /// script is a new library, beside the old one.
    name: String,
    source: String,
}

impl Library {
    fn new() -> Self {
        let unnamed = library::function_library("redislimit", COMMON, &OPS);
        let hash = redis::Script::new(&unnamed).get_hash().to_owned();
        let name = format!("redislimit_{}", &hash[..12]);
        let source = library::function_library(&name, COMMON, &OPS);
        Self { name, source }
    }

    /// `FUNCTION LOAD REPLACE`: in a Cluster, sent to every master. The
    /// same name always carries the same source, so replacing it is safe
    /// whoever loaded it first.
    fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(&self.source);
        cmd
    }
}

/// One script: its source for `EVAL` (the shared helpers, then the
/// operation), its SHA-1 and its function's name, computed once.
#[derive(Debug)]
pub(crate) struct LuaScript {
    source: String,
    sha: String,
    function: String,
}

impl LuaScript {
    fn new(op: &str) -> Self {
        let body = OPS
            .iter()
            .find(|(name, _)| *name == op)
            .map(|(_, body)| *body)
            .expect("every script is in OPS");
        let source = format!("{COMMON}{body}");
        Self {
            sha: redis::Script::new(&source).get_hash().to_owned(),
            source,
            function: format!("{}_{op}", LIBRARY.name),
        }
    }

    /// Runs the script on `keys`, with the arguments `args` appends.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        redis: &Connections,
        keys: &[&str],
        args: impl Fn(&mut Cmd),
    ) -> Result<T, QueryError> {
        self.run_timed(redis, keys, args).await.0
    }

    /// [`run`](Self::run), and when the call that ran it was sent (the
    /// second, after the server said the function or the script was
    /// missing).
    pub(crate) async fn run_timed<T: FromRedisValue>(
        &self,
        redis: &Connections,
        keys: &[&str],
        args: impl Fn(&mut Cmd),
    ) -> (Result<T, QueryError>, Instant) {
        let call = |name: &str, body: &str| {
            let mut cmd = Cmd::with_capacity(CALL_ARGS, call_bytes(name, body, keys));
            cmd.arg(name).arg(body).arg(keys.len()).arg(keys);
            args(&mut cmd);
            cmd
        };
        let functions = redis.functions();
        if functions.enabled() {
            let fcall = call("FCALL", &self.function);
            let loads = functions.loads();
            let sent = Instant::now();
            match redis.query(&fcall).await {
                // Boxed, as is the `EVAL` below: every call's future would
                // otherwise carry the rare paths' futures.
                Err(err) if is_missing_function(&err) => {
                    if let Some(done) = Box::pin(load_and_call(redis, &fcall, loads)).await {
                        return done;
                    }
                }
                Err(err) if refuses_functions(&err) => functions.disable(&err),
                result => return (result, sent),
            }
        }
        let sent = Instant::now();
        match redis.query(&call("EVALSHA", &self.sha)).await {
            Err(err) if err.is_noscript() => {
                Box::pin(async {
                    let sent = Instant::now();
                    (redis.query(&call("EVAL", &self.source)).await, sent)
                })
                .await
            }
            result => (result, sent),
        }
    }
}

/// The arguments a script call's command is made room for at once: its
/// name, the script, the key count, the keys, and arguments enough for
/// the acquire's (the one in every request's path). Made to fit, a
/// command is allocated twice and never grown (the acquire's grew up to
/// eight times as its arguments were written); one with more arguments
/// grows beyond, as a `Vec` does.
const CALL_ARGS: usize = 32;

/// The bytes a call of `body` by `name` on `keys` is made room for: its
/// strings, and `CALL_ARGS` integers of up to 20 digits.
fn call_bytes(name: &str, body: &str, keys: &[&str]) -> usize {
    name.len() + body.len() + keys.iter().map(|k| k.len()).sum::<usize>() + CALL_ARGS * 20
}

/// After the server said the function `fcall` calls is missing: loads the
/// library (one load at a time; not again if another call loaded it since
/// `loads`) and sends `fcall` again, with when it was sent. `None` when
/// this call is to run as a script instead.
async fn load_and_call<T: FromRedisValue>(
    redis: &Connections,
    fcall: &Cmd,
    loads: u64,
) -> Option<(Result<T, QueryError>, Instant)> {
    let functions = redis.functions();
    let load = async { redis.query::<redis::Value>(&LIBRARY.load()).await.map(drop) };
    match functions.load_once(loads, load).await {
        Ok(()) => {
            let sent = Instant::now();
            match redis.query(fcall).await {
                // Loaded, yet missing where the call went (a node that
                // joined meanwhile): the script, for this call.
                Err(err) if is_missing_function(&err) => None,
                result => Some((result, sent)),
            }
        }
        Err(err) if refuses_functions(&err) => {
            functions.disable(&err);
            None
        }
        // Not loaded everywhere (a Cluster master down, a server out of
        // memory): the script, for this call.
        Err(err) => {
            tracing::warn!(
                error = %err,
                "could not load the function library; this call runs as a script"
            );
            None
        }
    }
}

static ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new("acquire"));
static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new("release"));
static RENEW: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new("renew"));
static PENALIZE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new("penalize"));
static BACKOFF: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new("backoff"));
static AGREE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new("agree"));
static REGISTER: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new("register"));
static ADOPT: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new("adopt"));

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

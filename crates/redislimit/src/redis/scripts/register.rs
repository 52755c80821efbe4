//! register.lua's arguments and reply (its header says what each is).

use deadpool_redis::redis::Cmd;

use super::{REGISTER, ScriptError};
use crate::redis::pool::Connections;

/// What the registry holds: the ids of the live replicas and of those
/// whose entry lapsed lately.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Roll {
    /// Replicas whose entry is live.
    pub(crate) live: Vec<String>,
    /// Replicas whose entry lapsed within the time asked for: each may be
    /// cut off from Redis, and sending on its own.
    pub(crate) lapsed: Vec<String>,
    /// When each live entry expires (µs on Redis's clock), in the order of
    /// `live`: its last renewal was that less its TTL.
    pub(crate) expiries: Vec<u64>,
    /// Whether this renewal added the replica's entry (its first, or Redis
    /// had lost it) rather than renewing it.
    pub(crate) added: bool,
}

/// Runs register.lua on the scope's registry `key` for this replica's
/// `id`: renews its entry for `ttl_us` (0: reads only), and reads the
/// entries, those lapsed within `keep_us` included.
pub(crate) async fn run(
    redis: &Connections,
    key: &str,
    id: &str,
    ttl_us: u64,
    keep_us: u64,
) -> Result<Roll, ScriptError> {
    let (live, lapsed, expiries, added) = REGISTER
        .run::<(Vec<String>, Vec<String>, Vec<f64>, i64)>(redis, &[key], |cmd: &mut Cmd| {
            cmd.arg(id).arg(ttl_us).arg(keep_us);
        })
        .await?;
    // Scores Redis wrote from whole microseconds: exact as f64.
    let expiries = expiries.into_iter().map(|e| e.max(0.0) as u64).collect();
    Ok(Roll {
        live,
        lapsed,
        expiries,
        added: added == 1,
    })
}

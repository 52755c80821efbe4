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
    /// When each lapsed entry expired (µs on Redis's clock), in the order
    /// of `lapsed`.
    pub(crate) lapsed_expiries: Vec<u64>,
    /// When each live entry was added (µs on Redis's clock; 0 when not
    /// known), in the order of `live`.
    pub(crate) joined: Vec<u64>,
    /// When each lapsed entry was added, in the order of `lapsed`.
    pub(crate) lapsed_joined: Vec<u64>,
    /// Replicas that left within the time asked for (their entries taken
    /// out as they closed).
    pub(crate) left: Vec<String>,
    /// When each of `left` was added, in its order.
    pub(crate) left_joined: Vec<u64>,
    /// When each of `left` left, in its order.
    pub(crate) left_at: Vec<u64>,
}

/// Replies of register.lua: ids and expiries of the live and the lapsed
/// entries, whether this renewal added its own, and when each was added.
type Reply = (
    Vec<String>,
    Vec<String>,
    Vec<f64>,
    i64,
    Vec<f64>,
    Vec<u64>,
    Vec<u64>,
    Vec<String>,
    Vec<u64>,
    Vec<u64>,
);

/// Runs register.lua on the scope's registry `keys` (its entries, and when
/// each was added) for this replica's
/// `id`: renews its entry for `ttl_us` (0: reads only), or takes it out
/// when `leaving`, and reads the entries, those lapsed or left within
/// `keep_us` included.
pub(crate) async fn run(
    redis: &Connections,
    keys: [&str; 2],
    id: &str,
    ttl_us: u64,
    keep_us: u64,
    leaving: bool,
) -> Result<Roll, ScriptError> {
    let reply = REGISTER
        .run::<Reply>(redis, &keys, |cmd: &mut Cmd| {
            cmd.arg(id).arg(ttl_us).arg(keep_us).arg(u8::from(leaving));
        })
        .await?;
    let (live, lapsed, expiries, added, lapsed_expiries, joined, lapsed_joined) = (
        reply.0, reply.1, reply.2, reply.3, reply.4, reply.5, reply.6,
    );
    // Scores Redis wrote from whole microseconds: exact as f64.
    let whole = |scores: Vec<f64>| scores.into_iter().map(|e| e.max(0.0) as u64).collect();
    Ok(Roll {
        live,
        lapsed,
        expiries: whole(expiries),
        added: added == 1,
        lapsed_expiries: whole(lapsed_expiries),
        joined,
        lapsed_joined,
        left: reply.7,
        left_joined: reply.8,
        left_at: reply.9,
    })
}

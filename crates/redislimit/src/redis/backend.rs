//! `Backend`: what one `RedisLimiter` sends to Redis, and through what.
//!
//! It owns the connection, the circuit (every call observes it: see
//! `circuit.rs`), the turns for calls in flight ([`MAX_CALLS`]) and the
//! measures of the way to Redis (the clock's offset, the round trip), and
//! offers one typed method per script. A call fails with a [`CallError`]
//! that says whether it may have run, never with an error to downcast.

use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::circuit::{Circuit, Circuits};
use super::clock::{RedisClock, RoundTrip};
use super::keys::RedisKeys;
use super::pool::{Connections, QueryError, RedisPool};
use super::scripts::{self, ScriptError, acquire, agree, backoff, register};
use super::settings::Args;
use crate::{Error, Op};

/// Acquire calls one limiter has in flight at once, and release calls; more
/// wait their turn in process. A crawl starts with one acquire per host:
/// ten thousand at once from each of eight replicas kept Redis busy for
/// seconds, and their replies outlasted the response timeout (500 ms by
/// default), so the circuit opened and replicas paced alone for a moment.
/// Sixty-four calls keep a replica's queue in Redis to a few milliseconds,
/// and are far more than a process needs when the hosts' slots spread its
/// calls out. Releases (hand-backs and leaving the waiting line among them)
/// take turns of their own: queued behind a crowd of acquires, a release
/// kept its host booked (and those acquires waiting for it) for as long as
/// the crowd took. Renewals, penalties and the heartbeat are few, and go
/// straight.
const MAX_CALLS: usize = 64;

/// Why a call to Redis gave no answer its caller can use.
#[derive(Debug)]
pub(super) enum CallError {
    /// Not sent: Redis failed to answer moments ago (the circuit is open).
    Skipped,
    /// The call failed: no connection, a refusal, a timeout, a connection
    /// lost, an error reply. `may_have_run` when it may have reached Redis
    /// and run though no answer came back (it timed out or lost its
    /// connection after being sent, rather than never leaving).
    Failed { err: QueryError, may_have_run: bool },
    /// Redis answered something the script never returns.
    BadReply(String),
}

impl CallError {
    /// Whether the call may have run in Redis though its caller never heard
    /// the answer (a booking to take back).
    pub(super) fn may_have_run(&self) -> bool {
        matches!(
            self,
            Self::Failed {
                may_have_run: true,
                ..
            }
        )
    }

    /// The error a caller of `op` sees.
    pub(super) fn into_error(self, op: Op) -> Error {
        match self {
            Self::Skipped => Error::unavailable(op, crate::error::Skipped),
            Self::Failed { err, .. } => match super::misconfig::diagnose(&err) {
                Some(cause) => Error::Misconfigured {
                    op,
                    cause,
                    source: err.into_source(),
                },
                None => Error::Unavailable {
                    op,
                    source: err.into_source(),
                },
            },
            Self::BadReply(why) => Error::unavailable(op, why),
        }
    }
}

/// The connection to Redis of one limiter, and the state of the way there.
pub(super) struct Backend {
    redis: Connections,
    circuits: Circuits,
    acquires: Semaphore,
    releases: Semaphore,
    /// Where this process's clock stands against Redis `TIME`.
    clock: RedisClock,
    /// How long a script call takes, as measured here.
    round_trip: RoundTrip,
    /// When Redis last answered a call (µs since `epoch`; 0: never).
    answered_us: std::sync::atomic::AtomicU64,
    epoch: Instant,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("pool", self.redis.pool())
            .field("circuits", &self.circuits)
            .finish_non_exhaustive()
    }
}

impl Backend {
    pub(super) fn new(pool: RedisPool) -> Self {
        Self {
            circuits: Circuits::new(pool.is_cluster()),
            redis: Connections::new(pool),
            acquires: Semaphore::new(MAX_CALLS),
            releases: Semaphore::new(MAX_CALLS),
            clock: RedisClock::default(),
            round_trip: RoundTrip::default(),
            answered_us: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// The pool calls are made through.
    pub(super) fn pool(&self) -> &RedisPool {
        self.redis.pool()
    }

    /// Whether Redis (for a Cluster, the node serving `key`) is skipped
    /// for now after it failed to answer (see [`Circuit::open`]: a caller
    /// may be chosen to probe it).
    pub(super) fn circuit(&self, key: &str) -> &Circuit {
        self.circuits.of(key)
    }

    /// For a Cluster: reads the slot map (`CLUSTER SLOTS`) into the node
    /// circuits, when none was read yet or a node's circuit holds calls
    /// off (a failover moves slots). From the heartbeat, bounded.
    pub(super) async fn map_slots(&self) {
        if !self.circuits.per_node() || (self.circuits.mapped() && !self.circuits.any_waiting()) {
            return;
        }
        let mut slots = deadpool_redis::redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let reply = self
            .redis
            .query::<deadpool_redis::redis::Value>(&slots)
            .await;
        match reply {
            Ok(value) => {
                let map = super::circuit::slot_map(&value);
                if !map.is_empty() {
                    self.circuits.learn(&map);
                }
            }
            Err(err) => tracing::debug!(error = %err, "reading the Cluster slot map failed"),
        }
    }

    /// How late `now` is after `redis_us` on the Redis clock, at most.
    pub(super) fn late(&self, redis_us: u64, now: Instant) -> Duration {
        self.clock.late(redis_us, now)
    }

    /// The round trip of a script call, as measured.
    pub(super) fn round_trip(&self) -> Duration {
        self.round_trip.get()
    }

    /// A turn for an acquire call (see [`MAX_CALLS`]); `None` once the
    /// turns are closed.
    pub(super) async fn acquire_turn(&self) -> Option<SemaphorePermit<'_>> {
        self.acquires.acquire().await.ok()
    }

    /// Takes what a call on `key` said about Redis into its circuit.
    fn observe<T>(&self, key: &str, result: Result<T, ScriptError>) -> Result<T, CallError> {
        self.observe_in(self.circuits.of(key), result)
    }

    fn observe_in<T>(
        &self,
        circuit: &Circuit,
        result: Result<T, ScriptError>,
    ) -> Result<T, CallError> {
        let answered = match &result {
            Ok(_) | Err(ScriptError::BadReply(_)) => true,
            Err(ScriptError::Query(err)) => !super::circuit::not_answering(err),
        };
        if answered {
            let us = u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.answered_us
                .fetch_max(us.max(1), std::sync::atomic::Ordering::Relaxed);
        }
        match result {
            Ok(value) => {
                circuit.answered();
                Ok(value)
            }
            Err(ScriptError::BadReply(why)) => {
                circuit.answered();
                Err(CallError::BadReply(why))
            }
            Err(ScriptError::Query(err)) => {
                circuit.observe_failure(&err);
                Err(classify(err))
            }
        }
    }

    /// The failure domain of the key `key` makes (see
    /// [`Circuits::domain`]); the key is made only for a Cluster.
    pub(super) fn failure_domain(&self, key: impl FnOnce() -> String) -> u32 {
        if self.circuits.per_node() {
            self.circuits.domain(&key())
        } else {
            0
        }
    }

    /// Whether Redis answered a call at or after `at`.
    pub(super) fn answered_since(&self, at: Instant) -> bool {
        let answered = self.answered_us.load(std::sync::atomic::Ordering::Relaxed);
        let since = at.saturating_duration_since(self.epoch).as_micros();
        answered != 0 && u128::from(answered) >= since
    }

    /// Probes the node serving `key` when its circuit holds calls off and
    /// is due to be asked again (`EXISTS key`: nothing changes), so that
    /// an answer closes the circuit; nothing when it answers, or another
    /// call probes it.
    pub(super) async fn probe(&self, key: &str) {
        let circuit = self.circuits.of(key);
        if circuit.closed() || circuit.open() {
            return;
        }
        let mut exists = deadpool_redis::redis::cmd("EXISTS");
        exists.arg(key);
        let _ = self.command::<i64>(key, &exists).await;
    }

    /// `PING`.
    pub(super) async fn ping(&self) -> Result<(), CallError> {
        let pong = self
            .redis
            .query::<String>(&deadpool_redis::redis::cmd("PING"))
            .await
            .map_err(ScriptError::Query);
        self.observe_in(self.circuits.whole(), pong).map(drop)
    }

    /// acquire.lua (see [`acquire::run`]), in a turn the caller took.
    pub(super) async fn acquire(
        &self,
        keys: &RedisKeys,
        token: &str,
        args: &Args,
        lease_ttl_us: u64,
        horizon: Duration,
    ) -> Result<acquire::Reply, CallError> {
        let horizon_us = horizon.as_micros().min(u128::from(u64::MAX)) as u64;
        let (reply, sent) =
            acquire::run(&self.redis, keys, token, args, lease_ttl_us, horizon_us).await;
        if reply.is_ok() {
            self.round_trip.observe(sent.elapsed());
        }
        if let Ok(acquire::Reply::Admitted { now_us, .. }) = &reply {
            self.clock.observe(sent, *now_us);
        }
        self.observe(keys.gate(), reply)
    }

    /// release.lua, in a release turn: whether the token still held its
    /// slot.
    pub(super) async fn release(
        &self,
        keys: &RedisKeys,
        token: &str,
        abandoned: bool,
        args: &Args,
        lease_ttl_us: u64,
    ) -> Result<bool, CallError> {
        let _turn = self.releases.acquire().await;
        let held =
            scripts::release::run(&self.redis, keys, token, abandoned, args, lease_ttl_us).await;
        self.observe(keys.gate(), held)
    }

    /// The completions of lease-mode requests `leases` in one pipeline, in
    /// one release turn (see [`scripts::release::complete_leases`]);
    /// observed by the whole of Redis's circuit (not used for a Cluster).
    pub(super) async fn complete_leases(
        &self,
        leases: &[(&RedisKeys, &str, u32)],
    ) -> Result<Vec<bool>, CallError> {
        let _turn = self.releases.acquire().await;
        let held = scripts::release::complete_leases(&self.redis, leases)
            .await
            .map_err(ScriptError::Query);
        self.observe_in(self.circuits.whole(), held)
    }

    /// renew.lua: whether the token still held its slot.
    pub(super) async fn renew(
        &self,
        keys: &RedisKeys,
        token: &str,
        args: &Args,
        lease_ttl_us: u64,
    ) -> Result<bool, CallError> {
        let renewed = scripts::renew::run(&self.redis, keys, token, args, lease_ttl_us).await;
        self.observe(keys.gate(), renewed)
    }

    /// adopt.lua, for a request sent `ago_us` ago: whether it holds a slot.
    pub(super) async fn adopt(
        &self,
        keys: &RedisKeys,
        token: &str,
        args: &Args,
        lease_ttl_us: u64,
        ago_us: u64,
    ) -> Result<bool, CallError> {
        let adopted =
            scripts::adopt::run(&self.redis, keys, token, args, lease_ttl_us, ago_us).await;
        self.observe(keys.gate(), adopted)
    }

    /// penalize.lua on `gate`: a hold, a byte debt or a stated cap.
    pub(super) async fn penalize(
        &self,
        gate: &str,
        hold_us: u64,
        lease_ttl_us: u64,
        kind: scripts::penalize::Kind,
    ) -> Result<(), CallError> {
        let penalized =
            scripts::penalize::run(&self.redis, gate, hold_us, lease_ttl_us, kind).await;
        self.observe(gate, penalized).map(drop)
    }

    /// backoff.lua on `gate`: the gap in force (µs; 0: not backing off).
    pub(super) async fn back_off(
        &self,
        gate: &str,
        step: backoff::Step,
        lease_ttl_us: u64,
    ) -> Result<u64, CallError> {
        let gap = backoff::run(&self.redis, gate, step, lease_ttl_us).await;
        self.observe(gate, gap)
    }

    /// agree.lua on the scope's record `keys` (the record and its `since`).
    pub(super) async fn agree(
        &self,
        keys: [&str; 2],
        settings: &str,
        ttl_us: u64,
        claim: u64,
        extend: bool,
    ) -> Result<agree::Reply, CallError> {
        let reply = agree::run(&self.redis, keys, settings, ttl_us, claim, extend).await;
        self.observe(keys[0], reply)
    }

    /// register.lua on the scope's registry `keys` (its entries, and when
    /// each was added): renews `id`'s entry for
    /// `ttl_us` (0: reads only) and reads the live replicas and those
    /// lapsed within `keep_us`.
    pub(super) async fn register(
        &self,
        keys: [&str; 2],
        id: &str,
        ttl_us: u64,
        keep_us: u64,
    ) -> Result<register::Roll, CallError> {
        let roll = register::run(&self.redis, keys, id, ttl_us, keep_us, false).await;
        self.observe(keys[0], roll)
    }

    /// Takes `id`'s entry out of the registry `keys` (register.lua,
    /// leaving): a replica that closes leaves, so that the others do not
    /// keep its share free as a lapsed one's, and its departure is kept
    /// for `keep_us` (a replica cut off meanwhile still counts it).
    pub(super) async fn leave(
        &self,
        keys: [&str; 2],
        id: &str,
        keep_us: u64,
    ) -> Result<(), CallError> {
        let done = register::run(&self.redis, keys, id, 0, keep_us, true).await;
        self.observe(keys[0], done).map(drop)
    }
}

/// Plain commands on one key, for `SharedCache` and `SharedQueue`.
impl Backend {
    /// `cmd`, on the node serving `key`, observed by that node's circuit.
    pub(super) async fn command<T: deadpool_redis::redis::FromRedisValue>(
        &self,
        key: &str,
        cmd: &deadpool_redis::redis::Cmd,
    ) -> Result<T, CallError> {
        let reply = self.redis.query(cmd).await.map_err(ScriptError::Query);
        self.observe(key, reply)
    }

    /// `GET key`: the bytes kept there, if any. A key of another type
    /// (garbage) holds none: the next `SET` replaces it.
    pub(super) async fn get_bytes(&self, key: &str) -> Result<Option<Vec<u8>>, CallError> {
        let mut get = deadpool_redis::redis::cmd("GET");
        get.arg(key);
        let got = match self.redis.query(&get).await {
            Err(QueryError::Redis(e)) if e.code() == Some("WRONGTYPE") => Ok(None),
            got => got.map_err(ScriptError::Query),
        };
        self.observe(key, got)
    }

    /// `SET key value NX PX ms`: whether `value` was set (the key was free).
    pub(super) async fn set_if_free(
        &self,
        key: &str,
        value: &str,
        keep: Duration,
    ) -> Result<bool, CallError> {
        let mut set = deadpool_redis::redis::cmd("SET");
        set.arg(key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(millis(keep));
        let set = self
            .redis
            .query::<Option<String>>(&set)
            .await
            .map_err(ScriptError::Query);
        self.observe(key, set).map(|ok| ok.is_some())
    }

    /// `SET key value PX ms` (whatever the key held, of whatever type),
    /// then `DEL done` (a claim the value ends).
    pub(super) async fn set_bytes(
        &self,
        key: &str,
        value: &[u8],
        keep: Duration,
        done: Option<&str>,
    ) -> Result<(), CallError> {
        let mut set = deadpool_redis::redis::cmd("SET");
        set.arg(key).arg(value).arg("PX").arg(millis(keep));
        let set = self
            .redis
            .query::<deadpool_redis::redis::Value>(&set)
            .await
            .map_err(ScriptError::Query);
        self.observe(key, set)?;
        if let Some(done) = done {
            self.delete(done).await?;
        }
        Ok(())
    }

    /// `DEL key`.
    pub(super) async fn delete(&self, key: &str) -> Result<(), CallError> {
        let mut del = deadpool_redis::redis::cmd("DEL");
        del.arg(key);
        let del = self
            .redis
            .query::<deadpool_redis::redis::Value>(&del)
            .await
            .map_err(ScriptError::Query);
        self.observe(key, del).map(drop)
    }
}

/// `keep` in whole milliseconds, at least 1 (a `PX` of 0 is refused).
fn millis(keep: Duration) -> u64 {
    u64::try_from(keep.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A failed call, and whether it may have run.
fn classify(err: QueryError) -> CallError {
    let may_have_run = matches!(
        &err,
        QueryError::Redis(e) if e.is_timeout() || e.is_io_error() || e.is_connection_dropped()
    );
    CallError::Failed { err, may_have_run }
}

//! `RedisLimiter`: one per-host limit shared by every replica through Redis.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::acquire;
use super::core::Core;
use super::keys::RedisKeys;
use super::lifecycle::Busy;
use super::ops;
use super::registry::RegistryPlan;
use super::settings::Mode;
use crate::snapshot::Snapshot;
use crate::{
    BackoffStep, BoxFuture, DomainLimiter, Error, FallbackLimiter, Hooks, HostKey, Limiter,
    NoHooks, Op, Pacing, Permit, Policies, RequestPacing, Spacing,
};

/// Paces requests per host with the state held in Redis, so every replica
/// counts against one limit instead of one limit each.
///
/// Each acquire costs one script call (EVALSHA) when the host is free;
/// the script reads the clock with Redis `TIME`, so replicas need not agree
/// on the time. The answer is admission, or how long to wait: the caller
/// sleeps exactly that (plus jitter) and asks again. Nothing is booked for
/// a caller that gives up; one that had been told to wait gives up its
/// place in the waiting line (below) with one call off its path. Releases
/// are sent off the caller's path, on a spawned task.
///
/// # The waiting line
///
/// Replicas saturating a host take turns: a request of weight 1 that Redis
/// told to wait joins the host's waiting line (a hash beside its gate) and
/// keeps its place while it asks again in time (within its retry interval,
/// jitter, slot margin and 100 ms after the wait it was told); every
/// waiter that joined earlier goes first. In serialized mode, or with a
/// `min_delay`, one at a time; in lease mode without one, each waiter ahead
/// keeps a slot of the cap. Within a process, waiters still queue in
/// priority and arrival order, and one of them asks Redis at a time. A
/// waiter whose process died holds the line up until its place lapses; one
/// whose caller gave up sends one call to leave it (none while the circuit
/// is open: the place then lapses). Heavier requests stay out of the line
/// and are never held back by it (best fit, as in process). Keyed by
/// registrable domain, hosts of one domain under different rules wait in
/// lines of their own, each admitted on its rule's terms.
///
/// # Two modes
///
/// **Serialized** (`cluster_concurrency = 0`, the default): requests to one
/// host never overlap anywhere in the cluster, and each send is at least
/// `min_delay` after the previous *completion*. The sender holds the host
/// until it releases; if its replica dies mid-request, the host is blocked
/// at most `lease_ttl`, and the next send still waits `min_delay` after that
/// lease ended. Pick it for upstreams that punish bursts or count gaps: it
/// is the politest pacing, and the slowest — replicas add no throughput.
///
/// **Lease** (`cluster_concurrency = N > 0`): at most N requests to a host
/// in flight across all replicas, each holding a lease (a sorted set entry
/// scored by its deadline), and sends at least `min_delay` apart. A dead
/// replica's slot returns when its lease deadline passes. Pick it for
/// upstreams that count requests per window (APIs, search engines): it is
/// the mode where N replicas get up to N times one replica's throughput.
///
/// Both modes also apply the sliding-window `quota` (admissions are
/// counted as they happened, so no burst is banked) and
/// [`penalize`](Limiter::penalize), which holds a host back on every
/// replica and only ever extends a hold.
///
/// # Late admissions
///
/// Redis admits on time, but its answer can reach a busy process late (a
/// crawl over thousands of hosts on a few cores reads it milliseconds
/// later), and a request that then leaves late comes closer than the gap
/// to the next one, which another replica may send on time. In lease mode
/// with a `min_delay`, or under a quota, each acquire therefore asks Redis
/// to keep *room* after its slot for how late this process's admissions
/// have been reaching it lately (measured against the Redis clock through
/// Tokio's monotonic clock, so the process's wall clock plays no part; the
/// room follows the latest lateness and halves every 2 s once sends are on
/// time again, at most `lease_ttl / 2`): the next send waits `min_delay`
/// after the room, and the quota counts the admission from its end. An
/// admission that reaches its caller later than its room and
/// [`max_lateness`](crate::RedisLimiterBuilder::max_lateness) (2 ms by default)
/// is handed back as never sent and asked for again with room for twice
/// its lateness, so it is sent on its next turn unless the process grows
/// later still; it is never sent beyond its room. The upstream then sees no
/// gap shorter than `min_delay` less `max_lateness` from lateness on the way
/// to the caller; a request that leaves late after its permit was granted
/// is beyond the limiter's sight. The room costs the hosts of a late
/// process as much of their pace, and only while it is late; a busy
/// process says so in a warning at most once a minute, with counts.
///
/// # How a quota is kept
///
/// A quota of up to 16 per window keeps each admission's instant (a sorted
/// set, about 60 bytes per admission). A larger one counts admissions in
/// 32 buckets per window, each with the latest instant admitted in it (a
/// hash of under a kilobyte, whatever the quota: a million an hour takes
/// the same room as fifty a second). A bucket counts until its latest
/// admission has left the window, so the quota is never exceeded; the cost
/// is that an admission may keep counting for up to one bucket's width
/// (the window / 32) after it left: a request may wait up to that much
/// longer than with each instant kept. Admissions made at one instant (a
/// burst) are counted exactly.
///
/// # Sizing `lease_ttl`
///
/// `lease_ttl` is how long a slot stays booked when its holder stops
/// answering; it is a crash bound, not a request timeout. A permit held for
/// longer renews its lease every `lease_ttl / 2`, so a long download is
/// never overtaken while its process lives. A renewal that fails (Redis
/// slow or unreachable, a stalled connection) is retried at once with a
/// short backoff (20 ms, doubling up to `lease_ttl / 8`) for as long as the
/// lease may be alive: only a stall longer than the time left on the lease
/// (at least `lease_ttl / 2`) can lose the slot. A lost lease is reported
/// through [`Hooks::on_error`] with [`Op::Renew`] and a `tracing` warning.
/// A permit's first renewal is booked, and started by one task per limiter
/// on the runtime where the limiter granted its first permit; when that
/// runtime shuts down, the permits still booked renew on their own
/// runtimes. A limiter shared by several runtimes should not be first used
/// on one that is kept but no longer driven (a current-thread runtime
/// outside `block_on`): its first renewals would wait for it.
/// Too short, and a pause of half of it (a stalled event loop, Redis
/// unreachable for a moment) can let a live request's slot go; too long,
/// and a crashed replica strands its slot (serialized mode: the whole
/// host) that long.
/// Set it to a few times the time a Redis round trip can take in a bad
/// moment, and no longer than you can afford a host to sit idle after a
/// crash: 10-30 s suits most crawlers.
///
/// # Degraded mode
///
/// [`with_fallback`](Self::with_fallback) keeps retrieval going while Redis
/// is unavailable, and keeps it polite: each limiter announces itself in
/// its scope's registry (one heartbeat a second), so every replica knows
/// how many peers were live just before the outage, and the
/// [`FallbackPolicy`](crate::FallbackPolicy) decides how they divide each
/// host's limits meanwhile (by default each takes its share, in turns). A
/// request admitted in-process and still in flight when Redis answers
/// again is registered there (as the serialized holder or a lease) before
/// this replica admits anything else for its host.
///
/// # Configuration agreement
///
/// Replicas that share a scope must admit with the same settings, or the
/// scope has no one limit: the first replica to acquire records the
/// settings that decide admission (the mode and `cluster_concurrency`,
/// `min_delay`, `quota` and `window`, `lease_ttl`) in the scope, and a
/// replica whose settings differ is refused with [`Error::ConfigMismatch`],
/// which names both, at its first acquire or at
/// [`check_config`](Self::check_config). The record expires once the
/// replicas with its settings have been idle for the scope's longest window
/// (the quota window, or `lease_ttl` + `min_delay`) plus a second, so a
/// rollout that drains the old replicas first registers the new settings.
/// Settings that shape one process only (timeouts, hooks, the in-process
/// `max_concurrent`, jitter, the fallback) are not compared. The cost is
/// one round trip per replica when the record is first seen and then once
/// per half of its lifetime, not one per admission.
///
/// # Timeouts
///
/// The limiter imposes no Redis timeouts of its own (an acquire may
/// legitimately sleep for minutes between attempts): they come from the
/// pool and its connections, see [`RedisPool`](crate::RedisPool) and [`RedisTimeouts`](crate::RedisTimeouts).
/// Every failure is returned as [`Error::Unavailable`]; wrap the limiter in
/// a [`FallbackLimiter`] ([`with_fallback`](Self::with_fallback)) so
/// retrieval goes on, paced in-process, while Redis is away.
///
/// A call is also bounded by the caller's deadline (a call that starts at
/// the deadline, because the host frees just in time, still gets 50 ms to
/// be answered). A deadline that runs out is always [`Error::WaitBudget`],
/// never `Unavailable`, and reports no error: it says nothing about Redis.
///
/// After Redis itself fails to answer (no connection, refused, reset, a
/// response timeout of the pool), acquires and penalties skip it and fail
/// at once for a second, then one caller probes it: a frozen Redis costs
/// one timeout a second, not one per request. Any answer from Redis, to
/// any call (an error reply included), closes that circuit again. An
/// acquire refused by it never reached Redis and sends nothing there.
///
/// ```no_run
/// use std::time::Duration;
/// use redislimit::{Limiter, Pacing, RedisLimiter, RedisPool, RedisTimeouts};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = RedisPool::standalone("redis://127.0.0.1:6379/", RedisTimeouts::default())?;
/// let pacing = Pacing::builder().min_delay(Duration::from_millis(500)).build()?;
/// let limiter = RedisLimiter::builder(pool, "domain")
///     .pacing(pacing)
///     .cluster_concurrency(4)
///     .lease_ttl(Duration::from_secs(15))
///     .build()?
///     .with_fallback();
///
/// let url = "https://example.com/".parse()?;
/// let permit = limiter.acquire("crawler", &url, None).await?;
/// // ... send the request, read the body, drop the permit.
/// # drop(permit); Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLimiter {
    core: Arc<Core>,
    /// False under a [`FallbackLimiter`], which reports the waits itself.
    report_waits: bool,
}

impl RedisLimiter {
    /// The default lease TTL.
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
    /// The shortest lease TTL accepted: a lease is renewed every half TTL,
    /// and a renewal is a Redis round trip.
    pub const MIN_LEASE_TTL: Duration = Duration::from_millis(100);
    /// The longest default retry interval while a host's in-flight cap is
    /// taken (see [`RedisLimiterBuilder::concurrency_retry`](crate::RedisLimiterBuilder::concurrency_retry)).
    pub const DEFAULT_CONCURRENCY_RETRY: Duration = Duration::from_millis(50);
    /// How far ahead of its slot a waiter is booked by default (see
    /// [`RedisLimiterBuilder::book_ahead`](crate::RedisLimiterBuilder::book_ahead)).
    pub const DEFAULT_BOOK_AHEAD: Duration = Duration::ZERO;
    /// How long after its host's slot a waiter aims to reach Redis by
    /// default (see [`RedisLimiterBuilder::slot_margin`](crate::RedisLimiterBuilder::slot_margin)).
    pub const DEFAULT_SLOT_MARGIN: Duration = Duration::from_micros(100);
    /// How late an admission may reach its caller and still be sent, by
    /// default (see [`RedisLimiterBuilder::max_lateness`](crate::RedisLimiterBuilder::max_lateness)).
    pub const DEFAULT_MAX_LATENESS: Duration = Duration::from_millis(2);

    /// A limiter made of `core`, reporting its waits.
    pub(super) fn from_core(core: Core) -> Self {
        Self {
            core: Arc::new(core),
            report_waits: true,
        }
    }

    /// The pacing of hosts no rule matches.
    pub fn pacing(&self) -> &Pacing {
        self.core.settings.policies.default_pacing()
    }

    /// The pacing of every host.
    pub fn policies(&self) -> &Policies {
        &self.core.settings.policies
    }

    /// The cross-replica in-flight cap per host (of hosts whose rule sets
    /// none); 0 in serialized mode.
    pub fn cluster_concurrency(&self) -> u32 {
        self.core.settings.cluster_concurrency
    }

    /// How long a slot stays booked without a release or renewal.
    pub fn lease_ttl(&self) -> Duration {
        self.core.settings.lease_ttl
    }

    /// The Redis keys that hold `host`'s state (under its key, see
    /// [`KeyBy`](crate::KeyBy)), for inspecting or clearing it by hand.
    /// Keyed by registrable domain, `waiting` is the line of `host`'s rule
    /// only: hosts of the domain under other rules wait in lines of their
    /// own (see [`RedisKeys::in_lane`]).
    pub fn keys(&self, host: &HostKey) -> RedisKeys {
        self.core.settings.keys(host)
    }

    /// The pacing an in-process fallback should apply while Redis is away:
    /// this limiter's pacing, with at most one request in flight per host and
    /// `min_delay` after sends and completions in serialized mode, and
    /// `cluster_concurrency` in flight with `min_delay` between sends in
    /// lease mode.
    pub fn fallback_pacing(&self) -> Pacing {
        self.fallback_policies().default_pacing().clone()
    }

    /// [`fallback_pacing`](Self::fallback_pacing) for every policy: the
    /// same rules and keying, each rule's pacing made the same way with
    /// its own cap.
    pub fn fallback_policies(&self) -> Policies {
        let settings = &self.core.settings;
        settings.policies.map(|i, pacing| {
            let mode = settings.args[i].mode;
            let pacing = pacing.clone().with_max_concurrent(mode.in_flight());
            match mode {
                Mode::Serialized => pacing.with_spacing(Spacing::SendsAndCompletions),
                // Lease mode spaces sends only; so must its fallback, or it
                // would slow every request down while Redis is healthy.
                Mode::Lease(_) => pacing.with_spacing(Spacing::Sends),
            }
        })
    }

    /// Checks that Redis answers a `PING`, within the pool's timeouts: a way
    /// to refuse to start against a Redis that is not there.
    pub async fn ping(&self) -> Result<(), Error> {
        self.core
            .backend
            .ping()
            .await
            .map_err(|e| e.into_error(Op::Ping))
    }

    /// Checks now that the scope admits with this limiter's settings (see
    /// "Configuration agreement" on [`RedisLimiter`]), recording them when
    /// the scope has none: [`Error::ConfigMismatch`] names both
    /// configurations when another replica's settings hold the scope, and
    /// [`Error::Unavailable`] says Redis could not be asked. A program calls
    /// it before sending anything, to refuse to start instead of failing
    /// its first request.
    pub async fn check_config(&self) -> Result<(), Error> {
        let core = &self.core;
        core.agreement
            .agree(&core.backend, &*core.hooks, true)
            .await
    }

    /// The settings this limiter records for its scope and compares with
    /// the other replicas' (see [`check_config`](Self::check_config)).
    pub fn config_record(&self) -> &str {
        self.core.agreement.settings()
    }

    /// Puts this limiter on top of in-process pacing with
    /// [`fallback_pacing`](Self::fallback_pacing), which carries on while
    /// Redis is unavailable; see [`FallbackLimiter`]. While it does, the
    /// replicas together keep each host's limits as the
    /// [`FallbackPolicy`](crate::FallbackPolicy) of this limiter says (by
    /// default they share them), using the replica registry every limiter
    /// keeps up from its first acquire (one heartbeat a second, off the
    /// admission path). The hooks move
    /// to the fallback limiter, which reports each decision once; this
    /// limiter keeps reporting its errors.
    pub fn with_fallback(mut self) -> FallbackLimiter<Self> {
        let hooks = Arc::clone(&self.core.hooks);
        let fallback = DomainLimiter::new(self.fallback_policies());
        let plan = Arc::new(RegistryPlan {
            registry: Arc::clone(&self.core.registry),
            settings: Arc::clone(&self.core.settings),
        });
        self.report_waits = false;
        FallbackLimiter::new(self, fallback)
            .with_hooks(hooks)
            .with_outage_plan(plan)
    }
}

impl fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.core.settings;
        f.debug_struct("RedisLimiter")
            .field("pool", self.core.backend.pool())
            .field("prefix", &s.prefix)
            .field("scope", &s.scope)
            .field("policies", &s.policies)
            .field("cluster_concurrency", &s.cluster_concurrency)
            .field("lease_ttl", &s.lease_ttl)
            .field("concurrency_retry", &s.concurrency_retry)
            .finish_non_exhaustive()
    }
}

impl Limiter for RedisLimiter {
    fn acquire_host<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<Permit, Error>> {
        self.acquire_with(engine, host, deadline, RequestPacing::default())
    }

    /// The priority orders this process's waiters, in its in-process queues.
    /// The weight counts in Redis (`weight` members of the leases and
    /// admits sets); above the cross-replica cap (1 in serialized mode) or
    /// the quota it fails with [`Error::InvalidWeight`]. In this process a
    /// request waits at weight 1 until Redis admits it, and requests
    /// heavier than 1 ask Redis in a line of their own: one Redis refuses
    /// for want of room never holds up lighter ones behind it.
    fn acquire_with<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> BoxFuture<'a, Result<Permit, Error>> {
        let hooks: &dyn Hooks = if self.report_waits {
            &*self.core.hooks
        } else {
            &NoHooks
        };
        Box::pin(async move {
            let core = &self.core;
            let lifecycle = &core.lifecycle;
            // Counted until the inner acquire (and the booking it may
            // leave behind) is gone: `close` waits for it.
            let _busy = Busy::new(lifecycle);
            // Listening before the flag is read: a close in between still
            // wakes this acquire.
            let closing = lifecycle.closing().notified();
            tokio::pin!(closing);
            closing.as_mut().enable();
            if lifecycle.is_closed() {
                return Err(Error::Closed);
            }
            let acquired = tokio::select! {
                biased;
                acquired = acquire(core, hooks, engine, host, deadline, request) => acquired,
                // The acquire is dropped, as a cancelled one: it books nothing.
                () = closing => Err(Error::Closed),
            };
            match acquired {
                // Admitted as the limiter closed: given back unsent.
                Ok(permit) if lifecycle.is_closed() => {
                    permit.abandon();
                    Err(Error::Closed)
                }
                acquired => acquired,
            }
        })
    }

    fn close(&self, deadline: Option<Instant>) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(ops::close(&self.core, deadline))
    }

    fn penalize_host<'a>(
        &'a self,
        host: HostKey,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(ops::penalize(&self.core, host, hold))
    }

    fn adopt_host<'a>(
        &'a self,
        host: HostKey,
        ago: Duration,
        weight: u32,
    ) -> BoxFuture<'a, Result<Option<Permit>, Error>> {
        Box::pin(ops::adopt(&self.core, host, ago, weight))
    }

    fn report_hold(&self, host: &HostKey, cause: &str, hold: Duration) {
        // Under a fallback limiter, which reports it to the same hooks.
        if self.report_waits {
            let key = self.core.settings.policies.key(host);
            self.core.hooks.on_hold(&key, cause, hold);
        }
    }

    /// This process's view: waiting counts the acquires queued here and
    /// those asking Redis; in flight, the permits held. The next send and
    /// penalties live in Redis (see [`keys`](RedisLimiter::keys)), so they
    /// are `None`.
    fn snapshot(&self, top: usize) -> Snapshot {
        ops::snapshot(&self.core, top)
    }

    /// Kept in the host's gate hash (its `backoff` field), so every
    /// replica widens and narrows the same gap.
    fn back_off_host<'a>(
        &'a self,
        host: HostKey,
        step: BackoffStep,
    ) -> Option<BoxFuture<'a, Result<Option<Duration>, Error>>> {
        Some(Box::pin(ops::back_off(&self.core, host, step)))
    }
}

//! `RedisLimiter`: one per-host limit shared by every replica through Redis.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use deadpool_redis::redis::{Cmd, RedisError};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::agreement::Agreement;
use super::circuit::Circuit;
use super::clock::{RedisClock, RoundTrip};
use super::keys::{RedisKeys, check_name};
use super::lateness::{Lateness, Verdict, verdict};
use super::pool::{Connections, QueryError, RedisPool};
use super::registry::{FallbackPolicy, Registry, RegistryPlan};
use super::renew::{Renewal, Renewals};
use super::script::{ACQUIRE, ADOPT, AcquireReply, BACKOFF, PENALIZE, RELEASE};
use crate::hooks::WaitReport;
use crate::limiter::heaviest;
use crate::pacing::{after, micros};
use crate::permit::Unsent;
use crate::snapshot::{HostSnapshot, PacedBy, Snapshot, TopHosts};
use crate::{
    BackoffStep, BoxFuture, ConfigError, DomainLimiter, Error, FallbackLimiter, Hooks, HostKey,
    Limiter, NoHooks, Op, Pacing, Permit, Policies, RequestPacing, Spacing, WaitOutcome,
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
/// [`max_lateness`](RedisLimiterBuilder::max_lateness) (2 ms by default)
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
/// pool and its connections, see [`RedisPool`] and [`RedisTimeouts`](crate::RedisTimeouts).
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
    shared: Arc<Shared>,
    /// False under a [`FallbackLimiter`], which reports the waits itself.
    report_waits: bool,
}

pub(super) struct Shared {
    pub(super) redis: Connections,
    pub(super) prefix: String,
    pub(super) scope: String,
    pub(super) policies: Policies,
    /// The limiter's own cross-replica cap (rules may set their own).
    pub(super) cluster_concurrency: u32,
    pub(super) lease_ttl: Duration,
    /// The first renewals of the permits held, not yet due.
    pub(super) renewals: Arc<Renewals>,
    pub(super) concurrency_retry: Duration,
    /// How far ahead of its slot a waiter may be booked.
    pub(super) book_ahead: Duration,
    /// How long after its host's slot a waiter aims to reach Redis.
    pub(super) slot_margin: Duration,
    /// How long a script call takes, as measured here.
    pub(super) round_trip: RoundTrip,
    /// How late an admission may reach its caller and still be sent.
    pub(super) max_lateness: Duration,
    /// Where this process's clock stands against Redis `TIME`.
    pub(super) redis_clock: RedisClock,
    /// How late this process's sends leave, and the room its acquires
    /// ask for.
    pub(super) lateness: Lateness,
    pub(super) hooks: Arc<dyn Hooks>,
    /// The per-process cap and FIFO order; records no hooks of its own.
    pub(super) local: DomainLimiter,
    /// One Redis caller per host at a time in this process, in FIFO order
    /// (by priority): requests of weight 1, and (`heavy_pollers`) heavier
    /// ones.
    pub(super) pollers: DomainLimiter,
    pub(super) heavy_pollers: DomainLimiter,
    /// Releases spawned and not yet answered, and a wake-up when one is.
    pub(super) releases: AtomicUsize,
    pub(super) released: Notify,
    /// Acquires under way (see [`Busy`]).
    pub(super) acquiring: AtomicUsize,
    /// Set by [`Limiter::close`]; `closing` wakes the acquires under way.
    pub(super) closed: AtomicBool,
    pub(super) closing: Notify,
    /// Whether Redis is skipped for now after it failed to answer.
    pub(super) circuit: Circuit,
    /// Turns for the acquire calls in flight at once, and for the release
    /// calls (see [`MAX_CALLS`]).
    pub(super) calls: tokio::sync::Semaphore,
    pub(super) release_calls: tokio::sync::Semaphore,
    /// This limiter's part in its scope's configuration record.
    pub(super) agreement: Agreement,
    /// This limiter's entry in its scope's replica registry.
    pub(super) registry: Registry,
    /// What its fallback does while Redis is unavailable.
    pub(super) fallback_policy: FallbackPolicy,
    /// How many replicas to assume when the registry was never seen.
    pub(super) expected_replicas: u32,
    /// Script arguments, in microseconds.
    pub(super) lease_ttl_us: u64,
    /// The script arguments of each policy (see [`Policies::index`]).
    pub(super) args: Box<[Args]>,
}

/// What the scripts are told of one policy's pacing.
#[derive(Debug, Clone, Copy)]
pub(super) struct Args {
    /// The cross-replica cap; 0 in serialized mode.
    pub(super) cap: u32,
    pub(super) min_delay_us: u64,
    pub(super) quota: u32,
    pub(super) window_us: u64,
    /// The longest wait this policy can ask for.
    pub(super) max_wait_us: u64,
    /// The weight of the request (1 in the policy's own arguments): how
    /// many members it is in the leases and admits sets.
    pub(super) weight: u32,
    /// 0 when the quota keeps each admission; else the width of its
    /// buckets (see [`quota_buckets`]).
    pub(super) bucket_us: u64,
    /// When the request was admitted, on the Redis clock (0 until it is,
    /// or when unknown): where a bucketed quota counted it (its slot plus
    /// its room).
    pub(super) admitted_us: u64,
    /// How late after its slot its send may leave (see `lateness.rs`):
    /// the room the acquire asks Redis to keep; 0 where lateness cannot
    /// bring a send too close to another (see [`Args::sends_late`]).
    pub(super) room_us: u64,
    /// How long after the wait it was told a waiter of weight 1 will have
    /// asked again at the latest (the retry, jitter, slot margin and
    /// [`LINE_SLACK`]): it keeps its place in the waiting line across
    /// replicas until then, or longer if it asks again before another
    /// waiter finds the place lapsed.
    pub(super) patience_us: u64,
}

/// Slack for a waiter that asks again late (its process busy) before it
/// loses its place in the waiting line; also about how long a waiter that
/// died in line holds up the others.
pub(super) const LINE_SLACK: Duration = Duration::from_millis(100);

/// Quotas up to this many admissions per window keep each admission in
/// Redis (a sorted set of tokens, about 60 bytes each); larger ones keep
/// [`QUOTA_BUCKETS`] counters per window instead, bounded whatever the
/// quota.
pub(super) const EXACT_QUOTA_MAX: u32 = 16;

/// How many buckets a window of a large quota is counted in.
pub(super) const QUOTA_BUCKETS: u64 = 32;

/// The bucket width (µs) of a quota of `quota` per `window_us`, or 0 when
/// each admission is kept.
pub(super) fn quota_buckets(quota: u32, window_us: u64) -> u64 {
    if quota > EXACT_QUOTA_MAX {
        window_us.div_ceil(QUOTA_BUCKETS).max(1)
    } else {
        0
    }
}

/// Builds a [`RedisLimiter`]; see its documentation for the controls.
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedisLimiterBuilder {
    pool: RedisPool,
    prefix: String,
    scope: String,
    policies: Policies,
    cluster_concurrency: u32,
    lease_ttl: Duration,
    concurrency_retry: Option<Duration>,
    book_ahead: Duration,
    slot_margin: Duration,
    max_lateness: Duration,
    hooks: Arc<dyn Hooks>,
    fallback_policy: FallbackPolicy,
    expected_replicas: u32,
}

impl fmt::Debug for RedisLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiterBuilder")
            .field("prefix", &self.prefix)
            .field("scope", &self.scope)
            .field("policies", &self.policies)
            .field("cluster_concurrency", &self.cluster_concurrency)
            .field("lease_ttl", &self.lease_ttl)
            .field("concurrency_retry", &self.concurrency_retry)
            .field("book_ahead", &self.book_ahead)
            .field("slot_margin", &self.slot_margin)
            .field("max_lateness", &self.max_lateness)
            .field("fallback_policy", &self.fallback_policy)
            .field("expected_replicas", &self.expected_replicas)
            .finish_non_exhaustive()
    }
}

impl RedisLimiterBuilder {
    /// What the fallback of [`RedisLimiter::with_fallback`] does while Redis
    /// is unavailable (default [`FallbackPolicy::Share`]); see
    /// [`FallbackPolicy`]. Not part of the configuration agreement: it
    /// shapes this process only.
    pub fn fallback_policy(mut self, policy: FallbackPolicy) -> Self {
        self.fallback_policy = policy;
        self
    }

    /// How many replicas the fallback policy assumes when this limiter never
    /// saw the replica registry (it started while Redis was away); default
    /// 1. Set it to the number of replicas you run.
    pub fn expected_replicas(mut self, n: u32) -> Self {
        self.expected_replicas = n.max(1);
        self
    }

    /// The key namespace shared by every scope (default `redislimit`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The pacing of every host (default: [`Pacing::default`]); replaces
    /// any [`policies`](Self::policies) set before.
    pub fn pacing(mut self, pacing: Pacing) -> Self {
        self.policies = Policies::new(pacing);
        self
    }

    /// A default pacing, per-host rules and keying (see [`Policies`]); the
    /// rules are part of the configuration agreement, so replicas with
    /// other rules are refused as with other settings. A rule's own
    /// [`cluster_concurrency`](crate::Rule::with_cluster_concurrency)
    /// replaces this builder's for its hosts.
    pub fn policies(mut self, policies: Policies) -> Self {
        self.policies = policies;
        self
    }

    /// The cap on requests in flight per host across all replicas; 0 (the
    /// default) selects serialized mode. Also raises the per-process
    /// `max_concurrent` when it is smaller, so one process never keeps the
    /// cluster below its cap.
    pub fn cluster_concurrency(mut self, n: u32) -> Self {
        self.cluster_concurrency = n;
        self
    }

    /// How long a slot stays booked without a release or a renewal
    /// (default 30 s); see "Sizing `lease_ttl`" on [`RedisLimiter`].
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How soon to ask again when the host's in-flight cap is taken
    /// (plus jitter). A slot frees on another replica's release, which
    /// nothing announces, so this is a short retry.
    ///
    /// The default is 50 ms, or `min_delay` when that is shorter: in
    /// serialized mode no send can follow the release it waits for by less
    /// than `min_delay`, so a waiter that asks at least that often is
    /// admitted at the first allowed instant and the host's pace loses
    /// nothing to polling.
    pub fn concurrency_retry(mut self, retry: Duration) -> Self {
        self.concurrency_retry = Some(retry);
        self
    }

    /// How far ahead of its slot a waiter may be booked (default zero:
    /// only when the host is free). A waiter that asks Redis within this
    /// of its host's next allowed send is booked for that instant at once
    /// and sends at it, timed in process to a fraction of a millisecond.
    /// The booking counts (in flight, in the quota, for the gap) from its
    /// slot; an acquire dropped before it hands it back. Hosts whose
    /// pacing has jitter are never booked ahead. Not part of the
    /// configuration agreement: it shapes this process's timing only. At
    /// most `lease_ttl`.
    ///
    /// Without it a waiter asks again so as to reach Redis
    /// [`slot_margin`](Self::slot_margin) after its slot, and is admitted
    /// then. A booked waiter loses nothing of the pace, but the slots are
    /// fixed in Redis: a send that leaves late because its process was
    /// busy (a millisecond or more on an overloaded machine) is that much
    /// closer to the next one. Book ahead when throughput matters more
    /// than each gap, as against an API's token bucket; leave it off
    /// against servers that judge every gap, as nginx's `limit_req`
    /// without a burst does. Make it cover a round trip to Redis and a
    /// timer tick with room to spare (10 ms, say).
    pub fn book_ahead(mut self, ahead: Duration) -> Self {
        self.book_ahead = ahead;
        self
    }

    /// How long after its host's next allowed send a waiter aims to reach
    /// Redis (default 100 µs). A waiter told to wait asks again a measured
    /// round trip before its slot plus this margin, timed in process to a
    /// fraction of a millisecond, and is admitted as its call arrives; the
    /// pace loses about this much per admission (at 200 requests a second,
    /// 100 µs gets about 95 % of the pace, 1 ms about 84 %).
    ///
    /// Sends that leave late are not the margin's to absorb: an admission
    /// that reaches a busy process late is covered by the room its acquire
    /// kept for that, or handed back (see
    /// [`max_lateness`](Self::max_lateness)). A wider margin only keeps
    /// the calls of waiters that run late (a timer woken late, a round
    /// trip longer than measured) from reaching Redis before their slot
    /// and being told to wait again. See "Performance" in the README,
    /// measured.
    pub fn slot_margin(mut self, margin: Duration) -> Self {
        self.slot_margin = margin;
        self
    }

    /// How late, beyond the room its acquire kept for this process's
    /// lateness, an admission may reach its caller and still be sent
    /// (default 2 ms; [`Duration::MAX`]: however late, with no room kept).
    /// Redis admits a request at or after its slot, but the reply can
    /// reach a busy process late, and a request that then leaves late is
    /// that much closer to the next one, which another replica may send on
    /// time. Where that matters (a `min_delay` in lease mode, or a quota),
    /// each acquire asks Redis to keep room after its slot for the lateness
    /// this process's admissions met lately (see "Late admissions" on
    /// [`RedisLimiter`]), and an admission later than its room and this is
    /// handed back at once, as a request never sent, and asked for again
    /// with room for twice its lateness; the upstream then sees no gap more
    /// than this short of `min_delay` from lateness on the way to the
    /// caller (a request can still leave late after its permit is granted).
    ///
    /// Lateness is reckoned on the Redis clock, whose offset from this
    /// process's monotonic clock each admission bounds: it is never
    /// understated, and overstated by at most the quickest round trip of
    /// the last 10-20 s (a Redis far away is late by its way back: a replica
    /// nearer to it would send sooner). For up to 20 s after the Redis clock
    /// steps forward it is understated by the step; under a Cluster whose
    /// clocks disagree, it is understated for the nodes ahead. The
    /// admission handed back leaves the waiting line across replicas: it
    /// had its turn, and asks again behind those waiting. Every late
    /// admission is reported to [`Hooks::on_late_admission`]. Serialized
    /// mode counts the gap from each completion, which lateness does not
    /// shorten; admissions booked ahead (see [`book_ahead`](Self::book_ahead))
    /// keep their slots. Not part of the configuration agreement (nor is
    /// [`slot_margin`](Self::slot_margin)): replicas may differ in it, as it
    /// shapes only this process's sends.
    pub fn max_lateness(mut self, lateness: Duration) -> Self {
        self.max_lateness = lateness;
        self
    }

    /// Where decisions and failures are reported (default: nowhere).
    pub fn hooks(mut self, hooks: Arc<dyn Hooks>) -> Self {
        self.hooks = hooks;
        self
    }

    /// Validates the configuration and builds the limiter. Nothing is sent
    /// to Redis until the first acquire.
    pub fn build(self) -> Result<RedisLimiter, ConfigError> {
        check_name("prefix", &self.prefix)?;
        check_name("scope", &self.scope)?;
        let lease_ttl_us = micros("lease_ttl", self.lease_ttl)?;
        if lease_ttl_us == 0 {
            return Err(ConfigError::Zero { field: "lease_ttl" });
        }
        if self.lease_ttl < RedisLimiter::MIN_LEASE_TTL {
            return Err(ConfigError::TooShort {
                field: "lease_ttl",
                value: self.lease_ttl,
                min: RedisLimiter::MIN_LEASE_TTL,
            });
        }
        let concurrency_retry = self.concurrency_retry.unwrap_or_else(|| {
            let min_delay = self.policies.default_pacing().min_delay();
            if min_delay.is_zero() {
                RedisLimiter::DEFAULT_CONCURRENCY_RETRY
            } else {
                min_delay.clamp(
                    Duration::from_millis(1),
                    RedisLimiter::DEFAULT_CONCURRENCY_RETRY,
                )
            }
        });
        micros("book_ahead", self.book_ahead)?;
        micros("slot_margin", self.slot_margin)?;
        if self.max_lateness.is_zero() {
            return Err(ConfigError::Zero {
                field: "max_lateness",
            });
        }
        if self.book_ahead > self.lease_ttl {
            // A booked lease must outlive the wait for its slot.
            return Err(ConfigError::TooLong {
                field: "book_ahead",
                value: self.book_ahead,
                max: self.lease_ttl,
            });
        }
        if micros("concurrency_retry", concurrency_retry)? == 0 {
            return Err(ConfigError::Zero {
                field: "concurrency_retry",
            });
        }
        let policies = self.policies;
        let default_cap = self.cluster_concurrency;
        let args: Box<[Args]> = (0..policies.len())
            .map(|i| {
                // Validated by `Pacing`'s own builder.
                let pacing = policies.at(i);
                let min_delay_us = pacing.min_delay().as_micros() as u64;
                let window_us = pacing.window().as_micros() as u64;
                let max_penalty_us = pacing.max_penalty().as_micros() as u64;
                Args {
                    cap: policies.cluster_concurrency_at(i, default_cap),
                    min_delay_us,
                    quota: pacing.quota(),
                    window_us,
                    max_wait_us: max_penalty_us
                        .max(lease_ttl_us.saturating_add(min_delay_us))
                        .max(window_us)
                        .min(crate::MAX_MICROS),
                    weight: 1,
                    bucket_us: quota_buckets(pacing.quota(), window_us),
                    admitted_us: 0,
                    room_us: 0,
                    patience_us: (concurrency_retry
                        + pacing.jitter()
                        + self.slot_margin
                        + LINE_SLACK)
                        .as_micros()
                        .min(u128::from(crate::MAX_MICROS)) as u64,
                }
            })
            .collect();
        // Hosts of one domain share one gate: a serialized host's holder
        // would mean nothing to a lease-mode host beside it.
        if policies.key_by() == crate::KeyBy::RegistrableDomain
            && let Some(i) = (1..args.len()).find(|&i| (args[i].cap == 0) != (args[0].cap == 0))
        {
            return Err(ConfigError::InvalidRule {
                rule: policies.rules()[i - 1].pattern().to_owned(),
                reason: "keyed by registrable domain, hosts of one domain share one state in \
                         Redis: a rule cannot be serialized when the default is in lease mode, \
                         or the other way round",
            });
        }
        // ... and one quota record: kept per admission (up to
        // EXACT_QUOTA_MAX) or in buckets, the same way for all of them.
        let bucketed = |a: &Args| (a.quota > 0).then_some(a.bucket_us > 0);
        if policies.key_by() == crate::KeyBy::RegistrableDomain
            && let Some(first) = args.iter().find_map(bucketed)
            && let Some(i) = (1..args.len()).find(|&i| bucketed(&args[i]) == Some(!first))
        {
            return Err(ConfigError::InvalidRule {
                rule: policies.rules()[i - 1].pattern().to_owned(),
                reason: "keyed by registrable domain, hosts of one domain share one quota record \
                         in Redis: quotas of up to 16 per window (kept per admission) and larger \
                         ones (kept in buckets) cannot be mixed",
            });
        }
        // ... whose records each acquire trims to its own window: a shorter
        // window would drop what a longer one still counts.
        let window = |a: &Args| (a.quota > 0).then_some(a.window_us);
        if policies.key_by() == crate::KeyBy::RegistrableDomain
            && let Some(first) = args.iter().find_map(window)
            && let Some(i) = (1..args.len()).find(|&i| window(&args[i]).is_some_and(|w| w != first))
        {
            return Err(ConfigError::InvalidRule {
                rule: policies.rules()[i - 1].pattern().to_owned(),
                reason: "keyed by registrable domain, hosts of one domain share one quota record \
                         in Redis: their quotas must count in the same window",
            });
        }
        // The per-process cap of each policy, raised to its cluster cap.
        let local = policies.map(|i, pacing| {
            Pacing::default()
                .with_max_concurrent(pacing.max_concurrent().max(args[i].cap))
                .with_max_queued(pacing.max_queued())
        });
        let pollers = policies.map(|_, _| Pacing::default());
        Ok(RedisLimiter {
            report_waits: true,
            shared: Arc::new(Shared {
                local: DomainLimiter::new(local),
                pollers: DomainLimiter::tracking_in_flight(pollers.clone()),
                heavy_pollers: DomainLimiter::tracking_in_flight(pollers),
                releases: AtomicUsize::new(0),
                released: Notify::new(),
                acquiring: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
                closing: Notify::new(),
                circuit: Circuit::new(),
                calls: tokio::sync::Semaphore::new(MAX_CALLS),
                release_calls: tokio::sync::Semaphore::new(MAX_CALLS),
                registry: Registry::new(&self.prefix, &self.scope),
                fallback_policy: self.fallback_policy,
                expected_replicas: self.expected_replicas,
                agreement: Agreement::new(
                    &self.prefix,
                    &self.scope,
                    &policies,
                    |i| args[i].cap,
                    self.lease_ttl,
                ),
                redis: Connections::new(self.pool),
                prefix: self.prefix,
                scope: self.scope,
                policies,
                cluster_concurrency: self.cluster_concurrency,
                lease_ttl: self.lease_ttl,
                renewals: Arc::new(Renewals::new(self.lease_ttl / 2)),
                concurrency_retry,
                book_ahead: self.book_ahead,
                slot_margin: self.slot_margin,
                round_trip: RoundTrip::default(),
                max_lateness: self.max_lateness,
                redis_clock: RedisClock::default(),
                lateness: Lateness::new(self.lease_ttl / 2),
                hooks: self.hooks,
                lease_ttl_us,
                args,
            }),
        })
    }
}

impl RedisLimiter {
    /// The default lease TTL.
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
    /// The shortest lease TTL accepted: a lease is renewed every half TTL,
    /// and a renewal is a Redis round trip.
    pub const MIN_LEASE_TTL: Duration = Duration::from_millis(100);
    /// The longest default retry interval while a host's in-flight cap is
    /// taken (see [`RedisLimiterBuilder::concurrency_retry`]).
    pub const DEFAULT_CONCURRENCY_RETRY: Duration = Duration::from_millis(50);
    /// How far ahead of its slot a waiter is booked by default (see
    /// [`RedisLimiterBuilder::book_ahead`]).
    pub const DEFAULT_BOOK_AHEAD: Duration = Duration::ZERO;
    /// How long after its host's slot a waiter aims to reach Redis by
    /// default (see [`RedisLimiterBuilder::slot_margin`]).
    pub const DEFAULT_SLOT_MARGIN: Duration = Duration::from_micros(100);
    /// How late an admission may reach its caller and still be sent, by
    /// default (see [`RedisLimiterBuilder::max_lateness`]).
    pub const DEFAULT_MAX_LATENESS: Duration = Duration::from_millis(2);

    /// Starts a limiter for `scope` (e.g. `domain` for crawling, `search`
    /// for API queries; two scopes never consume each other's quota) over
    /// `pool`.
    pub fn builder(pool: RedisPool, scope: impl Into<String>) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            pool,
            prefix: "redislimit".to_owned(),
            scope: scope.into(),
            policies: Policies::default(),
            cluster_concurrency: 0,
            lease_ttl: Self::DEFAULT_LEASE_TTL,
            concurrency_retry: None,
            book_ahead: RedisLimiter::DEFAULT_BOOK_AHEAD,
            slot_margin: RedisLimiter::DEFAULT_SLOT_MARGIN,
            max_lateness: RedisLimiter::DEFAULT_MAX_LATENESS,
            hooks: Arc::new(NoHooks),
            fallback_policy: FallbackPolicy::default(),
            expected_replicas: 1,
        }
    }

    /// The pacing of hosts no rule matches.
    pub fn pacing(&self) -> &Pacing {
        self.shared.policies.default_pacing()
    }

    /// The pacing of every host.
    pub fn policies(&self) -> &Policies {
        &self.shared.policies
    }

    /// The cross-replica in-flight cap per host (of hosts whose rule sets
    /// none); 0 in serialized mode.
    pub fn cluster_concurrency(&self) -> u32 {
        self.shared.cluster_concurrency
    }

    /// How long a slot stays booked without a release or renewal.
    pub fn lease_ttl(&self) -> Duration {
        self.shared.lease_ttl
    }

    /// The Redis keys that hold `host`'s state (under its key, see
    /// [`KeyBy`](crate::KeyBy)), for inspecting or clearing it by hand.
    /// Keyed by registrable domain, `waiting` is the line of `host`'s rule
    /// only: hosts of the domain under other rules wait in lines of their
    /// own (see [`RedisKeys::in_lane`]).
    pub fn keys(&self, host: &HostKey) -> RedisKeys {
        self.shared.keys(host)
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
        let shared = &self.shared;
        shared.policies.map(|i, pacing| {
            let cap = shared.args[i].cap;
            let pacing = pacing.clone().with_max_concurrent(cap.max(1));
            if cap == 0 {
                pacing.with_spacing(Spacing::SendsAndCompletions)
            } else {
                // Lease mode spaces sends only; so must its fallback, or it
                // would slow every request down while Redis is healthy.
                pacing.with_spacing(Spacing::Sends)
            }
        })
    }

    /// Checks that Redis answers a `PING`, within the pool's timeouts: a way
    /// to refuse to start against a Redis that is not there.
    pub async fn ping(&self) -> Result<(), Error> {
        let pong = self
            .shared
            .redis
            .query::<String>(&deadpool_redis::redis::cmd("PING"))
            .await;
        self.shared.circuit.observe(&pong);
        pong.map(drop).map_err(|e| unavailable(Op::Ping, e))
    }

    /// Checks now that the scope admits with this limiter's settings (see
    /// "Configuration agreement" on [`RedisLimiter`]), recording them when
    /// the scope has none: [`Error::ConfigMismatch`] names both
    /// configurations when another replica's settings hold the scope, and
    /// [`Error::Unavailable`] says Redis could not be asked. A program calls
    /// it before sending anything, to refuse to start instead of failing
    /// its first request.
    pub async fn check_config(&self) -> Result<(), Error> {
        self.shared.agree(true).await
    }

    /// The settings this limiter records for its scope and compares with
    /// the other replicas' (see [`check_config`](Self::check_config)).
    pub fn config_record(&self) -> &str {
        self.shared.agreement.settings()
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
        let hooks = Arc::clone(&self.shared.hooks);
        let fallback = DomainLimiter::new(self.fallback_policies());
        let plan = Arc::new(RegistryPlan(Arc::clone(&self.shared)));
        self.report_waits = false;
        FallbackLimiter::new(self, fallback)
            .with_hooks(hooks)
            .with_outage_plan(plan)
    }
}

impl fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shared;
        f.debug_struct("RedisLimiter")
            .field("pool", s.redis.pool())
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
            &*self.shared.hooks
        } else {
            &NoHooks
        };
        Box::pin(async move {
            let shared = &self.shared;
            // Counted until the inner acquire (and the booking it may
            // leave behind) is gone: `close` waits for it.
            let _busy = Busy::new(shared);
            // Listening before the flag is read: a close in between still
            // wakes this acquire.
            let closing = shared.closing.notified();
            tokio::pin!(closing);
            closing.as_mut().enable();
            if shared.closed.load(Ordering::SeqCst) {
                return Err(Error::Closed);
            }
            let acquired = tokio::select! {
                biased;
                acquired = shared.acquire(hooks, engine, host, deadline, request) => acquired,
                // The acquire is dropped, as a cancelled one: it books nothing.
                () = closing => Err(Error::Closed),
            };
            match acquired {
                // Admitted as the limiter closed: given back unsent.
                Ok(permit) if shared.closed.load(Ordering::SeqCst) => {
                    permit.abandon();
                    Err(Error::Closed)
                }
                acquired => acquired,
            }
        })
    }

    fn close(&self, deadline: Option<Instant>) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(self.shared.close(deadline))
    }

    fn penalize_host<'a>(
        &'a self,
        host: HostKey,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.shared.penalize(host, hold))
    }

    fn adopt_host<'a>(
        &'a self,
        host: HostKey,
        ago: Duration,
        weight: u32,
    ) -> BoxFuture<'a, Result<Option<Permit>, Error>> {
        Box::pin(self.shared.adopt(host, ago, weight))
    }

    fn report_hold(&self, host: &HostKey, cause: &str, hold: Duration) {
        // Under a fallback limiter, which reports it to the same hooks.
        if self.report_waits {
            let key = self.shared.policies.key(host);
            self.shared.hooks.on_hold(&key, cause, hold);
        }
    }

    /// This process's view: waiting counts the acquires queued here and
    /// those asking Redis; in flight, the permits held. The next send and
    /// penalties live in Redis (see [`keys`](RedisLimiter::keys)), so they
    /// are `None`.
    fn snapshot(&self, top: usize) -> Snapshot {
        self.shared.snapshot(top)
    }

    /// Kept in the host's gate hash (its `backoff` field), so every
    /// replica widens and narrows the same gap.
    fn back_off_host<'a>(
        &'a self,
        host: HostKey,
        step: BackoffStep,
    ) -> Option<BoxFuture<'a, Result<Option<Duration>, Error>>> {
        Some(Box::pin(self.shared.back_off(host, step)))
    }
}

/// What the acquire script answered.
enum Answer {
    /// Booked for a send `ahead` from now (zero: at once), at `at_us` on
    /// the Redis clock.
    Admitted { ahead: Duration, at_us: u64 },
    /// No send for `wait`; `full` when the in-flight cap is taken.
    Wait { wait: Duration, full: bool },
}

pub(super) fn unavailable(op: Op, err: QueryError) -> Error {
    match err {
        QueryError::Redis(e) => Error::unavailable(op, e),
        QueryError::Pool(e) => Error::Unavailable { op, source: e },
    }
}

/// Whether a failed call may still have reached Redis and run: it timed
/// out or lost its connection after being sent, rather than never leaving.
fn may_have_run(err: &Error) -> bool {
    let Error::Unavailable { source, .. } = err else {
        return false;
    };
    source
        .downcast_ref::<RedisError>()
        .is_some_and(|e| e.is_timeout() || e.is_io_error() || e.is_connection_dropped())
}

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

/// How long past the caller's deadline a call that started at it may take
/// to be answered (Redis answers in well under a millisecond).
const CALL_GRACE: Duration = Duration::from_millis(50);

/// The error of a call skipped because Redis failed to answer moments ago.
pub(super) fn circuit_open(op: Op) -> Error {
    Error::unavailable(
        op,
        "Redis failed to answer moments ago; it is asked again once a second",
    )
}

/// A random lease token; unique per acquire, so a late release of an
/// expired lease can never free a newer one.
fn new_token() -> Arc<str> {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)).into()
}

impl Shared {
    async fn acquire(
        self: &Arc<Self>,
        hooks: &dyn Hooks,
        engine: &str,
        host: HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> Result<Permit, Error> {
        let start = Instant::now();
        let policy = self.policies.index(&host);
        // The state's key; `host` still picks the in-process queues' rules.
        let key = self.policies.key(&host);
        // One holder at a time in serialized mode; the cluster cap (which
        // the per-process cap is at least) in lease mode.
        let mut args = self.args[policy];
        let cap = args.cap.max(1);
        let mut report = WaitReport::new(hooks, engine, &key, start);
        args.weight = request
            .check_weight(&key, cap, args.quota)
            .map_err(|e| report.fail(e))?;
        self.ensure_heartbeat();
        if self.circuit.waiting() {
            report.abandon();
            return Err(circuit_open(Op::Acquire));
        }
        // Bounded like an acquire's own call: a caller's deadline that runs
        // out is a blown budget, not a Redis failure.
        let Some(agreed) = within(deadline, self.agree(false)).await else {
            let now = Instant::now();
            return Err(report.over_budget(now, deadline.unwrap_or(now), now));
        };
        if let Err(err) = agreed {
            // A mismatch was reported where it was found.
            if err.is_unavailable() {
                self.hooks.on_error(Op::Acquire, &err);
                tracing::warn!(host = %key, error = %crate::Causes(&err), "acquire failed");
            }
            report.abandon();
            return Err(err);
        }
        // Queued here at weight 1: this process's own slots must not hold
        // back a lighter request while Redis refuses a heavy one (which
        // Redis alone can tell); its weight counts here once admitted.
        let mut local = self
            .local
            .acquire_with(engine, host.clone(), deadline, request.with_weight(1))
            .await
            .map_err(|e| report.fail(e))?;
        // One waiter per host and process asks Redis at a time; the rest
        // queue here, in order. Fewer callers race at each opening, and a
        // crowd of waiters costs Redis one caller per process. Requests
        // heavier than 1 have their own line, so that one Redis refuses
        // for want of room never holds up lighter ones (best fit).
        let pollers = if args.weight > 1 {
            &self.heavy_pollers
        } else {
            &self.pollers
        };
        let polling = pollers
            .acquire_with(engine, host.clone(), deadline, request.with_weight(1))
            .await
            .map_err(|e| report.fail(e))?;
        let keys = Arc::new(self.keys(&host));
        let token = new_token();
        let runtime = Handle::current();
        // Told to wait, a request of weight 1 is in the waiting line across
        // replicas; one that ends without an admission leaves it.
        let in_line = InLine::new(self, &keys, &token, &runtime, args);
        let mut retried_after_release = false;
        // The room the last hand-back asked for, at least.
        let mut room_floor = Duration::ZERO;
        loop {
            // A full host may be full of this process's own requests whose
            // releases are still on their way to Redis (sent after this
            // acquire): listen for them before asking, so the answer "full"
            // can be retried as soon as one lands, not a retry interval later.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let releasing = self.releases.load(Ordering::Acquire) > 0;
            // Checked before anything is sent: an acquire refused here never
            // reached Redis, so there is nothing to take back. First without
            // a side effect, so that a circuit held open fails at once
            // rather than after a turn; once the turn is had, for real (a
            // caller let through then is the probe).
            if self.circuit.waiting() {
                report.abandon();
                return Err(circuit_open(Op::Acquire));
            }
            // A crowd of acquires (a crawl's first one per host) waits its
            // turn here, not in Redis, where its replies would outlast the
            // response timeout and open the circuit.
            let Some(turn) = within(deadline, self.calls.acquire()).await else {
                let now = Instant::now();
                return Err(report.over_budget(now, deadline.unwrap_or(now), now));
            };
            let turn = turn.map_err(|_| report.fail(Error::Closed))?;
            if self.circuit.open() {
                report.abandon();
                return Err(circuit_open(Op::Acquire));
            }
            // Room after the slot for how late this process's sends leave.
            let room = if args.sends_late() {
                self.lateness.room().max(room_floor)
            } else {
                Duration::ZERO
            };
            args.room_us = u64::try_from(room.as_micros()).unwrap_or(u64::MAX);
            let booking = Booking::new(self, &keys, &token, &runtime, args, Some(&in_line));
            let horizon = self.horizon(policy, deadline);
            let asked = self.try_acquire(&keys, &token, args, horizon);
            let answer = within(deadline, asked).await;
            drop(turn);
            let Some(answer) = answer else {
                // The caller's budget ran out, not Redis: a blown budget,
                // which opens no circuit. The call may still run, so the
                // booking stays armed.
                drop(booking);
                let now = Instant::now();
                return Err(report.over_budget(now, deadline.unwrap_or(now), now));
            };
            booking.settle(&answer);
            let (wait, full) = match answer {
                Ok(Answer::Admitted { ahead, at_us }) => {
                    // Admitted, it left the line.
                    in_line.disarm();
                    // Counted from the end of its room.
                    args.admitted_us = at_us.saturating_add(args.room_us);
                    if ahead.is_zero()
                        && args.sends_late()
                        && let Some(again) = self.late(&key, &keys, at_us, room)
                    {
                        room_floor = again;
                        let back = self.hand_back(&keys, &token, args, &runtime);
                        let Some(back) = within(deadline, back).await else {
                            // The hand-back goes on without this caller.
                            let now = Instant::now();
                            return Err(report.over_budget(now, deadline.unwrap_or(now), now));
                        };
                        if let Err(err) = back {
                            // The runtime is shutting down.
                            if matches!(err, Error::Closed) {
                                return Err(report.fail(err));
                            }
                            self.hooks.on_error(Op::Acquire, &err);
                            tracing::warn!(host = %key, error = %crate::Causes(&err), "acquire failed");
                            report.abandon();
                            return Err(err);
                        }
                        args.admitted_us = 0;
                        continue;
                    }
                    // The next caller of this process may book the slot
                    // after this one while this one waits for its own.
                    drop(polling);
                    local.reweigh(args.weight);
                    let permit = self.permit(
                        key.clone(),
                        Duration::ZERO,
                        (keys, token, args),
                        local,
                        runtime,
                    );
                    if ahead.is_zero() {
                        return Ok(permit.waited_for(report.finish(WaitOutcome::Acquired)));
                    }
                    // Dropped before its slot, the booking is handed back.
                    let unsent = Unsent::new(permit);
                    super::precise::sleep(ahead).await;
                    let waited = report.finish(WaitOutcome::Acquired);
                    return unsent
                        .take()
                        .map(|permit| permit.waited_for(waited))
                        .ok_or(Error::Closed);
                }
                Ok(Answer::Wait { wait, full }) => {
                    in_line.arm(args.weight == 1);
                    (wait, full)
                }
                Err(err) => {
                    self.hooks.on_error(Op::Acquire, &err);
                    tracing::warn!(host = %key, error = %crate::Causes(&err), "acquire failed");
                    report.abandon();
                    return Err(err);
                }
            };
            let now = Instant::now();
            let pause = if full {
                wait.max(self.concurrency_retry)
            } else if !horizon.is_zero() {
                // Asked again while the slot is still within the horizon
                // ahead, this caller is booked for it and sends on time.
                wait.saturating_sub(horizon / 2)
            } else {
                // The script ran about half a round trip ago: asking again
                // a round trip before the slot, the call reaches Redis just
                // after it and is admitted then (lateness before the
                // decision costs pace, never a gap).
                (wait + self.slot_margin).saturating_sub(self.round_trip.get())
            };
            let mut wake = after(now, self.policies.at(policy).jittered(pause));
            if let Some(deadline) = deadline {
                // A known wait that cannot fit fails at once; a full host
                // (whose wait nobody knows) is retried until the deadline.
                // Jitter spreads replicas out but never costs the budget.
                let ready = after(now, wait);
                if ready > deadline || (full && now >= deadline) {
                    return Err(report.over_budget(after(now, pause), deadline, now));
                }
                wake = wake.min(deadline);
            }
            // A release may also have set off, or landed, during the call.
            let landed = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(released.as_mut().poll(cx).is_ready())
            })
            .await;
            let releasing = releasing || landed || self.releases.load(Ordering::Acquire) > 0;
            if full && releasing && !retried_after_release {
                retried_after_release = true;
                tokio::select! {
                    () = released => {}
                    () = tokio::time::sleep_until(wake) => {}
                }
            } else if full {
                tokio::time::sleep_until(wake).await;
            } else {
                // Timed finer than Tokio's millisecond: the slot is known.
                super::precise::sleep(wake.saturating_duration_since(Instant::now())).await;
            }
        }
    }

    /// The keys of `host`'s state (under its key), with the waiting line of
    /// its rule when hosts under different rules can share a key.
    fn keys(&self, host: &HostKey) -> RedisKeys {
        let key = self.policies.key(host);
        let keys = RedisKeys::new(&self.prefix, &self.scope, &key);
        if self.policies.key_by() == crate::KeyBy::Host {
            return keys;
        }
        match self.policies.index(host) {
            0 => keys.in_lane(""),
            i => keys.in_lane(self.policies.rules()[i - 1].pattern()),
        }
    }

    /// How far ahead an acquire under policy `policy` may be booked: not at
    /// all when its pacing has jitter (which is there to spread sends out,
    /// not to hit slots), nor past the caller's deadline.
    fn horizon(&self, policy: usize, deadline: Option<Instant>) -> Duration {
        if !self.policies.at(policy).jitter().is_zero() {
            return Duration::ZERO;
        }
        match deadline {
            Some(deadline) => self
                .book_ahead
                .min(deadline.saturating_duration_since(Instant::now())),
            None => self.book_ahead,
        }
    }

    /// Releases on their way to Redis, and acquires still winding down
    /// (which may leave one behind).
    fn pending(&self) -> usize {
        self.releases.load(Ordering::Acquire) + self.acquiring.load(Ordering::Acquire)
    }

    /// See [`Limiter::close`].
    async fn close(&self, deadline: Option<Instant>) -> Result<(), Error> {
        if !self.closed.swap(true, Ordering::SeqCst) {
            let (late, handed_back) = self.lateness.totals();
            if late > 0 {
                tracing::info!(scope = %self.scope, late, handed_back, "closing: admissions that reached this process late over its life (handed_back of them asked for again)");
            }
        }
        self.closing.notify_waiters();
        // Wakes the acquires queued in this process with `Closed` too.
        for queue in [&self.local, &self.pollers, &self.heavy_pollers] {
            queue.close(None).await?;
        }
        loop {
            let landed = self.released.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            let pending = self.pending();
            if pending == 0 {
                return Ok(());
            }
            let Some(deadline) = deadline else {
                landed.await;
                continue;
            };
            if tokio::time::timeout_at(deadline, landed).await.is_err() {
                let pending = self.pending();
                if pending == 0 {
                    return Ok(());
                }
                let err = Error::CloseIncomplete { pending };
                tracing::warn!(scope = %self.scope, pending, "closed with releases still pending");
                self.hooks.on_error(Op::Close, &err);
                return Err(err);
            }
        }
    }

    async fn try_acquire(
        &self,
        keys: &RedisKeys,
        token: &str,
        args: Args,
        horizon: Duration,
    ) -> Result<Answer, Error> {
        let (reply, sent) = ACQUIRE
            .run_timed::<AcquireReply>(&self.redis, &keys.all(), |cmd: &mut Cmd| {
                cmd.arg(token)
                    .arg(args.min_delay_us)
                    .arg(args.cap)
                    .arg(self.lease_ttl_us)
                    .arg(args.quota)
                    .arg(args.window_us)
                    .arg(args.max_wait_us)
                    .arg(args.weight)
                    .arg(horizon.as_micros() as u64)
                    .arg(args.bucket_us)
                    // Heavier requests stay out of the line (best fit).
                    .arg(if args.weight > 1 { 0 } else { args.patience_us })
                    .arg(args.room_us);
            })
            .await;
        let reply = reply.map(|reply| reply.0);
        self.circuit.observe(&reply);
        if let Ok(reply) = &reply {
            self.round_trip.observe(sent.elapsed());
            if let [1, now, _] = reply[..]
                && let Ok(now) = u64::try_from(now)
            {
                self.redis_clock.observe(sent, now);
            }
        }
        let reply = reply.map_err(|e| unavailable(Op::Acquire, e))?;
        match reply[..] {
            [1, now, ahead] if ahead >= 0 && now >= 0 => Ok(Answer::Admitted {
                // Within the horizon asked for, which is far below this.
                ahead: Duration::from_micros((ahead as u64).min(args.max_wait_us)),
                at_us: (now as u64).saturating_add(ahead as u64),
            }),
            [0, _, 2] => Err(Error::unavailable(
                Op::Acquire,
                "this acquire had been abandoned (its call timed out) before Redis ran it",
            )),
            [0, wait, 3] if wait >= 0 => {
                tracing::warn!(gate = %keys.gate, "pacing state of the wrong type or unparseable was replaced; the host is held for lease_ttl");
                self.hooks.on_repair(&keys.gate);
                Ok(Answer::Wait {
                    wait: Duration::from_micros((wait as u64).min(args.max_wait_us)),
                    full: false,
                })
            }
            [0, wait, full @ (0 | 1)] if wait >= 0 => Ok(Answer::Wait {
                // The script caps waits at max_wait_us; so does this.
                wait: Duration::from_micros((wait as u64).min(args.max_wait_us)),
                full: full == 1,
            }),
            _ => Err(Error::unavailable(
                Op::Acquire,
                format!("unexpected reply from the acquire script: {reply:?}"),
            )),
        }
    }

    /// The permit of `token`'s admission on `keys` under `args`.
    fn permit(
        self: &Arc<Self>,
        host: HostKey,
        waited: Duration,
        (keys, token, args): (Arc<RedisKeys>, Arc<str>, Args),
        local: Permit,
        runtime: Handle,
    ) -> Permit {
        // Redis took the lease a moment ago (the renewal's retries cover
        // the round trip).
        let since = Instant::now();
        let slot = Arc::new(Slot {
            shared: Arc::clone(self),
            keys,
            token,
            renewal: std::sync::Mutex::new(Renewal::Stopped),
            runtime,
            args,
        });
        {
            // Booked under the slot's lock, as `give_back` and
            // `start_renewal` look at it: a booking that falls due at once
            // waits for it to be recorded.
            let mut renewal = slot.renewal();
            *renewal = self.renewals.book(Arc::downgrade(&slot), since);
        }
        let taken_back = Arc::clone(&slot);
        let local = Arc::new(std::sync::Mutex::new(Some(local)));
        let local_back = Arc::clone(&local);
        Permit::new(host, waited, move || slot.give_back(&local, false))
            .on_abandon(move || taken_back.give_back(&local_back, true))
    }

    /// Returns the slot; `abandoned` when the caller never saw the admission.
    ///
    /// Retried with backoff while Redis is unavailable, for as long as the
    /// slot could still matter (`lease_ttl`): a release that never lands
    /// would hold the host for that long. The first failure is reported.
    async fn release(&self, keys: &RedisKeys, token: &str, abandoned: bool, args: Args) {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(50);
        loop {
            let released = self.call_release(keys, token, abandoned, args).await;
            self.circuit.observe(&released);
            let Err(e) = released else { return };
            let err = unavailable(Op::Release, e);
            if backoff == Duration::from_millis(50) {
                tracing::warn!(gate = %keys.gate, error = %crate::Causes(&err), "release failed; retrying");
                self.hooks.on_error(Op::Release, &err);
            }
            if start.elapsed() + backoff > self.lease_ttl {
                tracing::warn!(gate = %keys.gate, "release abandoned; the lease will lapse");
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// An admission made at `at_us` (Redis clock) with `room` for its
    /// lateness reached its caller now: `None` when it is sent, else the
    /// room to ask for again once it is handed back (see `lateness.rs`).
    /// Lateness beyond `max_lateness` widens this process's room, reaches
    /// the hooks, and is logged at most once a minute, with counts.
    fn late(
        &self,
        host: &HostKey,
        keys: &RedisKeys,
        at_us: u64,
        room: Duration,
    ) -> Option<Duration> {
        let late = self.redis_clock.late(at_us, Instant::now());
        if late <= self.max_lateness {
            return None;
        }
        self.lateness.seen(late);
        let verdict = verdict(late, room, self.max_lateness, self.lateness.most());
        let again = match verdict {
            Verdict::Send => None,
            Verdict::HandBack { room } => Some(room),
        };
        self.hooks
            .on_late_admission(&keys.gate, late, again.is_some());
        tracing::debug!(%host, late_us = late.as_micros() as u64, room_us = room.as_micros() as u64, handed_back = again.is_some(), "admission reached its caller late");
        if let Some(r) = self.lateness.note(host.as_str(), late, again.is_some()) {
            tracing::warn!(
                late = r.late,
                handed_back = r.handed_back,
                worst_ms = r.worst.as_millis() as u64,
                worst_host = %r.worst_key,
                over_s = r.over.as_secs(),
                room_ms = self.lateness.room().as_millis() as u64,
                "admissions reach this process late (it is busy): each acquire keeps room after its slot for its lateness, which slows its hosts' pace by as much; one later than its room is handed back unsent and asked for again (reported at most once a minute, counts since the last report)"
            );
        }
        again
    }

    /// Hands back `token`'s admission, which reached its caller too late
    /// (see [`RedisLimiterBuilder::max_lateness`]): abandoned as a request
    /// never sent, on a task of its own, so that it lands even when the
    /// caller goes away meanwhile; the caller asks again under the same
    /// token once it has. Its first attempt decides what the caller
    /// does: asks again, or fails (the call failed, or the lease lapsed
    /// first and the token is void); a failed attempt is retried off the
    /// caller's path, as a dropped permit's release is, and counts among
    /// the releases [`Limiter::close`] waits for.
    fn hand_back(
        self: &Arc<Self>,
        keys: &Arc<RedisKeys>,
        token: &Arc<str>,
        args: Args,
        runtime: &Handle,
    ) -> impl Future<Output = Result<(), Error>> + use<> {
        let pending = Pending::new(self);
        let (answer, answered) = tokio::sync::oneshot::channel();
        let (shared, keys, token) = (Arc::clone(self), Arc::clone(keys), Arc::clone(token));
        runtime.spawn(async move {
            let back = shared.call_release(&keys, &token, true, args).await;
            shared.circuit.observe(&back);
            // Landed (or given up) before the caller hears of it: the caller
            // must not take it for a release still on its way.
            match back {
                Ok(1) => {
                    drop(pending);
                    let _ = answer.send(Ok(()));
                }
                // Not held: the lease lapsed before the hand-back, and the
                // token is void from now on.
                Ok(_) => {
                    drop(pending);
                    let _ = answer.send(Err(Error::unavailable(
                        Op::Acquire,
                        "admitted too late to send, and its lease lapsed before it could be handed back",
                    )));
                }
                Err(e) => {
                    let _ = answer.send(Err(unavailable(Op::Acquire, e)));
                    shared.release(&keys, &token, true, args).await;
                    drop(pending);
                }
            }
        });
        async move { answered.await.unwrap_or(Err(Error::Closed)) }
    }

    /// Takes `token` out of the waiting line: one abandon (which also voids
    /// the token, should a call of its own still be on its way), not
    /// retried. Failures are only logged: the place lapses by itself.
    async fn leave(&self, keys: &RedisKeys, token: &str, args: Args) {
        let left = self.call_release(keys, token, true, args).await;
        self.circuit.observe(&left);
        if let Err(e) = left {
            tracing::debug!(gate = %keys.gate, error = %e, "leaving the waiting line failed; the place lapses");
        }
    }

    /// One call of the release script (see [`release`](Self::release)).
    async fn call_release(
        &self,
        keys: &RedisKeys,
        token: &str,
        abandoned: bool,
        args: Args,
    ) -> Result<i64, QueryError> {
        // A turn of the releases' own (see MAX_CALLS): releases come in
        // crowds too, but never queue behind acquires.
        let _turn = self.release_calls.acquire().await;
        RELEASE
            .run::<i64>(&self.redis, &keys.all(), |cmd: &mut Cmd| {
                cmd.arg(token)
                    .arg(args.min_delay_us)
                    .arg(args.cap)
                    .arg(u8::from(abandoned))
                    .arg(self.lease_ttl_us)
                    .arg(args.weight)
                    .arg(args.bucket_us)
                    .arg(args.admitted_us);
            })
            .await
    }

    /// Registers a request in flight since `ago` (admitted in-process while
    /// Redis was away) as holding a slot; see [`Limiter::adopt_host`]. It
    /// skips a Redis the circuit holds off until the next probe is due, and
    /// may itself be that probe.
    async fn adopt(
        self: &Arc<Self>,
        host: HostKey,
        ago: Duration,
        weight: u32,
    ) -> Result<Option<Permit>, Error> {
        // Skips a Redis that failed moments ago, like an acquire; when the
        // probe is due, this may be it.
        if self.circuit.open() {
            return Err(circuit_open(Op::Acquire));
        }
        let mut args = self.args[self.policies.index(&host)];
        // Admitted in-process under the same caps (see fallback_policies);
        // kept within them all the same.
        args.weight = weight.clamp(1, heaviest(args.cap.max(1), args.quota));
        let host = self.policies.key(&host);
        let keys = Arc::new(RedisKeys::new(&self.prefix, &self.scope, &host));
        let token = new_token();
        let runtime = Handle::current();
        // Dropped mid-call, or lost with its connection, the script may still
        // have booked the slot: the guard then releases it.
        let booking = Booking::new(self, &keys, &token, &runtime, args, None);
        let ago_us = u64::try_from(ago.as_micros())
            .unwrap_or(u64::MAX)
            .min(crate::MAX_MICROS);
        let adopted = ADOPT
            .run::<i64>(&self.redis, &keys.all()[..3], |cmd: &mut Cmd| {
                cmd.arg(&*token)
                    .arg(args.cap)
                    .arg(self.lease_ttl_us)
                    .arg(args.min_delay_us)
                    .arg(ago_us)
                    .arg(args.quota)
                    .arg(args.window_us)
                    .arg(args.weight)
                    .arg(args.bucket_us);
            })
            .await;
        self.circuit.observe(&adopted);
        let adopted = adopted.map_err(|e| unavailable(Op::Acquire, e));
        booking.settle(&adopted);
        match adopted? {
            1 => {
                tracing::info!(host = %host, "a request admitted in-process now counts in Redis");
                let local = Permit::new(host.clone(), Duration::ZERO, || {});
                Ok(Some(self.permit(
                    host,
                    Duration::ZERO,
                    (keys, token, args),
                    local,
                    runtime,
                )))
            }
            _ => {
                tracing::warn!(host = %host, "another replica held the host when Redis came back; the request in flight overlaps it");
                Ok(None)
            }
        }
    }

    async fn penalize(self: &Arc<Self>, host: HostKey, hold: Duration) -> Result<(), Error> {
        let cap = self.policies.pacing_for(&host).max_penalty();
        let hold_us = hold.min(cap).as_micros() as u64;
        if hold_us == 0 {
            return Ok(());
        }
        if self.circuit.open() {
            return Err(circuit_open(Op::Penalize));
        }
        let host = self.policies.key(&host);
        let keys = RedisKeys::new(&self.prefix, &self.scope, &host);
        let result = PENALIZE
            .run::<i64>(&self.redis, &[keys.gate.as_str()], |cmd: &mut Cmd| {
                cmd.arg(hold_us).arg(self.lease_ttl_us);
            })
            .await;
        self.circuit.observe(&result);
        match result {
            Ok(_) => {
                tracing::debug!(host = %host, hold_us, "host penalized");
                Ok(())
            }
            Err(e) => {
                let err = unavailable(Op::Penalize, e);
                tracing::warn!(host = %host, error = %crate::Causes(&err), "penalize failed");
                self.hooks.on_error(Op::Penalize, &err);
                Err(err)
            }
        }
    }
}

impl Shared {
    /// [`Limiter::snapshot`] of this process's part.
    pub(super) fn snapshot(&self, top: usize) -> Snapshot {
        // Admitted by the in-process cap but still asking Redis (polling,
        // or queued to poll): waiting, not in flight.
        let mut asking: std::collections::HashMap<HostKey, usize> =
            std::collections::HashMap::new();
        let (mut poll_queued, mut polling) = (0, 0);
        for pollers in [&self.pollers, &self.heavy_pollers] {
            let (_, queued, asking_now) = pollers.visit_busy(|host, queued, polling, _, _| {
                *asking.entry(host.clone()).or_default() += queued + polling;
            });
            poll_queued += queued;
            polling += asking_now;
        }
        let mut tops = TopHosts::new(top);
        let mut offer = |host: &HostKey, queued: usize, admitted: usize, asking: usize| {
            let (queued, in_flight) = (queued + asking, admitted.saturating_sub(asking));
            tops.offer(queued, in_flight, || HostSnapshot {
                host: host.clone(),
                queued,
                in_flight,
                next_send: None,
                held_until: None,
                paced_by: PacedBy::Shared,
            });
        };
        let mut seen = std::collections::HashSet::new();
        let (active_hosts, queued, admitted) =
            self.local.visit_busy(|host, queued, admitted, _, _| {
                seen.insert(host.clone());
                offer(
                    host,
                    queued,
                    admitted,
                    asking.get(host).copied().unwrap_or(0),
                );
            });
        // Hosts asking Redis with nobody queued in process behind them.
        for (host, asking) in &asking {
            if !seen.contains(host) {
                let admitted = self.local.in_flight_of(host).max(*asking);
                offer(host, 0, admitted, *asking);
            }
        }
        let asking_total = poll_queued + polling;
        Snapshot {
            hosts: tops.into_hosts(),
            active_hosts,
            queued: queued + asking_total,
            in_flight: admitted.saturating_sub(asking_total),
        }
    }

    /// [`Limiter::back_off_host`]: one run of `backoff.lua`.
    async fn back_off(
        self: &Arc<Self>,
        host: HostKey,
        step: BackoffStep,
    ) -> Result<Option<Duration>, Error> {
        let cap = self.policies.pacing_for(&host).max_penalty();
        let host = self.policies.key(&host);
        let (code, start, max) = match step {
            BackoffStep::Widen { start, max } => (1, start, max.min(cap)),
            BackoffStep::Narrow { start } => (2, start, cap),
        };
        let us = |d: Duration| d.as_micros().min(u128::from(crate::MAX_MICROS)) as u64;
        // A gap of zero could never widen.
        let (start_us, max_us) = (us(start).max(1), us(max).max(1));
        if self.circuit.open() {
            return Err(circuit_open(Op::Penalize));
        }
        let keys = RedisKeys::new(&self.prefix, &self.scope, &host);
        let result = BACKOFF
            .run::<i64>(&self.redis, &[keys.gate.as_str()], |cmd: &mut Cmd| {
                cmd.arg(code)
                    .arg(start_us)
                    .arg(max_us)
                    .arg(self.lease_ttl_us);
            })
            .await;
        self.circuit.observe(&result);
        match result {
            Ok(gap_us) => {
                let gap = (gap_us > 0).then(|| Duration::from_micros(gap_us.unsigned_abs()));
                tracing::debug!(host = %host, gap_us, "backoff moved");
                Ok(gap)
            }
            Err(e) => {
                let err = unavailable(Op::Penalize, e);
                tracing::warn!(host = %host, error = %crate::Causes(&err), "backoff failed");
                self.hooks.on_error(Op::Penalize, &err);
                Err(err)
            }
        }
    }
}

/// A slot a permit holds in Redis: its renewal, booked when it was taken
/// and started once due, runs until it is given back.
pub(super) struct Slot {
    shared: Arc<Shared>,
    keys: Arc<RedisKeys>,
    token: Arc<str>,
    renewal: std::sync::Mutex<Renewal>,
    runtime: Handle,
    args: Args,
}

impl Slot {
    fn renewal(&self) -> std::sync::MutexGuard<'_, Renewal> {
        self.renewal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts renewing on a task of its own, unless released meanwhile.
    pub(super) fn start_renewal(&self) {
        let mut renewal = self.renewal();
        if let Renewal::Due { key: (first, _) } = *renewal {
            let task = self
                .runtime
                .spawn(Arc::clone(&self.shared).renew_until_released(
                    Arc::clone(&self.keys),
                    Arc::clone(&self.token),
                    self.args,
                    first,
                ));
            *renewal = Renewal::Running(task.abort_handle());
        }
    }

    /// Stops the renewal, frees the local slot and sends the release (as
    /// `abandoned` when the request was never sent) off the caller's path.
    fn give_back(&self, local: &std::sync::Mutex<Option<Permit>>, abandoned: bool) {
        match std::mem::replace(&mut *self.renewal(), Renewal::Stopped) {
            Renewal::Due { key } => self.shared.renewals.cancel(key),
            Renewal::Running(task) => task.abort(),
            Renewal::Stopped => {}
        }
        // Counted before the local slot frees, so an acquire it lets in
        // knows a release is on its way.
        let pending = Pending::new(&self.shared);
        drop(
            local
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        pending.send(&self.runtime, &self.keys, &self.token, abandoned, self.args);
    }
}

/// An acquire under way, counted so that [`Shared::close`] waits for it
/// to wind down (a cancelled one may still send a release).
struct Busy<'a>(&'a Shared);

impl<'a> Busy<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.acquiring.fetch_add(1, Ordering::AcqRel);
        Self(shared)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.acquiring.fetch_sub(1, Ordering::AcqRel);
        self.0.released.notify_waiters();
    }
}

/// A release counted as on its way to Redis (which acquires listen for and
/// [`Shared::close`] waits for) until it has landed or given up.
struct Pending(Arc<Shared>);

impl Pending {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.releases.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(shared))
    }

    /// Sends the release of `token` on a task of `runtime`.
    fn send(
        self,
        runtime: &Handle,
        keys: &Arc<RedisKeys>,
        token: &Arc<str>,
        abandoned: bool,
        args: Args,
    ) {
        let (keys, token) = (Arc::clone(keys), Arc::clone(token));
        runtime.spawn(async move {
            self.0.release(&keys, &token, abandoned, args).await;
            drop(self);
        });
    }
}

impl Drop for Pending {
    /// Also when the task is dropped unfinished, by a runtime shutting down.
    fn drop(&mut self) {
        self.0.releases.fetch_sub(1, Ordering::AcqRel);
        self.0.released.notify_waiters();
    }
}

/// Guards an acquire script in flight: if the acquire is dropped before its
/// answer arrives, the script may still have admitted it, so the token is
/// released (as abandoned) off the caller's path.
struct Booking<'a> {
    shared: &'a Arc<Shared>,
    keys: &'a Arc<RedisKeys>,
    token: &'a Arc<str>,
    runtime: &'a Handle,
    args: Args,
    armed: bool,
    /// The acquire's place in the waiting line (adopt has none), which
    /// the abandon this sends also gives up.
    line: Option<&'a InLine>,
}

impl<'a> Booking<'a> {
    /// An armed guard for a call about to be sent.
    fn new(
        shared: &'a Arc<Shared>,
        keys: &'a Arc<RedisKeys>,
        token: &'a Arc<str>,
        runtime: &'a Handle,
        args: Args,
        line: Option<&'a InLine>,
    ) -> Self {
        Self {
            shared,
            keys,
            token,
            runtime,
            args,
            armed: true,
            line,
        }
    }

    /// The call ended with `answer`: nothing to take back unless it lost its
    /// connection after being sent (it may still run).
    fn settle<T>(mut self, answer: &Result<T, Error>) {
        self.armed = matches!(answer, Err(err) if may_have_run(err));
    }
}

impl Args {
    /// Whether a send that leaves late can come too close to the next one
    /// (a gap between sends, or a quota's window); in serialized mode the
    /// gap counts from each completion.
    fn sends_late(&self) -> bool {
        (self.cap != 0 && self.min_delay_us > 0) || self.quota > 0
    }
}

/// Runs `call`, bounded by the caller's deadline as well as by the client's
/// timeouts, so a slow Redis cannot hold a caller far past its budget; a
/// call that starts at the deadline (its host frees just in time) still
/// gets [`CALL_GRACE`] to be answered. `None` when the budget ran out.
async fn within<T>(deadline: Option<Instant>, call: impl Future<Output = T>) -> Option<T> {
    match deadline {
        Some(deadline) => {
            let bound = deadline.max(after(Instant::now(), CALL_GRACE));
            tokio::time::timeout_at(bound, call).await.ok()
        }
        None => Some(call.await),
    }
}

impl Drop for Booking<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Some(line) = self.line {
                line.disarm();
            }
            Pending::new(self.shared).send(self.runtime, self.keys, self.token, true, self.args);
        }
    }
}

/// An acquire's place in the waiting line across replicas (see
/// acquire.lua): armed once Redis told it to wait, disarmed when it is
/// admitted (which takes it out of the line). An acquire that ends
/// otherwise (its deadline, an error, dropped by its caller) sends one
/// abandon off the caller's path, so that the waiters behind it need not
/// wait for its place to lapse (the patience it was given). Not retried:
/// the place lapses anyway.
struct InLine {
    shared: Arc<Shared>,
    keys: Arc<RedisKeys>,
    token: Arc<str>,
    runtime: Handle,
    args: Args,
    armed: AtomicBool,
}

impl InLine {
    fn new(
        shared: &Arc<Shared>,
        keys: &Arc<RedisKeys>,
        token: &Arc<str>,
        runtime: &Handle,
        args: Args,
    ) -> Self {
        Self {
            shared: Arc::clone(shared),
            keys: Arc::clone(keys),
            token: Arc::clone(token),
            runtime: runtime.clone(),
            args,
            armed: AtomicBool::new(false),
        }
    }

    /// Told to wait: in line when `joined` (requests of weight 1).
    fn arm(&self, joined: bool) {
        if joined {
            self.armed.store(true, Ordering::Relaxed);
        }
    }

    /// Out of line: admitted, or its abandon sent another way.
    fn disarm(&self) {
        self.armed.store(false, Ordering::Relaxed);
    }
}

impl Drop for InLine {
    fn drop(&mut self) {
        // A Redis the circuit holds off is not asked; the place lapses.
        if !*self.armed.get_mut() || self.shared.circuit.waiting() {
            return;
        }
        let (shared, keys, token, args) = (
            Arc::clone(&self.shared),
            Arc::clone(&self.keys),
            Arc::clone(&self.token),
            self.args,
        );
        self.runtime.spawn(async move {
            shared.leave(&keys, &token, args).await;
        });
    }
}

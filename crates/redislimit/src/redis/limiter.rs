//! `RedisLimiter`: one per-host limit shared by every replica through Redis.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::acquire;
use super::core::Core;
use super::lifecycle::Busy;
use super::ops;
use super::registry::RegistryPlan;
use super::settings::Mode;
use crate::limiter::sealed;
use crate::snapshot::Snapshot;
use crate::{
    BackoffStep, BoxFuture, DomainLimiter, Error, FallbackLimiter, Hooks, HostKey, Limiter,
    NoHooks, Op, Pacing, Permit, Policies, RequestPacing, Spacing,
};

/// Paces requests per host with the state held in Redis, so every replica
/// counts against one limit instead of one limit each.
///
/// Build one per scope with [`RedisLimiter::builder`], wrap it in
/// [`with_fallback`](Self::with_fallback) so retrieval goes on (paced in
/// process) while Redis is away, call [`check_config`](Self::check_config)
/// before sending anything, and [`close`](Limiter::close) it before the
/// program ends (releases go out on spawned tasks).
///
/// - **Serialized** (`cluster_concurrency(0)`, the default): requests to
///   one host never overlap anywhere, each sent at least `min_delay` after
///   the previous completion. The politest pacing; replicas add no
///   throughput.
/// - **Lease** (`cluster_concurrency(n)`): at most `n` requests to a host in
///   flight across the replicas, sent `min_delay` apart. For upstreams that
///   count requests per window; `n` replicas get up to `n` times one
///   replica's throughput.
///
/// Both keep the sliding-window `quota` and [`penalize`](Limiter::penalize).
/// An acquire costs one script call when the host is free; the clock is
/// Redis `TIME`, so replicas need not agree on the time. Set `lease_ttl` to
/// how long a crashed replica may hold a slot (10-30 s suits most crawlers;
/// a live long request renews its lease). Every Redis failure is
/// [`Error::Unavailable`]; a caller's deadline that runs out is
/// [`Error::WaitBudget`]. Timeouts come from the pool (see
/// [`RedisTimeouts`](crate::RedisTimeouts)).
///
/// How it works (the waiting line, late admissions, the quota's buckets,
/// renewals, the circuit, the fallback's plan, the configuration record) is
/// in `docs/DESIGN.md`.
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
    pub(super) core: Arc<Core>,
    /// False under a [`FallbackLimiter`], which reports the waits itself.
    report_waits: bool,
}

impl RedisLimiter {
    /// The default lease TTL.
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
    /// The shortest lease TTL accepted: a lease is renewed every half TTL,
    /// and a renewal is a Redis round trip.
    pub const MIN_LEASE_TTL: Duration = Duration::from_millis(100);

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

    /// The pacing an in-process fallback should apply while Redis is away:
    /// this limiter's pacing, with at most one request in flight per host and
    /// `min_delay` after sends and completions in serialized mode, and
    /// `cluster_concurrency` in flight with `min_delay` between sends in
    /// lease mode.
    pub fn fallback_pacing(&self) -> Pacing {
        self.fallback_policies().default_pacing().clone()
    }

    /// Values of kind `kind` (a name of your choosing, such as
    /// `"robots"`) fetched once for every replica of this limiter's scope
    /// (see [`SharedCache`](super::SharedCache)); errors go to the hooks
    /// as [`Op::Shared`].
    pub fn shared_cache(&self, kind: &str) -> super::SharedCache {
        let core = &self.core;
        super::SharedCache::new(
            Arc::clone(&core.backend),
            Arc::clone(&core.hooks),
            &core.settings.prefix,
            &core.settings.scope,
            kind,
        )
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
    /// keeps up from its first acquire (a heartbeat every 500 ms, off the
    /// admission path). The hooks move
    /// to the fallback limiter, which reports each decision once; this
    /// limiter keeps reporting its errors.
    pub fn with_fallback(mut self) -> FallbackLimiter<Self> {
        let hooks = Arc::clone(&self.core.hooks);
        let fallback = DomainLimiter::new(self.fallback_policies());
        let plan = Arc::new(RegistryPlan {
            registry: Arc::clone(&self.core.registry),
            settings: Arc::clone(&self.core.settings),
            backend: Arc::clone(&self.core.backend),
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

    fn counts_bytes(&self, host: &HostKey) -> bool {
        self.core
            .settings
            .policies
            .pacing_for(host)
            .max_bytes_per_sec()
            > 0
    }

    /// Kept in Redis for every replica, in lease mode (serialized mode
    /// sends one request at a time anyway).
    fn cap_host<'a>(
        &'a self,
        host: HostKey,
        cap: u32,
        window: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(ops::cap(&self.core, host, cap, window))
    }

    /// The byte debt is kept in Redis, shared by every replica.
    fn charge_bytes<'a>(&'a self, host: HostKey, bytes: u64) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(ops::charge(&self.core, host, bytes))
    }

    #[allow(private_interfaces)]
    fn coordination(&self, _: sealed::Token) -> Option<&dyn sealed::Coordination> {
        Some(self)
    }

    /// This process's view: waiting counts the acquires queued here and
    /// those asking Redis; in flight, the permits held. The next send and
    /// penalties live in Redis, so they
    /// are `None`.
    fn snapshot(&self, top: usize) -> Snapshot {
        ops::snapshot(&self.core, top)
    }
}

/// What a `FallbackLimiter` in front of this limiter, and the pacing
/// middlewares, reach through it.
impl sealed::Coordination for RedisLimiter {
    fn answered_since(&self, at: Instant) -> bool {
        self.core.backend.answered_since(at)
    }

    fn answers_for(&self, host: &HostKey) -> bool {
        let settings = &self.core.settings;
        let keys = settings.keys(&settings.policies.key(host));
        // An acquire may also be skipped on the configuration record's node.
        self.core.backend.circuit(keys.gate()).closed()
            && self.core.agreement.answers(&self.core.backend)
    }

    fn probe_host<'a>(&'a self, host: &HostKey) -> BoxFuture<'a, ()> {
        let settings = &self.core.settings;
        let keys = settings.keys(&settings.policies.key(host));
        Box::pin(async move { self.core.backend.probe(keys.gate()).await })
    }

    fn failure_domain(&self, host: &HostKey) -> u32 {
        let settings = &self.core.settings;
        self.core.backend.failure_domain(|| {
            settings
                .keys(&settings.policies.key(host))
                .gate()
                .to_owned()
        })
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

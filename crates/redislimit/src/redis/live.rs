//! Live shared policies: policies published to a scope with a version
//! ([`RedisLimiter::publish_policies`]), and a limiter that follows them
//! ([`LiveLimiter`]) without a restart and without losing any host's state.
//!
//! A host's state (next send, leases, quota, penalties, backoff, bytes)
//! lives in Redis under keys that depend on the scope and the host only, so
//! a limiter rebuilt with other policies over the same scope takes it as it
//! is: the switch changes how the next admission is decided, nothing else.
//! Acquires still waiting at a switch are dropped (which books nothing)
//! and ask again under the new policies; permits granted before it release
//! through the limiter that granted them. So at a switch no gap is shorter
//! than the smaller of the two policies' gaps, and one request in flight
//! per slot at most is followed by the old gap.
//!
//! The scope's configuration record names the version (` policy=N`): a
//! replica that switched takes the record over from the older version, one
//! still on the older version is refused by it (and a `LiveLimiter` then
//! switches at once and asks again), and one on a newer version is never
//! displaced by an older one.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::core::Core;
use super::limiter::RedisLimiter;
use super::published::{named_version, put_back};
use crate::limiter::sealed::{Coordination, Token};
use crate::limiter::{BackoffStep, coordination};
use crate::{
    BoxFuture, Error, FallbackLimiter, HostKey, Limiter, Op, Permit, Policies, RequestPacing,
    Snapshot,
};

impl RedisLimiter {
    /// This limiter, following the policies published to its scope (see
    /// [`LiveLimiter`]).
    pub fn live(self) -> LiveLimiter {
        LiveLimiter::new(self, false)
    }
}

impl FallbackLimiter<RedisLimiter> {
    /// This limiter and its fallback, following the policies published to
    /// the scope (see [`LiveLimiter`]): each version gets a fallback made
    /// as this one was ([`RedisLimiter::with_fallback`]).
    pub fn live(self) -> LiveLimiter {
        LiveLimiter::new(self.primary().clone(), true)
    }
}

/// A Redis limiter (with its fallback, if it had one) that follows the
/// policies published to its scope ([`RedisLimiter::publish_policies`]),
/// from [`RedisLimiter::live`] or [`FallbackLimiter::live`].
///
/// It paces with the policies it was built with until some are
/// published, then with the latest version: it looks every quarter of
/// `lease_ttl` (at least every 50 ms), and at once when the scope's
/// configuration record names a newer version than its own (an acquire
/// refused with [`Error::ConfigMismatch`] is then asked again under the
/// new version). A switch keeps each host's state in Redis, and says so in
/// a log line and to the hooks
/// ([`on_policy_version`](crate::Hooks::on_policy_version)).
/// [`refresh`](Self::refresh) looks now: call it at start, so that a
/// replica started with an older file paces with the published policies
/// from its first request. Published policies this replica cannot use
/// (its builder refuses them, or it cannot read them) are reported once
/// per version, and it keeps its own.
///
/// With [`KeyBy::Ip`](crate::KeyBy::Ip), the published policies resolve
/// names through this replica's resolver. Cheap to share behind an `Arc`.
pub struct LiveLimiter {
    live: Arc<Live>,
}

struct Live {
    current: RwLock<Current>,
    /// Held while the published policies are read and a switch is made.
    switching: tokio::sync::Mutex<()>,
    /// The version in force, announced to the acquires waiting.
    versions: tokio::sync::watch::Sender<u64>,
    /// The limiters of earlier versions, closed at the switch; `close`
    /// waits for those still alive too. Weak: what an earlier version has
    /// left to land (its permits, its releases on their way) keeps it
    /// alive, as do its acquires winding down and handles given out
    /// (`redis()`, `fallback()`), each for a while; this list does not.
    retired: std::sync::Mutex<Vec<Weak<Core>>>,
    fallback: bool,
    every: Duration,
    /// Whether the task that looks for new versions was started.
    watching: std::sync::atomic::AtomicBool,
    /// The last version refused here (reported once).
    refused: std::sync::atomic::AtomicU64,
    /// The last version whose put-back was waited for (reported once).
    awaited: std::sync::atomic::AtomicU64,
}

/// The limiter in force, and the version of its policies (0: its own).
#[derive(Clone)]
struct Current {
    version: u64,
    redis: RedisLimiter,
    limiter: Arc<dyn Limiter>,
    fallback: Option<Arc<FallbackLimiter<RedisLimiter>>>,
}

impl Current {
    fn new(version: u64, redis: RedisLimiter, fallback: bool) -> Self {
        if fallback {
            let limiter = Arc::new(redis.clone().with_fallback());
            Self {
                version,
                redis,
                limiter: Arc::clone(&limiter) as Arc<dyn Limiter>,
                fallback: Some(limiter),
            }
        } else {
            Self {
                version,
                limiter: Arc::new(redis.clone()),
                redis,
                fallback: None,
            }
        }
    }
}

impl LiveLimiter {
    fn new(redis: RedisLimiter, fallback: bool) -> Self {
        let version = redis.core.settings.policy_version;
        let every = (redis.core.settings.lease_ttl / 4).max(Duration::from_millis(50));
        Self {
            live: Arc::new(Live {
                current: RwLock::new(Current::new(version, redis, fallback)),
                switching: tokio::sync::Mutex::new(()),
                versions: tokio::sync::watch::Sender::new(version),
                retired: std::sync::Mutex::default(),
                fallback,
                every,
                watching: std::sync::atomic::AtomicBool::new(false),
                refused: std::sync::atomic::AtomicU64::new(0),
                awaited: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// The version of the published policies in force; 0 before any was
    /// published (or read).
    pub fn version(&self) -> u64 {
        self.live.current().version
    }

    /// The policies in force.
    pub fn policies(&self) -> Policies {
        self.live.current().redis.policies().clone()
    }

    /// The Redis limiter in force (its policies are the version's).
    pub fn redis(&self) -> RedisLimiter {
        self.live.current().redis
    }

    /// The limiter with its fallback in force, when this one was made
    /// from a [`FallbackLimiter`].
    pub fn fallback(&self) -> Option<Arc<FallbackLimiter<RedisLimiter>>> {
        self.live.current().fallback
    }

    /// Looks for published policies now and switches to them when they
    /// are newer than those in force, or puts those in force back when
    /// the scope lost them (or holds an older version); returns the
    /// version in force after.
    /// Fails when Redis cannot be asked, or the published policies cannot
    /// be used here (the limiter keeps its own then).
    pub async fn refresh(&self) -> Result<u64, Error> {
        self.live.watch();
        self.live.refresh().await
    }

    /// Checks now that the scope admits with the policies in force (see
    /// [`RedisLimiter::check_config`]), as an acquire would: a record
    /// naming a newer version is switched to first; one naming a version
    /// that is not published (Redis lost the policies, and the replicas in
    /// use put them back at their next look) is waited for, two looks at
    /// most: no wait ends past `deadline`, and each check and read of the
    /// policies is a Redis call within the pool's timeouts. A program
    /// calls it at start, after [`refresh`](Self::refresh), to refuse to
    /// start beside replicas that pace the scope otherwise.
    pub async fn check_config(&self, deadline: Option<Instant>) -> Result<(), Error> {
        self.live.watch();
        let mut unpublished = None;
        loop {
            let current = self.live.current();
            let checked = current.redis.check_config().await;
            match &checked {
                Err(Error::ConfigMismatch { theirs, .. })
                    if self
                        .live
                        .ask_again(theirs, current.version, &mut unpublished, deadline)
                        .await => {}
                _ => return checked,
            }
        }
    }
}

impl Live {
    /// The limiters of earlier versions still alive (see `retired`).
    fn retired(&self) -> Vec<Arc<Core>> {
        self.alive().iter().filter_map(Weak::upgrade).collect()
    }

    /// Adds `core` (of the version being left) to the retired ones.
    fn retire(&self, core: &Arc<Core>) {
        self.alive().push(Arc::downgrade(core));
    }

    /// The retired list, those no longer alive dropped from it.
    fn alive(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Core>>> {
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        retired.retain(|core| core.strong_count() > 0);
        retired
    }

    fn current(&self) -> Current {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits a moment for the published policies to be put back, unless
    /// `until` (set at the first wait: two looks from then) or `deadline`
    /// has passed; whether to ask again.
    async fn wait_for_put_back(
        &self,
        named: u64,
        until: &mut Option<Instant>,
        deadline: Option<Instant>,
    ) -> bool {
        use std::sync::atomic::Ordering;
        let now = Instant::now();
        let until = *until.get_or_insert_with(|| {
            // Said once per version, not by every acquire that waits.
            if self.awaited.swap(named, Ordering::Relaxed) != named {
                tracing::info!(
                    version = named,
                    "the scope's configuration record names published policies Redis does not \
                     hold: waiting for the replicas in use to put them back (two looks at most)"
                );
            }
            now + self.every * 2
        });
        let retry =
            now + (self.every / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
        if retry > until || deadline.is_some_and(|d| retry > d) {
            return false;
        }
        tokio::time::sleep_until(retry).await;
        true
    }

    /// Whether to ask again after the scope's record, holding `theirs`,
    /// refused the limiter of `version`: the record names another version,
    /// which is switched to now; or a newer version than any published
    /// (Redis lost the policies, and the replicas in use put theirs back,
    /// with the record or at their next look), waited for a moment (see
    /// [`wait_for_put_back`](Self::wait_for_put_back)).
    async fn ask_again(
        &self,
        theirs: &str,
        version: u64,
        unpublished: &mut Option<Instant>,
        deadline: Option<Instant>,
    ) -> bool {
        match self.refresh().await {
            Ok(now) if now != version => true,
            // Published, but not usable here: reported.
            Err(err) if !err.is_unavailable() => false,
            _ => {
                let named = named_version(theirs);
                named > version && self.wait_for_put_back(named, unpublished, deadline).await
            }
        }
    }

    /// Starts the task that looks for new versions (once, in a runtime).
    fn watch(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        if self.watching.load(Ordering::Relaxed)
            || tokio::runtime::Handle::try_current().is_err()
            || self.watching.swap(true, Ordering::AcqRel)
        {
            return;
        }
        tokio::spawn(watch(Arc::downgrade(self), self.every));
    }

    async fn refresh(&self) -> Result<u64, Error> {
        let _switching = self.switching.lock().await;
        let current = self.current();
        let refused = |err: Error, version: u64| {
            use std::sync::atomic::Ordering;
            if self.refused.swap(version, Ordering::Relaxed) != version {
                tracing::error!(
                    version,
                    in_force = current.version,
                    error = %crate::error::Causes(&err),
                    "the policies published to the scope cannot be used here: pacing on with \
                     those in force"
                );
                current.redis.core.hooks.on_error(Op::Policies, &err);
            }
            err
        };
        let (version, policies) = match current.redis.published_policies().await {
            Ok(Some(published)) if published.0 >= current.version => published,
            // Redis lost them (a restart without persistence, a flush), or
            // a replica that had not switched yet put an older version
            // back first: the version in force goes back, so that a
            // replica started now follows it rather than being refused by
            // the agreement the replicas in use put back. An older version
            // published since (Redis had lost the count) is renumbered
            // past it, and followed.
            Ok(_) if current.version > 0 => {
                if !put_back(&current.redis, current.version).await? {
                    return Ok(current.version);
                }
                // Put back, or an older publication renumbered: read again.
                match current.redis.published_policies().await {
                    Ok(Some(published)) if published.0 > current.version => published,
                    _ => return Ok(current.version),
                }
            }
            Ok(_) => return Ok(current.version),
            Err(err) if err.is_unavailable() => return Err(err),
            Err(err) => return Err(refused(err, u64::MAX)),
        };
        if version == current.version {
            return Ok(version);
        }
        let policies = policies.with_addresses_of(current.redis.policies());
        let redis = match current.redis.rebuilder(policies, version).build() {
            Ok(redis) => redis,
            Err(err) => return Err(refused(err.into(), version)),
        };
        let lease_ttl = current.redis.core.settings.lease_ttl;
        // Retired before the switch: a `close` from here on waits for it.
        self.retire(&current.redis.core);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) =
            Current::new(version, redis, self.fallback);
        self.versions.send_replace(version);
        // The old limiter admits no more (its waiters ask again under the
        // new version) and leaves the registry once its permits are back.
        let old = Arc::clone(&current.limiter);
        tokio::spawn(async move {
            let _ = old.close(Some(Instant::now() + lease_ttl)).await;
        });
        tracing::info!(
            version,
            before = current.version,
            "pacing with the policies published to the scope (version {version}); each host's \
             state is kept"
        );
        current.redis.core.hooks.on_policy_version(version);
        Ok(version)
    }
}

/// Looks for a new version every `every`, while the limiter lives.
async fn watch(live: Weak<Live>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(live) = live.upgrade() else {
            return;
        };
        if live.current().redis.core.lifecycle.is_closed() {
            return;
        }
        let _ = tokio::time::timeout(every.max(Duration::from_secs(1)), live.refresh()).await;
    }
}

impl Limiter for LiveLimiter {
    fn acquire_with<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> BoxFuture<'a, Result<Permit, Error>> {
        self.live.watch();
        Box::pin(async move {
            // Until when a record naming a version not published (yet)
            // is waited out.
            let mut unpublished: Option<Instant> = None;
            loop {
                // Subscribed first: a switch from here on is seen.
                let mut switched = self.live.versions.subscribe();
                let current = self.live.current();
                let acquire = current
                    .limiter
                    .acquire_with(engine, host.clone(), deadline, request);
                tokio::select! {
                    biased;
                    got = acquire => match got {
                        Err(Error::ConfigMismatch { ref theirs, .. }) => {
                            let again = self
                                .live
                                .ask_again(theirs, current.version, &mut unpublished, deadline)
                                .await;
                            if !again {
                                return got;
                            }
                        }
                        // Closed by a switch (not by `close`): ask again.
                        Err(Error::Closed)
                            if self.live.current().version != current.version => {}
                        got => return got,
                    },
                    // Switched while waiting: the wait is dropped (booking
                    // nothing) and asked again under the new policies.
                    Ok(()) = switched.changed() => {}
                }
            }
        })
    }

    fn penalize_host<'a>(
        &'a self,
        host: HostKey,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let limiter = self.live.current().limiter;
        Box::pin(async move { limiter.penalize_host(host, hold).await })
    }

    fn counts_bytes(&self, host: &HostKey) -> bool {
        self.live.current().limiter.counts_bytes(host)
    }

    fn charge_bytes<'a>(&'a self, host: HostKey, bytes: u64) -> BoxFuture<'a, Result<(), Error>> {
        let limiter = self.live.current().limiter;
        Box::pin(async move { limiter.charge_bytes(host, bytes).await })
    }

    fn cap_host<'a>(
        &'a self,
        host: HostKey,
        cap: u32,
        window: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let limiter = self.live.current().limiter;
        Box::pin(async move { limiter.cap_host(host, cap, window).await })
    }

    #[allow(private_interfaces)]
    fn coordination(&self, _: Token) -> Option<&dyn Coordination> {
        Some(self)
    }

    fn snapshot(&self, top: usize) -> Snapshot {
        let current = self.live.current();
        let mut snapshot = current.limiter.snapshot(top);
        snapshot.policy_version = (current.version > 0).then_some(current.version);
        snapshot
    }

    /// Closes the limiter in force and waits for those of earlier
    /// versions to land their last releases too.
    fn close(&self, deadline: Option<Instant>) -> BoxFuture<'_, Result<(), Error>> {
        let limiter = self.live.current().limiter;
        let retired = self.live.retired();
        Box::pin(async move {
            let mut closed = limiter.close(deadline).await;
            for old in retired {
                let done = super::ops::close(&old, deadline).await;
                closed = closed.and(done);
            }
            closed
        })
    }
}

/// The coordination of the limiter in force, for this crate's layers.
impl Coordination for LiveLimiter {
    fn adopt_host<'a>(
        &'a self,
        host: HostKey,
        ago: Duration,
        weight: u32,
    ) -> BoxFuture<'a, Result<Option<Permit>, Error>> {
        let limiter = self.live.current().limiter;
        Box::pin(async move {
            match coordination(&*limiter) {
                Some(c) => c.adopt_host(host, ago, weight).await,
                None => Ok(None),
            }
        })
    }

    fn back_off_host<'a>(
        &'a self,
        host: HostKey,
        step: BackoffStep,
    ) -> Option<BoxFuture<'a, Result<Option<Duration>, Error>>> {
        let limiter = self.live.current().limiter;
        // Whether the limiter keeps the gap: asking builds a future that
        // does nothing until polled.
        drop(coordination(&*limiter)?.back_off_host(host.clone(), step)?);
        Some(Box::pin(async move {
            match coordination(&*limiter).and_then(|c| c.back_off_host(host, step)) {
                Some(gap) => gap.await,
                None => Ok(None),
            }
        }))
    }

    fn report_hold(&self, host: &HostKey, cause: &str, hold: Duration) {
        if let Some(c) = coordination(&*self.live.current().limiter) {
            c.report_hold(host, cause, hold);
        }
    }

    fn failure_domain(&self, host: &HostKey) -> u32 {
        coordination(&*self.live.current().limiter).map_or(0, |c| c.failure_domain(host))
    }

    fn answered_since(&self, at: Instant) -> bool {
        coordination(&*self.live.current().limiter).is_some_and(|c| c.answered_since(at))
    }

    fn answers_for(&self, host: &HostKey) -> bool {
        coordination(&*self.live.current().limiter).is_some_and(|c| c.answers_for(host))
    }

    fn probe_host<'a>(&'a self, host: &HostKey) -> BoxFuture<'a, ()> {
        let host = host.clone();
        Box::pin(async move {
            let current = self.live.current();
            if let Some(c) = coordination(&*current.limiter) {
                c.probe_host(&host).await;
            }
        })
    }
}

impl fmt::Debug for LiveLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let current = self.live.current();
        f.debug_struct("LiveLimiter")
            .field("version", &current.version)
            .field("redis", &current.redis)
            .field("fallback", &self.live.fallback)
            .field("earlier_versions_closing", &self.live.retired().len())
            .finish_non_exhaustive()
    }
}

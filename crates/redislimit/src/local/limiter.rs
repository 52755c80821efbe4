//! `DomainLimiter`: first come, first served (by priority), event-driven
//! per-host pacing in one process.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use url::Url;

use super::acquire::acquire;
use super::shards::{Inner, RandomState, lock};
use super::sweep::SweepSignal;
use crate::limiter::sealed;
use crate::snapshot::{HostSnapshot, PacedBy, Snapshot, TopHosts};
use crate::{
    BoxFuture, Error, Hooks, HostKey, Limiter, NoHooks, Pacing, Permit, Policies, RequestPacing,
};

/// The in-process limiter: paces requests per host within one process.
///
/// Per host it keeps at most [`max_concurrent`](Pacing::max_concurrent)
/// requests in flight, sends each at least
/// [`min_delay`](Pacing::min_delay) after the previous send *and* after the
/// latest completion, admits at most [`quota`](Pacing::quota) per sliding
/// [`window`](Pacing::window), and adds [`jitter`](Pacing::jitter) to every
/// nonzero wait. Waiters for one host are served first come, first served,
/// within their [priority](crate::RequestPacing) (higher first); every
/// host's rule comes from its [`Policies`].
///
/// It is event-driven: a waiter sleeps exactly until its turn can come, or
/// until a release or a penalty changes it; there is no polling loop and no
/// task per host. Dropping an acquire future frees its place in line at
/// once, and the next waiter is served as if it had never been there. A
/// host's state is forgotten as soon as it constrains nothing any more (no
/// request in flight, its delays and window elapsed), within 25 ms, by
/// one background task per limiter that sleeps until the next host becomes
/// idle, so a crawl over millions of hosts holds state only for the
/// recently active ones.
///
/// Cloning is cheap and the clones share all state.
///
/// ```
/// use std::time::Duration;
/// use redislimit::{DomainLimiter, Limiter, Pacing};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), redislimit::Error> {
/// let pacing = Pacing::builder().min_delay(Duration::from_secs(1)).build()?;
/// let limiter = DomainLimiter::new(pacing);
/// let url = "https://example.com/".parse().unwrap();
///
/// let first = limiter.acquire("docs", &url, None).await?;
/// first.release();
/// let start = tokio::time::Instant::now();
/// let second = limiter.acquire("docs", &url, None).await?;
/// assert_eq!(start.elapsed(), Duration::from_secs(1));
/// # drop(second); Ok(()) }
/// ```
#[derive(Clone)]
pub struct DomainLimiter {
    inner: Arc<Inner>,
}

impl DomainLimiter {
    /// An in-process limiter with `policies`: a [`Pacing`] for every host,
    /// or [`Policies`] with per-host rules.
    pub fn new(policies: impl Into<Policies>) -> Self {
        Self::with_hooks(policies, Arc::new(NoHooks))
    }

    /// An in-process limiter that reports its decisions to `hooks`.
    pub fn with_hooks(policies: impl Into<Policies>, hooks: Arc<dyn Hooks>) -> Self {
        let shards = std::thread::available_parallelism()
            .map_or(4, usize::from)
            .saturating_mul(4)
            .next_power_of_two();
        Self {
            inner: Arc::new(Inner {
                policies: policies.into(),
                hooks,
                shards: (0..shards).map(|_| Mutex::default()).collect(),
                hasher: RandomState::default(),
                next_id: AtomicU64::new(0),
                sweep: Arc::new(SweepSignal::new()),
                closed: AtomicBool::new(false),
                track_in_flight: false,
            }),
        }
    }

    /// A limiter whose snapshot counts requests in flight as waiting (the
    /// Redis limiter's queue of callers asking Redis).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn tracking_in_flight(policies: impl Into<Policies>) -> Self {
        let mut limiter = Self::new(policies);
        if let Some(inner) = Arc::get_mut(&mut limiter.inner) {
            inner.track_in_flight = true;
        }
        limiter
    }

    /// [`Limiter::acquire`], its future not boxed: what a program that
    /// holds a `DomainLimiter` (not a `dyn Limiter`) calls, with no
    /// allocation on an acquire that need not wait.
    pub fn acquire<'a>(
        &'a self,
        engine: &'a str,
        url: &Url,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Permit, Error>> + Send + use<'a> {
        let host = HostKey::from_url(url);
        async move {
            acquire(
                &self.inner,
                engine,
                host?,
                deadline,
                RequestPacing::default(),
            )
            .await
        }
    }

    /// [`Limiter::acquire_host`], its future not boxed (see
    /// [`acquire`](Self::acquire)).
    pub fn acquire_host<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Permit, Error>> + Send + use<'a> {
        acquire(
            &self.inner,
            engine,
            host,
            deadline,
            RequestPacing::default(),
        )
    }

    /// [`Limiter::acquire_with`], its future not boxed (see
    /// [`acquire`](Self::acquire)).
    pub fn acquire_with<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> impl Future<Output = Result<Permit, Error>> + Send + use<'a> {
        acquire(&self.inner, engine, host, deadline, request)
    }

    /// The pacing of hosts no rule matches.
    pub fn pacing(&self) -> &Pacing {
        self.inner.policies.default_pacing()
    }

    /// The pacing of every host.
    pub fn policies(&self) -> &Policies {
        &self.inner.policies
    }

    /// The latest send to `host` recorded through a permit's `try_send`.
    pub(crate) fn last_sent(&self, host: &HostKey) -> Option<Instant> {
        let key = self.inner.policies.key(host);
        lock(self.inner.shard(&key))
            .hosts
            .get(&key)
            .and_then(|entry| entry.state.last_sent())
    }

    /// The cap on requests in flight `host` stated (see
    /// [`Limiter::cap_host`]) while it holds.
    pub(crate) fn stated_cap(&self, host: &HostKey) -> Option<(u32, Instant)> {
        let key = self.inner.policies.key(host);
        let stated = lock(self.inner.shard(&key))
            .hosts
            .get(&key)
            .and_then(|entry| entry.state.stated_cap());
        stated.filter(|&(_, until)| until > Instant::now())
    }

    /// How many hosts this limiter holds state for: those with requests in
    /// flight or waiting, and those whose delays, penalties or quota window
    /// have not yet elapsed.
    pub fn host_count(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).hosts.len()).sum()
    }

    /// Calls `f` with each busy host's key (acquires waiting, or in flight
    /// when tracked), its waiting acquires, requests in flight, earliest
    /// next send and penalty end; returns the totals over every host
    /// (hosts, waiting, in flight). One shard locked at a time; `f` must
    /// not call into this limiter.
    pub(crate) fn visit_busy(
        &self,
        mut f: impl FnMut(&HostKey, usize, usize, Instant, Option<Instant>),
    ) -> (usize, usize, usize) {
        let mut totals = (0, 0, 0);
        for shard in &self.inner.shards {
            let guard = lock(shard);
            totals.0 += guard.hosts.len();
            totals.1 += guard.queued;
            totals.2 += guard.in_flight;
            for host in &guard.busy {
                let Some(entry) = guard.hosts.get(host) else {
                    continue;
                };
                let pacing = self.inner.policies.at(entry.policy);
                f(
                    host,
                    entry.queue.len(),
                    entry.state.in_flight() as usize,
                    entry.state.next_send(pacing, 1),
                    entry.state.held_until(),
                );
            }
        }
        totals
    }

    /// Requests in flight under `key` (a key, as `visit_busy` names them).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn in_flight_of(&self, key: &HostKey) -> usize {
        lock(self.inner.shard(key))
            .hosts
            .get(key)
            .map_or(0, |entry| entry.state.in_flight() as usize)
    }

    /// [`Limiter::snapshot`], naming `paced_by`, with the next send and
    /// penalty end when `times` (this process decides them).
    pub(crate) fn snapshot_as(&self, top: usize, paced_by: PacedBy, times: bool) -> Snapshot {
        let now = Instant::now();
        let mut tops = TopHosts::new(top);
        let (active_hosts, queued, in_flight) =
            self.visit_busy(|host, queued, in_flight, next, held| {
                tops.offer(queued, in_flight, || HostSnapshot {
                    host: host.clone(),
                    queued,
                    in_flight,
                    next_send: times.then_some(next.max(now)),
                    held_until: held.filter(|&held| times && held > now),
                    paced_by,
                });
            });
        Snapshot {
            hosts: tops.into_hosts(),
            active_hosts,
            queued,
            in_flight,
            policy_version: None,
        }
    }
}

impl fmt::Debug for DomainLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DomainLimiter")
            .field("policies", &self.inner.policies)
            .field("hooks", &self.inner.hooks)
            .finish_non_exhaustive()
    }
}

impl Limiter for DomainLimiter {
    fn acquire_with<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> BoxFuture<'a, Result<Permit, Error>> {
        Box::pin(acquire(&self.inner, engine, host, deadline, request))
    }

    fn penalize_host<'a>(
        &'a self,
        host: HostKey,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        match self.inner.policies.resolving(&host) {
            Some(lookup) => Box::pin(async move {
                lookup.await;
                self.inner.penalize(host, hold);
                Ok(())
            }),
            None => {
                self.inner.penalize(host, hold);
                Box::pin(std::future::ready(Ok(())))
            }
        }
    }

    fn counts_bytes(&self, host: &HostKey) -> bool {
        self.inner.policies.pacing_for(host).max_bytes_per_sec() > 0
    }

    fn charge_bytes<'a>(&'a self, host: HostKey, bytes: u64) -> BoxFuture<'a, Result<(), Error>> {
        match self.inner.policies.resolving(&host) {
            Some(lookup) => Box::pin(async move {
                lookup.await;
                self.inner.charge(host, bytes);
                Ok(())
            }),
            None => {
                self.inner.charge(host, bytes);
                Box::pin(std::future::ready(Ok(())))
            }
        }
    }

    fn cap_host<'a>(
        &'a self,
        host: HostKey,
        cap: u32,
        window: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            if let Some(lookup) = self.inner.policies.resolving(&host) {
                lookup.await;
            }
            self.inner.state_cap(host, cap, window);
            Ok(())
        })
    }

    #[allow(private_interfaces)]
    fn coordination(&self, _: sealed::Token) -> Option<&dyn sealed::Coordination> {
        Some(self)
    }

    /// Every host is in process; its next send and penalty end are known.
    /// One pass over every host's state, a shard locked at a time.
    fn snapshot(&self, top: usize) -> Snapshot {
        self.snapshot_as(top, PacedBy::InProcess, true)
    }

    /// Refuses every acquire from now on and wakes the waiting ones with
    /// [`Error::Closed`]; releases are in-process, so nothing is pending.
    fn close(&self, _deadline: Option<Instant>) -> BoxFuture<'_, Result<(), Error>> {
        self.inner.closed.store(true, Ordering::SeqCst);
        for shard in &self.inner.shards {
            for entry in lock(shard).hosts.values() {
                for waiter in entry.queue.iter() {
                    // A stored permit: a waiter about to park still wakes.
                    waiter.wake.notify_one();
                }
            }
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Holds are reported to this limiter's hooks; nothing else is shared.
impl sealed::Coordination for DomainLimiter {
    fn report_hold(&self, host: &HostKey, cause: &str, hold: Duration) {
        let key = self.inner.policies.key(host);
        self.inner.hooks.on_hold(&key, cause, hold);
    }
}

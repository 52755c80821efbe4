//! `FallbackLimiter`: a shared limiter on top of in-process pacing that
//! carries on alone while the shared one is unavailable.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::Acquire;
use super::adoption::{Adoptions, Deferred};
use super::plan::OutagePlan;
use super::shares::{Domains, Shares};
use crate::limiter::sealed;
use crate::snapshot::{PacedBy, Snapshot, TopHosts};
use crate::{
    BackoffStep, BoxFuture, DomainLimiter, Error, Hooks, HostKey, Limiter, NoHooks, Permit,
    RequestPacing,
};

/// Paces every request through an in-process [`DomainLimiter`] first and
/// then through `primary` (typically a Redis-backed limiter); when the
/// primary fails with [`Error::Unavailable`], the in-process admission
/// stands alone, so retrieval goes on while the shared backend is away.
/// Every other error (a blown wait budget, a URL without a host) is
/// returned as it is.
///
/// The in-process limiter is always consulted, not only during an outage.
/// Its pacing is implied by the shared limit (a replica that keeps the
/// cluster-wide pace keeps its own), so while the primary is healthy it
/// adds no wait; what it adds is memory: it knows this replica's recent
/// requests, so neither losing the primary nor getting it back lets this
/// replica burst, and there is never a second, independent pace running in
/// the same process.
///
/// That memory is of sends, not of admissions: an acquire is admitted
/// in-process first (which keeps this process's FIFO order and in-flight
/// cap) and then waits on the primary, so its request leaves when the
/// primary admits it, and that instant is what the in-process gap and quota
/// count from. An acquire that the primary fails gives its early in-process
/// admission back and queues again for one made now: acquires that fail
/// over together (all the waiters behind a frozen Redis) go out one
/// `min_delay` apart, the first one `min_delay` after the latest request
/// the primary admitted.
///
/// Hooks are reported here, once per decision: give the inner limiters
/// none for waits ([`RedisLimiter::with_fallback`](crate::RedisLimiter::with_fallback)
/// arranges this; the primary still reports its errors). Penalties go to
/// both limiters, so the in-process one honours a `Retry-After` seen while
/// the primary was healthy.
///
/// ```
/// use redislimit::{DomainLimiter, FallbackLimiter, Limiter, Pacing};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), redislimit::Error> {
/// // Any limiter can be the primary; usually it is `RedisLimiter::with_fallback()`.
/// let limiter = FallbackLimiter::new(
///     DomainLimiter::new(Pacing::default()),
///     DomainLimiter::new(Pacing::default()),
/// );
/// let url = "https://example.com/".parse().unwrap();
/// drop(limiter.acquire("docs", &url, None).await?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FallbackLimiter<P> {
    primary: Arc<P>,
    fallback: DomainLimiter,
    hooks: Arc<dyn Hooks>,
    /// How each host is served while the primary is unavailable; every
    /// host alone, at the full in-process pacing, when unset.
    outage: Option<Arc<dyn OutagePlan>>,
    /// The pacing shares in use during the current outage, per failure
    /// domain of the primary.
    shares: Arc<Domains>,
    /// Requests admitted in-process during an outage, still to be counted
    /// in the primary once it answers.
    adoptions: Arc<Adoptions>,
    /// Hosts deferred to another replica during an outage.
    deferred: Arc<Deferred>,
    /// Set by [`Limiter::close`]; wakes the acquires under way.
    closing: Arc<Closing>,
    /// Whether the latest decision was the fallback's (the primary failed).
    degraded: Arc<AtomicBool>,
}

/// Whether a limiter was closed, and a wake-up for its waiters when it is.
#[derive(Debug, Default)]
struct Closing {
    closed: AtomicBool,
    notify: tokio::sync::Notify,
}

impl<P> Clone for FallbackLimiter<P> {
    fn clone(&self) -> Self {
        Self {
            primary: Arc::clone(&self.primary),
            fallback: self.fallback.clone(),
            hooks: Arc::clone(&self.hooks),
            outage: self.outage.clone(),
            shares: Arc::clone(&self.shares),
            adoptions: Arc::clone(&self.adoptions),
            deferred: Arc::clone(&self.deferred),
            closing: Arc::clone(&self.closing),
            degraded: Arc::clone(&self.degraded),
        }
    }
}

impl<P: Limiter> FallbackLimiter<P> {
    /// Paces through `fallback` and then `primary`, and through `fallback`
    /// alone while `primary` is unavailable.
    pub fn new(primary: P, fallback: DomainLimiter) -> Self {
        Self {
            primary: Arc::new(primary),
            fallback,
            hooks: Arc::new(NoHooks),
            outage: None,
            shares: Arc::default(),
            adoptions: Arc::default(),
            deferred: Arc::default(),
            closing: Arc::default(),
            degraded: Arc::default(),
        }
    }

    /// Serves each host as `plan` says while the primary is unavailable.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_outage_plan(mut self, plan: Arc<dyn OutagePlan>) -> Self {
        self.outage = Some(plan);
        self
    }

    /// Reports every decision to `hooks`.
    pub fn with_hooks(mut self, hooks: Arc<dyn Hooks>) -> Self {
        self.hooks = hooks;
        self
    }

    /// The shared limiter.
    pub fn primary(&self) -> &P {
        &self.primary
    }

    /// The in-process limiter.
    pub fn fallback(&self) -> &DomainLimiter {
        &self.fallback
    }

    /// Whether this limiter is pacing in-process: the primary failed its
    /// latest call and has not admitted anything since.
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// How many admissions the in-process side made alone (the primary
    /// unavailable for their hosts) since this limiter was made. With a
    /// Redis Cluster one master may be away while the others answer: read
    /// it twice to tell how much of the traffic in between went without
    /// Redis, which [`is_degraded`](Self::is_degraded) (the latest
    /// decision only) cannot.
    pub fn in_process_admissions(&self) -> u64 {
        self.adoptions.admitted()
    }
}

/// A snapshot of `top` hosts from the in-process side's view `local` and the
/// primary's `shared`: waiting in either, in flight in the primary (a host
/// the primary does not list has nothing waiting there: what is in flight
/// in process is what it admitted).
fn merge(top: usize, local: &Snapshot, mut shared: Snapshot) -> Snapshot {
    for host in &local.hosts {
        match shared.hosts.iter_mut().find(|h| h.host == host.host) {
            Some(entry) => entry.queued += host.queued,
            None => shared.hosts.push(host.clone()),
        }
    }
    let mut tops = TopHosts::new(top);
    for host in shared.hosts {
        tops.offer(host.queued, host.in_flight, || host);
    }
    Snapshot {
        hosts: tops.into_hosts(),
        active_hosts: local.active_hosts.max(shared.active_hosts),
        queued: local.queued + shared.queued,
        in_flight: shared.in_flight,
        policy_version: shared.policy_version,
    }
}

impl<P: Limiter + 'static> FallbackLimiter<P> {
    /// This limiter's parts, as an acquire works with them, with the
    /// shares of the failure domain (`shares`) of the host it is for.
    fn parts<'a>(&'a self, shares: &'a Arc<Shares>) -> Acquire<'a, P> {
        Acquire {
            primary: &self.primary,
            fallback: &self.fallback,
            hooks: &*self.hooks,
            outage: self.outage.as_deref(),
            shares,
            adoptions: &self.adoptions,
            deferred: &self.deferred,
            degraded: &self.degraded,
        }
    }
}

impl<P: Limiter + 'static> Limiter for FallbackLimiter<P> {
    /// The priority orders this process's waiters in the in-process
    /// limiter, where every acquire waits first, and in the primary's.
    fn acquire_with<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> BoxFuture<'a, Result<Permit, Error>> {
        Box::pin(async move {
            let closing = self.closing.notify.notified();
            tokio::pin!(closing);
            closing.as_mut().enable();
            if self.closing.closed.load(Ordering::SeqCst) {
                return Err(Error::Closed);
            }
            // Keyed by address: known before the failure domain is chosen.
            if let Some(lookup) = self.fallback.policies().resolving(&host) {
                lookup.await;
            }
            let domain =
                crate::limiter::coordination(&*self.primary).map_or(0, |c| c.failure_domain(&host));
            let shares = self.shares.of(domain);
            let parts = self.parts(&shares);
            tokio::select! {
                biased;
                acquired = parts.run(engine, host, deadline, request) => acquired,
                // Dropped as a cancelled acquire: given back everywhere.
                () = closing => Err(Error::Closed),
            }
        })
    }

    /// Closes the fallback and the primary (waiting for the primary's
    /// pending releases, as it does).
    fn close(&self, deadline: Option<Instant>) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            self.closing.closed.store(true, Ordering::SeqCst);
            self.closing.notify.notify_waiters();
            self.fallback.close(deadline).await?;
            self.primary.close(deadline).await
        })
    }

    #[allow(private_interfaces)]
    fn coordination(&self, _: sealed::Token) -> Option<&dyn sealed::Coordination> {
        Some(self)
    }

    /// While the primary answers, hosts are paced by it
    /// ([`PacedBy::Shared`], times unknown here): waiting are the acquires
    /// queued in process (where every acquire waits first) and those the
    /// primary reports waiting for it; in flight, those it admitted. While
    /// it does not answer, the in-process side's view
    /// ([`PacedBy::Fallback`], with the next send and penalty end).
    fn snapshot(&self, top: usize) -> Snapshot {
        if self.is_degraded() {
            return self.fallback.snapshot_as(top, PacedBy::Fallback, true);
        }
        let local = self.fallback.snapshot_as(top, PacedBy::Shared, false);
        let shared = self.primary.snapshot(top);
        if shared == Snapshot::default() {
            // A primary that reports nothing of its own.
            return local;
        }
        merge(top, &local, shared)
    }

    fn penalize_host<'a>(
        &'a self,
        host: HostKey,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.fallback.penalize_host(host.clone(), hold).await?;
            match self.primary.penalize_host(host, hold).await {
                // Reported by the primary; the in-process limiter holds the host.
                Err(err) if err.is_unavailable() => Ok(()),
                result => result,
            }
        })
    }

    fn counts_bytes(&self, host: &HostKey) -> bool {
        self.primary.counts_bytes(host) || self.fallback.counts_bytes(host)
    }

    /// Capped in both, as a penalty is held in both.
    fn cap_host<'a>(
        &'a self,
        host: HostKey,
        cap: u32,
        window: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.fallback.cap_host(host.clone(), cap, window).await?;
            // Kept for an outage (see `Shares::stated`).
            let domain =
                crate::limiter::coordination(&*self.primary).map_or(0, |c| c.failure_domain(&host));
            let key = self.fallback.policies().key(&host);
            let until = crate::pacing::after(Instant::now(), window);
            self.shares.of(domain).state(key, cap, until);
            match self.primary.cap_host(host, cap, window).await {
                Err(err) if err.is_unavailable() => Ok(()),
                result => result,
            }
        })
    }

    /// Charged in both, as a penalty is: the in-process debt paces the
    /// host if the primary stops answering. During an outage, this
    /// replica's share (a `1/n` of the byte rate) is charged too.
    fn charge_bytes<'a>(&'a self, host: HostKey, bytes: u64) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.fallback.charge_bytes(host.clone(), bytes).await?;
            let domain =
                crate::limiter::coordination(&*self.primary).map_or(0, |c| c.failure_domain(&host));
            if let Some(share) = self.shares.of(domain).limiter() {
                share.charge_bytes(host.clone(), bytes).await?;
            }
            match self.primary.charge_bytes(host, bytes).await {
                Err(err) if err.is_unavailable() => Ok(()),
                result => result,
            }
        })
    }
}

/// Holds are reported once, here; the primary's shared backoff gap is used
/// when it keeps one.
impl<P: Limiter + 'static> sealed::Coordination for FallbackLimiter<P> {
    fn report_hold(&self, host: &HostKey, cause: &str, hold: Duration) {
        let key = self.fallback.policies().key(host);
        self.hooks.on_hold(&key, cause, hold);
    }

    /// The primary's shared gap, when it keeps one; the hold it reports is
    /// mirrored in the fallback, as a penalty is. A primary that is
    /// unavailable fails the future, and the caller keeps the gap itself.
    fn back_off_host<'a>(
        &'a self,
        host: HostKey,
        step: BackoffStep,
    ) -> Option<BoxFuture<'a, Result<Option<Duration>, Error>>> {
        let shared =
            crate::limiter::coordination(&*self.primary)?.back_off_host(host.clone(), step)?;
        Some(Box::pin(async move {
            let gap = shared.await?;
            if let Some(gap) = gap {
                self.fallback.penalize_host(host, gap).await?;
            }
            Ok(gap)
        }))
    }
}

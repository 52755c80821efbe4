//! `FallbackLimiter`: a shared limiter on top of in-process pacing that
//! carries on alone while the shared one is unavailable.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::hooks::WaitReport;
use crate::limiter::heaviest;
use crate::pacing::after;
use crate::permit::Unsent;
use crate::snapshot::{PacedBy, Snapshot, TopHosts};
use crate::{
    BackoffStep, BoxFuture, DomainLimiter, Error, Hooks, HostKey, Limiter, NoHooks, Pacing, Permit,
    Policies, RequestPacing, WaitOutcome,
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
    /// The pacing shares in use during the current outage.
    shares: Arc<Shares>,
    /// Requests admitted in-process during an outage, still to be counted
    /// in the primary once it answers.
    adoptions: Arc<Adoptions>,
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
            closing: Arc::clone(&self.closing),
            degraded: Arc::clone(&self.degraded),
        }
    }
}

/// How often requests admitted in-process during an outage are offered to
/// the primary again while it is away.
const ADOPT_RETRY: Duration = Duration::from_millis(100);

/// Requests admitted in-process during an outage and still in flight,
/// which the primary has not counted yet.
#[derive(Debug, Default)]
struct Adoptions {
    pending: Mutex<Vec<Arc<Adoptee>>>,
    /// `pending.len()`, read on every acquire.
    count: AtomicUsize,
    /// Whether the task offering them to the primary runs.
    running: AtomicBool,
}

/// One request admitted in-process during an outage.
#[derive(Debug)]
struct Adoptee {
    /// The request's host (the primary picks its rule by it) ...
    host: HostKey,
    /// ... and its key, which requests of other hosts may share.
    key: HostKey,
    /// Its weight.
    weight: u32,
    sent: Instant,
    state: Mutex<Adopted>,
}

#[derive(Debug)]
enum Adopted {
    /// In flight, not counted in the primary yet.
    Pending,
    /// Being offered to the primary by one caller (the others skip it).
    Offering,
    /// Counted: the primary's permit, released with the request.
    Held {
        /// Released when dropped.
        _permit: Permit,
    },
    /// Released, or nothing to count it in.
    Done,
}

impl Adoptee {
    fn lock(&self) -> std::sync::MutexGuard<'_, Adopted> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Adoptions {
    fn add(&self, adoptee: Arc<Adoptee>) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.push(adoptee);
        self.count.store(pending.len(), Ordering::SeqCst);
    }

    /// Offers the pending requests (to `only` that key, when given) to
    /// `primary`; stops at the first that finds it unavailable.
    async fn offer<P: Limiter>(&self, primary: &P, only: Option<&HostKey>) {
        let candidates: Vec<Arc<Adoptee>> = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|a| only.is_none_or(|key| *key == a.key))
            .cloned()
            .collect();
        for adoptee in candidates {
            {
                let mut state = adoptee.lock();
                if !matches!(*state, Adopted::Pending) {
                    continue;
                }
                *state = Adopted::Offering;
            }
            // Put back to pending if this offer is dropped before it ends.
            let offering = Offering(&adoptee);
            let answer = primary
                .adopt_host(adoptee.host.clone(), adoptee.sent.elapsed(), adoptee.weight)
                .await;
            std::mem::forget(offering);
            let mut state = adoptee.lock();
            let released = matches!(*state, Adopted::Done);
            match answer {
                // Released meanwhile: the permit (if any) drops here.
                Ok(permit) if released => drop(permit),
                Ok(permit) => {
                    *state = permit.map_or(Adopted::Done, |p| Adopted::Held { _permit: p });
                }
                Err(err) if err.is_unavailable() => {
                    if !released {
                        *state = Adopted::Pending;
                    }
                    break;
                }
                Err(err) => {
                    tracing::warn!(host = %adoptee.host, error = %crate::Causes(&err), "a request admitted in-process could not be counted in the shared limiter");
                    *state = Adopted::Done;
                }
            }
        }
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.retain(|a| matches!(*a.lock(), Adopted::Pending | Adopted::Offering));
        self.count.store(pending.len(), Ordering::SeqCst);
    }
}

/// An offer in progress; dropped unfinished, it puts its request back.
struct Offering<'a>(&'a Adoptee);

impl Drop for Offering<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        if matches!(*state, Adopted::Offering) {
            *state = Adopted::Pending;
        }
    }
}

/// Offers pending requests to the primary every [`ADOPT_RETRY`] until none
/// is left.
async fn adopt_in_background<P: Limiter>(primary: Arc<P>, adoptions: Arc<Adoptions>) {
    loop {
        tokio::time::sleep(ADOPT_RETRY).await;
        adoptions.offer(&*primary, None).await;
        if adoptions.count.load(Ordering::SeqCst) == 0 {
            adoptions.running.store(false, Ordering::SeqCst);
            // One added since the last offer restarts the loop.
            if adoptions.count.load(Ordering::SeqCst) == 0
                || adoptions.running.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
    }
}

/// How this replica serves a host while the primary is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Alone, at the full in-process pacing.
    Alone,
    /// At its share of the pacing, `n` replicas dividing it; this one is
    /// the `index`th of them (which slots of the shared pace it takes).
    Share {
        /// How many replicas divide the pacing.
        n: u32,
        /// Which of them this one is, `0..n`.
        index: u32,
    },
    /// Not at all: another replica serves it until the primary is back.
    Defer,
}

/// Decides, per host, how a replica carries on while its primary is
/// unavailable (see `FallbackPolicy`).
pub(crate) trait OutagePlan: Send + Sync + fmt::Debug {
    /// The plan for `host` now.
    fn plan(&self, host: &HostKey) -> Plan;
}

/// How long until the next slot of replica `index` of `n` taking turns in
/// slots of `gap` (counted from the Unix epoch on the wall clock).
fn until_turn(gap: Duration, n: u32, index: u32) -> Duration {
    let slot = gap.as_micros();
    let period = slot.saturating_mul(u128::from(n));
    if period == 0 {
        return Duration::ZERO;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    let start = slot.saturating_mul(u128::from(index)) % period;
    let since = (now % period + period - start) % period;
    let wait = if since == 0 { 0 } else { period - since };
    Duration::from_micros(u64::try_from(wait).unwrap_or(u64::MAX))
}

/// How long after its turn begins a request taking turns may still leave
/// through the primary: a tenth of the gap, at most 10 ms. Replicas still
/// pacing in-process send at their slots' starts, so a send this late in
/// its own slot keeps the shared pace over any interval up to this. `None`
/// without a gap, when there are no slots.
fn turn_window(pacing: &Pacing) -> Option<Duration> {
    let gap = pacing.min_delay();
    (!gap.is_zero()).then(|| (gap / 10).min(Duration::from_millis(10)))
}

/// How soon a deferred acquire asks the primary again.
const DEFER_RETRY: Duration = Duration::from_secs(1);

/// The in-process limiter pacing this replica's share during an outage.
#[derive(Debug, Default)]
struct Shares {
    /// Whether `current` holds anything (read on every admission).
    active: AtomicBool,
    current: Mutex<Option<Share>>,
}

/// The share this replica paces at during (and just after) an outage.
#[derive(Debug)]
struct Share {
    /// How many replicas divide the pacing.
    n: u32,
    /// Which of them this one is.
    index: u32,
    /// When the outage was first met.
    began: Instant,
    /// The limiter applying the share.
    limiter: DomainLimiter,
    /// When the primary first answered again, if it has.
    ended: Option<Instant>,
}

/// How long after the primary answers again this replica keeps its share
/// of the pace (taking its turns) for requests the primary admits: other
/// replicas may not have noticed yet (they ask again once a second) and
/// still send at their shares; until they do, taking turns keeps the sum
/// within the shared pace.
const SHARE_GRACE: Duration = Duration::from_millis(1500);

impl Shares {
    /// The limiter for `n` shares of `policies`, and when the outage
    /// began. `outage` when the primary just failed (which starts the
    /// outage again if it had ended), not when it admitted during the grace.
    fn get(
        &self,
        n: u32,
        index: u32,
        policies: &Policies,
        outage: bool,
    ) -> (Instant, DomainLimiter) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(share) = &mut *current
            && share.n == n
        {
            share.index = index;
            if outage {
                share.ended = None;
            }
            return (share.began, share.limiter.clone());
        }
        let began = current.as_ref().map_or_else(Instant::now, |c| c.began);
        let limiter = DomainLimiter::new(policies.map(|_, pacing| pacing.shared_by(n)));
        *current = Some(Share {
            n,
            index,
            began,
            limiter: limiter.clone(),
            ended: None,
        });
        self.active.store(true, Ordering::Release);
        (began, limiter)
    }

    /// The share (`n`, `index`) a request must take its turn in before it
    /// asks the primary: while an outage lasts and within [`SHARE_GRACE`] of
    /// the primary's first answer after it (the registry read since may
    /// already differ from the one the other replicas still pace by).
    /// `None` once the grace is over, when the share is forgotten.
    fn turns(&self) -> Option<(u32, u32)> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let now = Instant::now();
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let share = current.as_mut()?;
        if share
            .ended
            .is_none_or(|ended| now < after(ended, SHARE_GRACE))
        {
            return Some((share.n, share.index));
        }
        *current = None;
        self.active.store(false, Ordering::Release);
        None
    }

    /// The primary failed again after it had answered: the outage goes
    /// on, and its grace waits for the next answer.
    fn failed(&self) {
        if self.active.load(Ordering::Acquire) {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(share) = &mut *current {
                share.ended = None;
            }
        }
    }

    /// The primary admitted a request: if an outage was under way, its
    /// grace starts now.
    fn answered(&self) {
        if self.active.load(Ordering::Acquire) {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(share) = &mut *current {
                share.ended.get_or_insert_with(Instant::now);
            }
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
            closing: Arc::default(),
            degraded: Arc::default(),
        }
    }

    /// Serves each host as `plan` says while the primary is unavailable.
    pub(crate) fn with_outage_plan(mut self, plan: Arc<dyn OutagePlan>) -> Self {
        self.outage = Some(plan);
        self
    }

    /// Admits `host` at this replica's share of the pacing, `n` replicas
    /// dividing it: no send before the outage began + `min_delay` (another
    /// replica's last admission through the primary may be that recent),
    /// nor before this replica's own last send + `n` x `min_delay`, and then
    /// `n` x `min_delay` apart, at most `quota / n` per window and
    /// `max_concurrent / n` in flight.
    ///
    /// The replicas also take turns: time is cut into `min_delay` slots
    /// (by the wall clock, which replicas share up to their clock offset)
    /// and replica `index` sends only at the start of slots `index`,
    /// `index + n`, ..., so their sends interleave instead of bunching, and
    /// any interval holds no more sends than the shared pace allows.
    async fn share(
        &self,
        (n, index): (u32, u32),
        outage: bool,
        engine: &str,
        host: &HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> Result<Permit, Error> {
        let policies = self.fallback.policies();
        let (began, limiter) = self.shares.get(n, index, policies, outage);
        let gap = policies.pacing_for(host).min_delay();
        let mut from = after(began, gap);
        if let Some(last) = self.fallback.last_sent(host) {
            from = from.max(after(last, gap.saturating_mul(n)));
        }
        let now = Instant::now();
        if from > now {
            limiter.penalize_host(host.clone(), from - now).await?;
        }
        // A request heavier than this replica's share of the cap or quota
        // takes the whole share.
        let shared = limiter.policies().pacing_for(host);
        let most = heaviest(shared.max_concurrent(), shared.quota());
        let request = request.with_weight(request.weight().min(most));
        let permit = limiter
            .acquire_with(engine, host.clone(), deadline, request)
            .await?;
        let turn = after(Instant::now(), until_turn(gap, n, index));
        if let Some(deadline) = deadline
            && turn > deadline
        {
            // Not sent: the share's admission is taken back.
            permit.abandon();
            return Err(Error::WaitBudget {
                host: host.to_string(),
                wait: turn.saturating_duration_since(Instant::now()),
                remaining: deadline.saturating_duration_since(Instant::now()),
            });
        }
        tokio::time::sleep_until(turn).await;
        Ok(permit)
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
    }
}

/// Records `local`'s request as leaving now, after waiting (at most one
/// `min_delay`) if another request of this process left too recently: an
/// admission by the primary that came back and one made in-process during
/// its absence could otherwise fall together.
async fn leave(local: &mut Permit) {
    while let Err(at) = local.try_send(Instant::now()) {
        tokio::time::sleep_until(at).await;
    }
}

/// One permit made of `parts`: releasing it releases them all, abandoning
/// it abandons them all (each as far as it can be taken back).
fn joint<const N: usize>(host: HostKey, waited: Duration, parts: [Option<Permit>; N]) -> Permit {
    let parts = Arc::new(Mutex::new(Some(parts)));
    let back = Arc::clone(&parts);
    let take = |parts: &Mutex<Option<[Option<Permit>; N]>>| {
        parts.lock().unwrap_or_else(PoisonError::into_inner).take()
    };
    Permit::new(host, waited, move || drop(take(&parts))).on_abandon(move || {
        take(&back)
            .into_iter()
            .flatten()
            .flatten()
            .for_each(Permit::abandon);
    })
}

impl<P: Limiter + 'static> FallbackLimiter<P> {
    /// The permit of a request sent in-process during an outage: counted in
    /// the primary as soon as it answers again.
    fn outage_permit(
        &self,
        host: HostKey,
        weight: u32,
        waited: Duration,
        local: Option<Permit>,
        share: Option<Permit>,
    ) -> Permit {
        let adoptee = Arc::new(Adoptee {
            key: self.fallback.policies().key(&host),
            host: host.clone(),
            weight,
            sent: Instant::now(),
            state: Mutex::new(Adopted::Pending),
        });
        self.adoptions.add(Arc::clone(&adoptee));
        if !self.adoptions.running.swap(true, Ordering::SeqCst) {
            tokio::spawn(adopt_in_background(
                Arc::clone(&self.primary),
                Arc::clone(&self.adoptions),
            ));
        }
        let parts = Arc::new(Mutex::new(Some((adoptee, share, local))));
        let back = Arc::clone(&parts);
        let take = |parts: &Mutex<Option<_>>| {
            let taken = parts.lock().unwrap_or_else(PoisonError::into_inner).take();
            taken.map(|(adoptee, share, local): (Arc<Adoptee>, _, _)| {
                // Nothing is left to count in the primary.
                drop(std::mem::replace(&mut *adoptee.lock(), Adopted::Done));
                (share, local)
            })
        };
        let key = self.fallback.policies().key(&host);
        Permit::new(key, waited, move || drop(take(&parts))).on_abandon(move || {
            if let Some((share, local)) = take(&back) {
                share.into_iter().chain(local).for_each(Permit::abandon);
            }
        })
    }
}

impl<P: Limiter + 'static> Limiter for FallbackLimiter<P> {
    fn acquire_host<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<Permit, Error>> {
        self.acquire_with(engine, host, deadline, RequestPacing::default())
    }

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
            tokio::select! {
                biased;
                acquired = self.acquire_either(engine, host, deadline, request) => acquired,
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

    fn report_hold(&self, host: &HostKey, cause: &str, hold: Duration) {
        let key = self.fallback.policies().key(host);
        self.hooks.on_hold(&key, cause, hold);
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

    /// The primary's shared gap, when it keeps one; the hold it reports is
    /// mirrored in the fallback, as a penalty is. A primary that is
    /// unavailable fails the future, and the caller keeps the gap itself.
    fn back_off_host<'a>(
        &'a self,
        host: HostKey,
        step: BackoffStep,
    ) -> Option<BoxFuture<'a, Result<Option<Duration>, Error>>> {
        let shared = self.primary.back_off_host(host.clone(), step)?;
        Some(Box::pin(async move {
            let gap = shared.await?;
            if let Some(gap) = gap {
                self.fallback.penalize_host(host, gap).await?;
            }
            Ok(gap)
        }))
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
}

impl<P: Limiter + 'static> FallbackLimiter<P> {
    /// [`Limiter::acquire_host`] through the primary, or the fallback while
    /// the primary is unavailable.
    async fn acquire_either(
        &self,
        engine: &str,
        host: HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> Result<Permit, Error> {
        // Hooks name the key, as the limiters below do.
        let key = self.fallback.policies().key(&host);
        let mut report = WaitReport::new(&*self.hooks, engine, &key, Instant::now());
        loop {
            // Requests this process sent during an outage count in the
            // primary before it admits anything else for their host.
            if self.adoptions.count.load(Ordering::SeqCst) > 0 {
                let offer = self.adoptions.offer(&*self.primary, Some(&key));
                match deadline {
                    // What is left is the background task's to finish.
                    Some(deadline) => drop(tokio::time::timeout_at(deadline, offer).await),
                    None => offer.await,
                }
            }
            // Until the primary has decided, this admission is
            // provisional: a refusal or a dropped future takes it back. It
            // is made at weight 1, so that a heavy request the primary
            // refuses for want of room does not hold back lighter ones
            // here (the primary alone knows the shared room); its whole
            // weight is recorded once the primary admits it. A weight the
            // fallback could never admit is refused here all the same.
            let limits = self.fallback.policies().pacing_for(&host);
            request
                .check_weight(&key, limits.max_concurrent(), limits.quota())
                .map_err(|e| report.fail(e))?;
            let local = Unsent::new(
                self.fallback
                    .acquire_with(engine, host.clone(), deadline, request.with_weight(1))
                    .await
                    .map_err(|e| report.fail(e))?,
            );
            // During an outage and just after it, take this replica's
            // turn (as the replicas still pacing in-process do) before
            // the primary is asked, so that an admission by the primary
            // is the send it records, and one by the fallback keeps the
            // turns too.
            let turn = match self.shares.turns() {
                Some(turns) => Some((
                    turns,
                    Unsent::new(
                        self.share(turns, false, engine, &host, deadline, request)
                            .await
                            .map_err(|e| report.fail(e))?,
                    ),
                )),
                None => None,
            };
            // A turn is a slot's start: the primary must admit within a
            // moment of it, or the send would leave in the next
            // replica's slot (which may still be pacing in-process).
            let turn_ends = turn
                .as_ref()
                .and_then(|_| turn_window(self.fallback.policies().pacing_for(&host)))
                .map(|window| after(Instant::now(), window));
            let ask_until = match (deadline, turn_ends) {
                (Some(d), Some(t)) => Some(d.min(t)),
                (d, t) => d.or(t),
            };
            let err = match self
                .primary
                .acquire_with(engine, host.clone(), ask_until, request)
                .await
            {
                Ok(shared) => {
                    self.shares.answered();
                    if self.degraded.swap(false, Ordering::Relaxed) {
                        tracing::info!("the shared limiter answers again: pacing is shared");
                        self.hooks.on_fallback(false);
                    }
                    if turn_ends.is_some_and(|ends| Instant::now() > ends) {
                        // Admitted too late for this turn: not sent,
                        // taken back; the next turn asks again.
                        shared.abandon();
                        continue;
                    }
                    let share = turn.and_then(|(_, turn)| turn.take());
                    // The request leaves now, perhaps long after the
                    // local admission (the primary may have made it
                    // wait): the local gap and quota count from now, so
                    // the next send keeps this process's own spacing
                    // whoever admits it.
                    let mut local = local.take();
                    if let Some(local) = &mut local {
                        leave(local).await;
                        local.reweigh(request.weight());
                    }
                    let waited = report.finish(WaitOutcome::Acquired);
                    return Ok(joint(key, waited, [share, Some(shared), local]));
                }
                Err(err) if err.is_unavailable() => err,
                Err(Error::WaitBudget { wait, .. })
                    if turn_ends.is_some_and(|ends| {
                        deadline.is_none_or(|d| ends < d && after(Instant::now(), wait) <= d)
                    }) =>
                {
                    // Not admitted within this turn, and the caller's
                    // budget allows the wait: the next turn. (The call may
                    // have been cut short without an answer: this says
                    // nothing about whether the outage is over.)
                    continue;
                }
                Err(err) => return Err(report.fail(err)),
            };
            // The primary may have taken the budget to fail.
            let now = Instant::now();
            if let Some(deadline) = deadline
                && now >= deadline
            {
                return Err(report.over_budget(now, deadline, now));
            }
            let plan = self.outage.as_ref().map_or(Plan::Alone, |o| o.plan(&host));
            if let Some(((n, index), turn)) = turn
                && plan == (Plan::Share { n, index })
            {
                // The outage goes on (its grace starts again when the
                // primary next answers) and the turn is taken: the send
                // keeps this process's own gap as it leaves.
                self.shares.failed();
                let mut local = local.take();
                if let Some(local) = &mut local {
                    leave(local).await;
                    local.reweigh(request.weight());
                }
                let share = turn.take();
                let waited = report.finish(WaitOutcome::Acquired);
                return Ok(self.outage_permit(host, request.weight(), waited, local, share));
            }
            // The provisional admission was made before the wait on the
            // primary; sending on it now could follow this process's
            // last send too closely, and waiters that fail over
            // together would all go at once. Give it back and queue
            // again for a real admission, which waits for the gap from
            // the latest send this process made. A turn taken for the
            // primary is given back too: the outage takes its own.
            drop(local);
            if plan == Plan::Defer {
                // Another replica serves this host during the outage.
                let retry = after(now, DEFER_RETRY);
                match deadline {
                    Some(deadline) if retry >= deadline => {
                        tokio::time::sleep_until(deadline).await;
                        let now = Instant::now();
                        return Err(report.over_budget(retry, deadline, now));
                    }
                    _ => tokio::time::sleep_until(retry).await,
                }
                continue;
            }
            if self.degraded.swap(true, Ordering::Relaxed) {
                tracing::debug!(host = %host, error = %crate::Causes(&err), ?plan, "pacing in-process");
            } else {
                tracing::warn!(host = %host, error = %crate::Causes(&err), ?plan, "the shared limiter is unavailable: pacing in-process");
                self.hooks.on_fallback(true);
            }
            // Taken back unless sent (a blown budget, a dropped future).
            let local = Unsent::new(
                self.fallback
                    .acquire_with(engine, host.clone(), deadline, request)
                    .await
                    .map_err(|e| report.fail(e))?,
            );
            let share = match plan {
                Plan::Share { n, index } => Some(
                    self.share((n, index), true, engine, &host, deadline, request)
                        .await
                        .map_err(|e| report.fail(e))?,
                ),
                _ => None,
            };
            let mut local = local.take();
            if let Some(local) = &mut local {
                leave(local).await;
            }
            let waited = report.finish(WaitOutcome::Acquired);
            return Ok(self.outage_permit(host, request.weight(), waited, local, share));
        }
    }
}

//! `DomainLimiter`: first come, first served (by priority), event-driven
//! per-host pacing in one process.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;

/// The host maps' hasher: foldhash, randomly seeded per map (as hashbrown's
/// default), at a fraction of SipHash's cost on short keys; a profile of an
/// acquire and release had SipHash at a fifth of the time.
type RandomState = foldhash::fast::RandomState;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use url::Url;

use super::host::{Admission, Decision, HostState};
use super::sweep::{Sweep, SweepSignal};
use crate::hooks::WaitReport;
use crate::pacing::after;
use crate::snapshot::{HostSnapshot, PacedBy, Snapshot, TopHosts};
use crate::{
    BoxFuture, Error, Hooks, HostKey, Limiter, NoHooks, Pacing, Permit, Policies, RequestPacing,
    WaitOutcome,
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

struct Inner {
    policies: Policies,
    hooks: Arc<dyn Hooks>,
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    next_id: AtomicU64,
    sweep: Arc<SweepSignal>,
    /// Set by [`Limiter::close`]: nothing is admitted any more.
    closed: AtomicBool,
    /// Whether hosts with requests in flight (and none waiting) are kept in
    /// each shard's `busy` set too: for the Redis limiter's queue of
    /// callers asking Redis, whose "in flight" are waiting.
    track_in_flight: bool,
}

/// One slice of the host map. A `std::sync::Mutex`, not Tokio's: every
/// critical section is a few map operations and never awaits.
#[derive(Default)]
struct Shard {
    /// hashbrown's map, for `entry_ref`: one lookup of a host, known or
    /// new, without cloning its key unless it is inserted.
    hosts: hashbrown::HashMap<HostKey, Entry, RandomState>,
    /// The most hosts held since the last sweep: a map that was this full
    /// moments ago keeps its room, rather than shrink and grow back each
    /// sweep through a crawl of many hosts.
    high_water: usize,
    /// The idle hosts each sweep may forget, by the sweep (its time in
    /// [`SweepSignal::micros`]); at most one item per host.
    expiries: Expiries,
    /// Acquires waiting, and requests in flight, over the shard's hosts.
    queued: usize,
    in_flight: usize,
    /// The hosts with acquires waiting (and, when tracked, in flight):
    /// what a snapshot lists, without a pass over every host.
    busy: HashSet<HostKey, RandomState>,
}

/// Idle hosts by the sweep that may forget them: one bucket per sweep
/// instant (on the sweeper's grain), cheaper to fill and empty than a heap
/// of single instants.
type Expiries = BTreeMap<u64, Vec<HostKey>>;

struct Entry {
    state: HostState,
    /// Of the policies of the requests admitted (see [`Policies::index`];
    /// hosts sharing a key may have different rules), the one whose window
    /// and delays last longest: it decides when the entry is idle.
    policy: usize,
    /// Waiters by priority, in arrival order among equals; only the head
    /// ever decides.
    queue: Line,
    /// Whether an expiry is queued for this host.
    sweep_queued: bool,
}

/// A host's waiters, out of line, allocated when the first one joins:
/// most hosts of a crawl never have one, and their entries stay small.
/// (The box is the point: an empty `VecDeque` is 32 bytes in every entry,
/// a `None` 8.)
#[derive(Default)]
#[allow(clippy::box_collection)]
struct Line(Option<Box<VecDeque<Waiter>>>);

/// The waiters of a host that never had one.
static NO_WAITERS: VecDeque<Waiter> = VecDeque::new();

impl std::ops::Deref for Line {
    type Target = VecDeque<Waiter>;

    fn deref(&self) -> &VecDeque<Waiter> {
        self.0.as_deref().unwrap_or(&NO_WAITERS)
    }
}

/// Allocates the line: only for changing it (a waiter joins or leaves).
impl std::ops::DerefMut for Line {
    fn deref_mut(&mut self) -> &mut VecDeque<Waiter> {
        self.0.get_or_insert_with(Box::default)
    }
}

struct Waiter {
    id: u64,
    /// Higher goes first; equal ones in arrival order.
    priority: u8,
    /// Its weight, and the in-flight cap of its rule.
    weight: u32,
    cap: u32,
    wake: Arc<Notify>,
}

impl Waiter {
    /// Whether it fits beside `in_flight` (by weight).
    fn fits(&self, in_flight: u32) -> bool {
        self.cap.saturating_sub(in_flight) >= self.weight
    }
}

/// Where a waiter of `priority` joins `queue`: behind every waiter of its
/// priority or higher.
fn place_for(queue: &VecDeque<Waiter>, priority: u8) -> usize {
    queue
        .iter()
        .position(|w| w.priority < priority)
        .unwrap_or(queue.len())
}

/// How many of the first `place` waiters of `queue` a waiter of `weight`
/// cannot overtake (see [`Entry::may_decide`]): those no heavier.
fn ahead_of(queue: &VecDeque<Waiter>, place: usize, weight: u32) -> usize {
    queue
        .iter()
        .take(place)
        .filter(|w| w.weight <= weight)
        .count()
}

/// Queues `waiter` behind every waiter of its priority or higher.
fn enqueue(queue: &mut VecDeque<Waiter>, waiter: Waiter) {
    let at = place_for(queue, waiter.priority);
    queue.insert(at, waiter);
}

impl Entry {
    /// Whether the waiter at `place` decides now: the head always; one
    /// behind it (best fit) when every waiter ahead is heavier and does
    /// not fit beside the requests in flight. They keep their places, and
    /// the first of them to fit goes next.
    fn may_decide(&self, place: usize) -> bool {
        let Some(waiter) = self.queue.get(place) else {
            return false;
        };
        let in_flight = self.state.in_flight();
        self.queue
            .iter()
            .take(place)
            .all(|ahead| ahead.weight > waiter.weight && !ahead.fits(in_flight))
    }

    /// Wakes the waiters that may decide after a change: the head and,
    /// while each fits no more, the next one lighter than all before it.
    fn wake_turns(&self) {
        let in_flight = self.state.in_flight();
        let mut lightest = u32::MAX;
        for waiter in self.queue.iter() {
            if waiter.weight >= lightest {
                continue;
            }
            waiter.wake.notify_one();
            lightest = waiter.weight;
            if lightest <= 1 || waiter.fits(in_flight) {
                return;
            }
        }
    }
}

/// Hosts one sweep pass removes under one lock before letting others in.
const SWEEP_BATCH: usize = 4096;

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic cannot leave a shard half-updated in a way later calls trip
    // over (every update is a few assignments), so poisoning is ignored.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
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
    fn acquire_host<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<Permit, Error>> {
        Box::pin(acquire(
            &self.inner,
            engine,
            host,
            deadline,
            RequestPacing::default(),
        ))
    }

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
        self.inner.penalize(host, hold);
        Box::pin(std::future::ready(Ok(())))
    }

    fn report_hold(&self, host: &HostKey, cause: &str, hold: Duration) {
        let key = self.inner.policies.key(host);
        self.inner.hooks.on_hold(&key, cause, hold);
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

/// What the loop in [`acquire`] does next.
enum Step {
    Admitted(Admission),
    /// Head of the line, host not ready before this instant.
    Sleep(Instant),
    /// Behind others, or the host is full: wait for a wake-up. Carries the
    /// earliest instant a send could happen, for the deadline check.
    Park(Instant),
}

async fn acquire(
    inner: &Arc<Inner>,
    engine: &str,
    host: HostKey,
    deadline: Option<Instant>,
    request: RequestPacing,
) -> Result<Permit, Error> {
    let policy = inner.policies.index(&host);
    let pacing = inner.policies.at(policy);
    // From here on the state's key (the host itself unless keyed otherwise).
    let host = inner.policies.key_of(host);
    let weight = request.check_weight(&host, pacing.max_concurrent(), pacing.quota())?;
    let priority = request.priority();
    inner.sweep.ensure_running(inner);
    let start = Instant::now();
    let report = WaitReport::new(&*inner.hooks, engine, &host, start);
    let shard = inner.shard(&host);

    // Fast path: nobody waiting and the host ready. Otherwise join the line.
    let (id, wake) = {
        let mut guard = lock(shard);
        // Under the shard's lock, which `close` takes after setting the
        // flag: a waiter queued here is either refused or woken by it.
        if inner.closed.load(Ordering::SeqCst) {
            drop(guard);
            report.abandon();
            return Err(Error::Closed);
        }
        let entry = guard.entry(&host, start, policy);
        if entry.queue.is_empty() && entry.state.decide(start, pacing, weight) == Decision::Admit {
            let admission = entry.state.admit(start, pacing, weight);
            entry.policy = inner.policies.longer_lived(entry.policy, policy);
            guard.in_flight += weight as usize;
            if inner.track_in_flight {
                guard.mark(&host, true);
            }
            drop(guard);
            report.finish_waited(WaitOutcome::Acquired, Duration::ZERO);
            return Ok(inner.permit(host, Duration::ZERO, admission, policy));
        }
        if let Some(max) = pacing.max_queued()
            && entry.queue.len() >= max as usize
        {
            let queued = entry.queue.len();
            guard.settle(&host, &inner.policies, &inner.sweep);
            drop(guard);
            return Err(report.queue_full(queued, max));
        }
        if let Some(deadline) = deadline {
            // Only those it would queue behind, and cannot overtake, are
            // ahead of it.
            let place = place_for(&entry.queue, priority);
            let ahead = ahead_of(&entry.queue, place, weight);
            let earliest = entry.state.earliest_for(start, ahead, pacing);
            if earliest > deadline {
                drop(guard);
                return Err(report.over_budget(earliest, deadline, start));
            }
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let cap = pacing.max_concurrent();
        let waiter = Waiter {
            id,
            priority,
            weight,
            cap,
            wake: Arc::clone(&wake),
        };
        enqueue(&mut entry.queue, waiter);
        guard.queued += 1;
        guard.mark(&host, inner.track_in_flight);
        (id, wake)
    };
    let place = Place {
        inner,
        host: &host,
        id,
        queued: true,
    };
    // The wait, in a future of its own: an admission on the fast path
    // never carries (or moves) the waiting loop's state.
    let queued = Queued {
        policy,
        weight,
        priority,
        wake,
    };
    Box::pin(wait_in_line(inner, place, deadline, report, queued)).await
}

/// An acquire that joined its host's line, as [`wait_in_line`] takes it.
struct Queued {
    policy: usize,
    weight: u32,
    priority: u8,
    wake: Arc<Notify>,
}

/// Waits at `place` in its host's line until admitted, or until it gives
/// up or is dropped (leaving the line).
async fn wait_in_line(
    inner: &Arc<Inner>,
    place: Place<'_>,
    deadline: Option<Instant>,
    report: WaitReport<'_>,
    queued: Queued,
) -> Result<Permit, Error> {
    // Bound in this order, so that a cancelled acquire leaves the line
    // (`place` drops) before its hooks hear of it (`report` drops).
    let report = report;
    let mut place = place;
    let Queued {
        policy,
        weight,
        priority,
        wake,
    } = queued;
    let (host, id) = (place.host, place.id);
    let pacing = inner.policies.at(policy);
    let shard = inner.shard(host);

    loop {
        let now = Instant::now();
        if inner.closed.load(Ordering::SeqCst) {
            // `place` leaves the line as it drops.
            return Err(Error::Closed);
        }
        let step = {
            let mut guard = lock(shard);
            let entry = guard.entry(host, now, policy);
            let step = match entry.queue.iter().position(|w| w.id == id) {
                Some(at) if entry.may_decide(at) => match entry.state.decide(now, pacing, weight) {
                    Decision::Admit => {
                        entry.queue.remove(at);
                        let admission = entry.state.admit(now, pacing, weight);
                        entry.policy = inner.policies.longer_lived(entry.policy, policy);
                        entry.wake_turns();
                        Step::Admitted(admission)
                    }
                    Decision::WaitUntil(at) => Step::Sleep(at),
                    Decision::Full => Step::Park(entry.state.earliest_for(now, 0, pacing)),
                },
                Some(at) => {
                    let ahead = ahead_of(&entry.queue, at, weight);
                    Step::Park(entry.state.earliest_for(now, ahead, pacing))
                }
                // Unreachable while `place` is queued (a host with waiters
                // is never evicted); rejoining keeps the waiter correct.
                None => {
                    let waiter = Waiter {
                        id,
                        priority,
                        weight,
                        cap: pacing.max_concurrent(),
                        wake: Arc::clone(&wake),
                    };
                    enqueue(&mut entry.queue, waiter);
                    guard.queued += 1;
                    guard.mark(host, inner.track_in_flight);
                    Step::Park(now)
                }
            };
            if matches!(step, Step::Admitted(_)) {
                guard.queued -= 1;
                guard.in_flight += weight as usize;
                guard.mark(host, inner.track_in_flight);
            }
            step
        };
        match step {
            Step::Admitted(admission) => {
                place.queued = false;
                let waited = report.finish(WaitOutcome::Acquired);
                return Ok(inner.permit(host.clone(), waited, admission, policy));
            }
            Step::Sleep(at) => {
                let wake_at = match deadline {
                    Some(deadline) if at > deadline => {
                        return Err(report.over_budget(at, deadline, now));
                    }
                    // Jitter spreads replicas out but never costs the budget.
                    Some(deadline) => after(now, pacing.jittered(at - now)).min(deadline),
                    None => after(now, pacing.jittered(at - now)),
                };
                tokio::select! {
                    () = tokio::time::sleep_until(wake_at) => {}
                    () = wake.notified() => {}
                }
            }
            Step::Park(earliest) => match deadline {
                Some(deadline) if earliest > deadline || now >= deadline => {
                    return Err(report.over_budget(earliest, deadline, now));
                }
                Some(deadline) => tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = wake.notified() => {}
                },
                None => wake.notified().await,
            },
        }
    }
}

impl Inner {
    fn permit(
        self: &Arc<Self>,
        host: HostKey,
        waited: Duration,
        admission: Admission,
        policy: usize,
    ) -> Permit {
        let admitted = LocalAdmission {
            inner: Arc::clone(self),
            admission,
            policy,
        };
        Permit::admitted(host, waited, admitted)
    }

    /// Records that an admission's request leaves at `at`, unless another
    /// one left too recently; see [`HostState::try_send`].
    fn try_send(
        &self,
        host: &HostKey,
        admission: &mut Admission,
        at: Instant,
        policy: usize,
    ) -> Result<(), Instant> {
        let mut guard = lock(self.shard(host));
        match guard.hosts.get_mut(host) {
            Some(entry) => entry
                .state
                .try_send(admission, at, self.policies.at(policy)),
            None => Ok(()),
        }
    }

    /// Counts an admission as weighing `weight`; see [`HostState::reweigh`].
    fn reweigh(&self, host: &HostKey, admission: &mut Admission, weight: u32, policy: usize) {
        let mut guard = lock(self.shard(host));
        if let Some(entry) = guard.hosts.get_mut(host) {
            let before = entry.state.in_flight();
            entry
                .state
                .reweigh(admission, weight, self.policies.at(policy));
            let added = entry.state.in_flight() - before;
            guard.in_flight += added as usize;
        }
    }

    /// Takes back an admission whose request was never sent.
    fn undo(&self, host: &HostKey, admission: &Admission) {
        let mut guard = lock(self.shard(host));
        if let Some(entry) = guard.hosts.get_mut(host) {
            let before = entry.state.in_flight();
            entry.state.undo(admission);
            entry.wake_turns();
            let ended = (before - entry.state.in_flight()) as usize;
            guard.ended(host, ended, self.track_in_flight);
        }
        guard.settle(host, &self.policies, &self.sweep);
    }

    fn shard(&self, host: &HostKey) -> &Mutex<Shard> {
        let hash = self.hasher.hash_one(host) as usize;
        &self.shards[hash & (self.shards.len() - 1)]
    }

    fn release(&self, host: &HostKey, policy: usize, weight: u32) {
        let pacing = self.policies.at(policy);
        // The clock is read only when the completion's instant matters.
        let now = HostState::completion_matters(pacing).then(Instant::now);
        let mut guard = lock(self.shard(host));
        let shard = &mut *guard;
        let Some(entry) = shard.hosts.get_mut(host) else {
            return;
        };
        let before = entry.state.in_flight();
        match now {
            Some(now) => entry.state.complete(now, pacing, weight),
            None => entry.state.end(weight),
        }
        entry.wake_turns();
        shard.in_flight -= (before - entry.state.in_flight()) as usize;
        let track = self.track_in_flight && entry.queue.is_empty() && entry.state.in_flight() == 0;
        // Settled on the entry at hand: one lookup of the host.
        settle_entry(
            entry,
            &mut shard.expiries,
            host,
            &self.policies,
            &self.sweep,
            now,
        );
        if track {
            shard.mark(host, true);
        }
    }

    fn penalize(self: &Arc<Self>, host: HostKey, hold: Duration) {
        let policy = self.policies.index(&host);
        let hold = hold.min(self.policies.at(policy).max_penalty());
        if hold.is_zero() {
            return;
        }
        let host = self.policies.key(&host);
        self.sweep.ensure_running(self);
        let now = Instant::now();
        let mut guard = lock(self.shard(&host));
        let entry = guard.entry(&host, now, policy);
        entry.state.penalize(now, hold);
        entry.wake_turns();
        guard.settle(&host, &self.policies, &self.sweep);
        tracing::debug!(host = %host, hold_ms = hold.as_millis() as u64, "host penalized");
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.sweep.stop();
    }
}

impl Sweep for Inner {
    fn sweep(&self, now: Instant) -> Option<Instant> {
        let due = self.sweep.micros_at(now);
        let mut earliest: Option<Instant> = None;
        let mut sooner = |at: Instant| earliest = Some(earliest.map_or(at, |e| e.min(at)));
        for shard in &self.shards {
            loop {
                let mut guard = lock(shard);
                let Shard {
                    hosts,
                    expiries,
                    high_water,
                    ..
                } = &mut *guard;
                let mut budget = SWEEP_BATCH;
                while budget > 0
                    && let Some(mut bucket) = expiries.first_entry()
                    && *bucket.key() <= due
                {
                    let Some(host) = bucket.get_mut().pop() else {
                        bucket.remove();
                        continue;
                    };
                    budget -= 1;
                    let Some(entry) = hosts.get_mut(&host) else {
                        continue;
                    };
                    entry.sweep_queued = false;
                    if !entry.queue.is_empty() {
                        continue; // rescheduled when its line empties
                    }
                    match entry.state.idle_at(self.policies.at(entry.policy)) {
                        Some(at) if at <= now => {
                            hosts.remove(&host);
                        }
                        Some(at) => {
                            entry.sweep_queued = true;
                            // Later than this sweep, even within its
                            // microsecond: never swept twice in one pass.
                            let tick = self.sweep.micros(at).max(due + 1);
                            expiries.entry(tick).or_default().push(host);
                        }
                        None => {} // rescheduled on its last release
                    }
                }
                if budget == 0 {
                    continue; // let acquires on this shard in, then go on
                }
                if expiries.is_empty() {
                    // An emptied B-tree keeps its root node; this does not.
                    *expiries = Expiries::new();
                }
                // A shard that emptied gives its memory back whatever its
                // size; a large one that shrank, most of it, once it has
                // not been that full for a whole sweep (so it looks again
                // then).
                let peak = std::mem::replace(high_water, hosts.len());
                if (hosts.capacity() > 64 || hosts.is_empty()) && hosts.len() * 4 < hosts.capacity()
                {
                    if hosts.is_empty() || peak * 4 < hosts.capacity() {
                        hosts.shrink_to(hosts.len() * 2);
                    } else {
                        sooner(now + super::sweep::GRAIN);
                    }
                }
                if let Some((&tick, _)) = expiries.first_key_value() {
                    sooner(self.sweep.instant(tick));
                }
                break;
            }
        }
        earliest
    }
}

impl Shard {
    /// Keeps `host` in the busy set exactly while it has acquires waiting
    /// (or, when `track`ed, requests in flight).
    fn mark(&mut self, host: &HostKey, track: bool) {
        let busy = self
            .hosts
            .get(host)
            .is_some_and(|e| !e.queue.is_empty() || (track && e.state.in_flight() > 0));
        if busy {
            if !self.busy.contains(host) {
                self.busy.insert(host.clone());
            }
        } else if !self.busy.is_empty() {
            self.busy.remove(host);
        }
    }

    /// `ended` of `host`'s requests in flight ended.
    fn ended(&mut self, host: &HostKey, ended: usize, track: bool) {
        self.in_flight -= ended;
        if track {
            self.mark(host, true);
        }
    }

    fn entry(&mut self, host: &HostKey, now: Instant, policy: usize) -> &mut Entry {
        let held = self.hosts.len() + 1;
        match self.hosts.entry_ref(host) {
            hashbrown::hash_map::EntryRef::Occupied(entry) => entry.into_mut(),
            hashbrown::hash_map::EntryRef::Vacant(vacant) => {
                self.high_water = self.high_water.max(held);
                vacant.insert(Entry {
                    state: HostState::new(now),
                    policy,
                    queue: Line::default(),
                    sweep_queued: false,
                })
            }
        }
    }

    /// After a change to `host`: if nothing is in flight or waiting any
    /// more, make sure the sweeper will look at it when it becomes idle.
    fn settle(&mut self, host: &HostKey, policies: &Policies, sweep: &SweepSignal) {
        let Shard {
            hosts, expiries, ..
        } = self;
        if let Some(entry) = hosts.get_mut(host) {
            settle_entry(entry, expiries, host, policies, sweep, None);
        }
    }
}

/// [`Shard::settle`] on `host`'s `entry`, at `now` when the caller read
/// the clock. An idle instant already past is scheduled as now: the
/// sweeper, which looks on a grain, is then not woken early for it.
fn settle_entry(
    entry: &mut Entry,
    expiries: &mut Expiries,
    host: &HostKey,
    policies: &Policies,
    sweep: &SweepSignal,
    now: Option<Instant>,
) {
    if !entry.queue.is_empty() || entry.sweep_queued {
        return;
    }
    if let Some(at) = entry.state.idle_at(policies.at(entry.policy)) {
        let at = at.max(now.unwrap_or_else(Instant::now));
        entry.sweep_queued = true;
        expiries
            .entry(sweep.micros(at))
            .or_default()
            .push(host.clone());
        sweep.schedule(at);
    }
}

/// One admission of a [`DomainLimiter`], as its permit holds it (the
/// permit keeps the host's key).
pub(crate) struct LocalAdmission {
    inner: Arc<Inner>,
    admission: Admission,
    policy: usize,
}

/// What the permit does with its admission. Each method is given the
/// permit's host (the key the admission was made under), so that the
/// admission need not keep a copy.
impl LocalAdmission {
    /// The request is complete.
    pub(crate) fn release(self, host: &HostKey) {
        self.inner
            .release(host, self.policy, self.admission.weight());
    }

    /// The request was never sent: take the admission back.
    pub(crate) fn abandon(self, host: &HostKey) {
        self.inner.undo(host, &self.admission);
    }

    /// The request leaves at `at`; see [`Permit::try_send`].
    pub(crate) fn try_send(&mut self, host: &HostKey, at: Instant) -> Result<(), Instant> {
        self.inner
            .try_send(host, &mut self.admission, at, self.policy)
    }

    /// The request weighs `weight`; see [`Permit::reweigh`].
    pub(crate) fn reweigh(&mut self, host: &HostKey, weight: u32) {
        self.inner
            .reweigh(host, &mut self.admission, weight, self.policy);
    }
}

/// A waiter's place in its host's line; leaving it (by drop, when the
/// acquire is cancelled or gives up) hands the turn to the next in line.
struct Place<'a> {
    inner: &'a Inner,
    host: &'a HostKey,
    id: u64,
    queued: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if !self.queued {
            return;
        }
        let mut guard = lock(self.inner.shard(self.host));
        if let Some(entry) = guard.hosts.get_mut(self.host)
            && let Some(pos) = entry.queue.iter().position(|w| w.id == self.id)
        {
            entry.queue.remove(pos);
            // Those behind it may decide now: the next head, or one behind
            // that it kept from overtaking those ahead.
            entry.wake_turns();
            guard.queued -= 1;
            guard.mark(self.host, self.inner.track_in_flight);
        }
        guard.settle(self.host, &self.inner.policies, &self.inner.sweep);
    }
}

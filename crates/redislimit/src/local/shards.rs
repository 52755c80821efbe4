//! The in-process limiter's state: per-host entries in sharded maps, each
//! host's line of waiters, what a release or an abandon does to them, and
//! the sweep that forgets idle hosts.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::host::{Admission, HostState};
use super::sweep::{Sweep, SweepSignal};
use crate::{Hooks, HostKey, Policies};

/// The host maps' hasher: foldhash, randomly seeded per map (as hashbrown's
/// default), at a fraction of SipHash's cost on short keys; a profile of an
/// acquire and release had SipHash at a fifth of the time.
pub(super) type RandomState = foldhash::fast::RandomState;

pub(super) struct Inner {
    pub(super) policies: Policies,
    pub(super) hooks: Arc<dyn Hooks>,
    pub(super) shards: Box<[Mutex<Shard>]>,
    pub(super) hasher: RandomState,
    pub(super) next_id: AtomicU64,
    pub(super) sweep: Arc<SweepSignal>,
    /// Set by [`Limiter::close`](crate::Limiter::close): nothing is
    /// admitted any more.
    pub(super) closed: AtomicBool,
    /// Whether hosts with requests in flight (and none waiting) are kept in
    /// each shard's `busy` set too: for the Redis limiter's queue of
    /// callers asking Redis, whose "in flight" are waiting.
    pub(super) track_in_flight: bool,
}

/// One slice of the host map. A `std::sync::Mutex`, not Tokio's: every
/// critical section is a few map operations and never awaits.
#[derive(Default)]
pub(super) struct Shard {
    /// hashbrown's map, for `entry_ref`: one lookup of a host, known or
    /// new, without cloning its key unless it is inserted.
    pub(super) hosts: hashbrown::HashMap<HostKey, Entry, RandomState>,
    /// The most hosts held since the last sweep: a map that was this full
    /// moments ago keeps its room, rather than shrink and grow back each
    /// sweep through a crawl of many hosts.
    pub(super) high_water: usize,
    /// The idle hosts each sweep may forget, by the sweep (its time in
    /// [`SweepSignal::micros`]); at most one item per host.
    pub(super) expiries: Expiries,
    /// Acquires waiting, and requests in flight, over the shard's hosts.
    pub(super) queued: usize,
    pub(super) in_flight: usize,
    /// The hosts with acquires waiting (and, when tracked, in flight):
    /// what a snapshot lists, without a pass over every host.
    pub(super) busy: HashSet<HostKey, RandomState>,
}

/// Idle hosts by the sweep that may forget them: one bucket per sweep
/// instant (on the sweeper's grain), cheaper to fill and empty than a heap
/// of single instants.
pub(super) type Expiries = BTreeMap<u64, Vec<HostKey>>;

pub(super) struct Entry {
    pub(super) state: HostState,
    /// Of the policies of the requests admitted (see [`Policies::index`];
    /// hosts sharing a key may have different rules), the one whose window
    /// and delays last longest: it decides when the entry is idle.
    pub(super) policy: usize,
    /// Waiters by priority, in arrival order among equals; only the head
    /// ever decides.
    pub(super) queue: Line,
    /// Whether an expiry is queued for this host.
    pub(super) sweep_queued: bool,
}

/// A host's waiters, out of line, allocated when the first one joins:
/// most hosts of a crawl never have one, and their entries stay small.
/// (The box is the point: an empty `VecDeque` is 32 bytes in every entry,
/// a `None` 8.)
#[derive(Default)]
#[allow(clippy::box_collection)]
pub(super) struct Line(Option<Box<VecDeque<Waiter>>>);

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

pub(super) struct Waiter {
    pub(super) id: u64,
    /// Higher goes first; equal ones in arrival order.
    pub(super) priority: u8,
    /// Its weight, and the in-flight cap of its rule.
    pub(super) weight: u32,
    pub(super) cap: u32,
    pub(super) wake: Arc<Notify>,
}

impl Waiter {
    /// Whether it fits beside `in_flight` (by weight).
    fn fits(&self, in_flight: u32) -> bool {
        self.cap.saturating_sub(in_flight) >= self.weight
    }
}

/// Where a waiter of `priority` joins `queue`: behind every waiter of its
/// priority or higher.
pub(super) fn place_for(queue: &VecDeque<Waiter>, priority: u8) -> usize {
    queue
        .iter()
        .position(|w| w.priority < priority)
        .unwrap_or(queue.len())
}

/// How many of the first `place` waiters of `queue` a waiter of `weight`
/// cannot overtake (see [`Entry::may_decide`]): those no heavier.
pub(super) fn ahead_of(queue: &VecDeque<Waiter>, place: usize, weight: u32) -> usize {
    queue
        .iter()
        .take(place)
        .filter(|w| w.weight <= weight)
        .count()
}

/// Queues `waiter` behind every waiter of its priority or higher.
pub(super) fn enqueue(queue: &mut VecDeque<Waiter>, waiter: Waiter) {
    let at = place_for(queue, waiter.priority);
    queue.insert(at, waiter);
}

impl Entry {
    /// Whether the waiter at `place` decides now: the head always; one
    /// behind it (best fit) when every waiter ahead is heavier and does
    /// not fit beside the requests in flight. They keep their places, and
    /// the first of them to fit goes next.
    pub(super) fn may_decide(&self, place: usize) -> bool {
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
    pub(super) fn wake_turns(&self) {
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

pub(super) fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic cannot leave a shard half-updated in a way later calls trip
    // over (every update is a few assignments), so poisoning is ignored.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
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

    pub(super) fn shard(&self, host: &HostKey) -> &Mutex<Shard> {
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

    pub(super) fn penalize(self: &Arc<Self>, host: HostKey, hold: Duration) {
        let policy = self.policies.index(&host);
        let hold = hold.min(self.policies.at(policy).max_penalty());
        if hold.is_zero() {
            return;
        }
        let host = self.policies.key(&host);
        self.update(&host, policy, |state, now| state.penalize(now, hold));
        tracing::debug!(host = %host, hold_ms = hold.as_millis() as u64, "host penalized");
    }
}

impl Inner {
    /// Applies `change` to the state of `host` (a key) under `policy`,
    /// now; then wakes its waiters to look again.
    fn update<R>(
        self: &Arc<Self>,
        host: &HostKey,
        policy: usize,
        change: impl FnOnce(&mut HostState, Instant) -> R,
    ) -> R {
        self.sweep.ensure_running(self);
        let now = Instant::now();
        let mut guard = lock(self.shard(host));
        let entry = guard.entry(host, now, policy);
        let changed = change(&mut entry.state, now);
        entry.wake_turns();
        guard.settle(host, &self.policies, &self.sweep);
        changed
    }

    /// Caps `host`'s requests in flight at `cap` for `window`, as it
    /// stated (see [`HostState::state_cap`]).
    pub(super) fn state_cap(self: &Arc<Self>, host: HostKey, cap: u32, window: Duration) {
        let policy = self.policies.index(&host);
        let host = self.policies.key(&host);
        self.update(&host, policy, |state, now| {
            state.state_cap(now, cap, window)
        });
        tracing::debug!(host = %host, cap, window_s = window.as_secs(), "host stated a cap on requests in flight");
    }

    /// Charges `bytes` of a response from `host` against its
    /// `max_bytes_per_sec` (see [`HostState::charge`]); nothing when the
    /// host's pacing counts no bytes.
    pub(super) fn charge(self: &Arc<Self>, host: HostKey, bytes: u64) {
        let policy = self.policies.index(&host);
        let cost = self.policies.at(policy).bytes_cost(bytes);
        if cost.is_zero() {
            return;
        }
        let host = self.policies.key(&host);
        let (free, now) = self.update(&host, policy, |state, now| (state.charge(now, cost), now));
        tracing::debug!(host = %host, bytes, free_in_ms = (free - now).as_millis() as u64, "response bytes charged");
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
    pub(super) fn mark(&mut self, host: &HostKey, track: bool) {
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

    pub(super) fn entry(&mut self, host: &HostKey, now: Instant, policy: usize) -> &mut Entry {
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
    pub(super) fn settle(&mut self, host: &HostKey, policies: &Policies, sweep: &SweepSignal) {
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
    pub(super) inner: Arc<Inner>,
    pub(super) admission: Admission,
    pub(super) policy: usize,
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

    /// The request leaves at `at`; see `Permit::try_send`.
    pub(crate) fn try_send(&mut self, host: &HostKey, at: Instant) -> Result<(), Instant> {
        self.inner
            .try_send(host, &mut self.admission, at, self.policy)
    }

    /// The request weighs `weight`; see `Permit::reweigh`.
    pub(crate) fn reweigh(&mut self, host: &HostKey, weight: u32) {
        self.inner
            .reweigh(host, &mut self.admission, weight, self.policy);
    }
}

/// A waiter's place in its host's line; leaving it (by drop, when the
/// acquire is cancelled or gives up) hands the turn to the next in line.
pub(super) struct Place<'a> {
    pub(super) inner: &'a Inner,
    pub(super) host: &'a HostKey,
    pub(super) id: u64,
    pub(super) queued: bool,
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

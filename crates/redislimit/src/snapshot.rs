//! [`Snapshot`]: what a limiter is doing now, per busy host and in total.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tokio::time::Instant;

use crate::HostKey;

/// Where a host's pacing is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PacedBy {
    /// In this process alone.
    InProcess,
    /// Through the shared limiter (Redis), for every replica.
    Shared,
    /// In this process, standing in for a shared limiter that is
    /// unavailable.
    Fallback,
}

/// One host with acquires waiting, in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostSnapshot {
    /// The host's key.
    pub host: HostKey,
    /// Acquires waiting for it in this process.
    pub queued: usize,
    /// Requests admitted in this process and not yet released, by
    /// [weight](crate::RequestPacing::with_weight): the slots they take.
    pub in_flight: usize,
    /// The earliest the next send may happen, concurrency aside, when this
    /// process knows it (`None` when the state lives in Redis).
    pub next_send: Option<Instant>,
    /// When a penalty holding it back ends, while one does and this process
    /// knows it.
    pub held_until: Option<Instant>,
    /// Where its pacing is decided.
    pub paced_by: PacedBy,
}

/// What a limiter is doing now: the busiest hosts (most acquires waiting,
/// then most in flight, then those only held back for now by a gap or a
/// penalty), at most as many as asked for, and totals over every host. See [`Limiter::snapshot`](crate::Limiter::snapshot).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Snapshot {
    /// The hosts with acquires waiting, most first.
    pub hosts: Vec<HostSnapshot>,
    /// Hosts the limiter holds state for in this process (busy, or not yet
    /// idle long enough to be forgotten).
    pub active_hosts: usize,
    /// Acquires waiting, over every host.
    pub queued: usize,
    /// Requests in flight (by weight), over every host.
    pub in_flight: usize,
    /// The version of the policies published to the scope in force, for
    /// a limiter that follows them (`LiveLimiter`); `None` otherwise, or
    /// while none is published.
    pub policy_version: Option<u64>,
}

impl Snapshot {
    /// The entry of `host` among [`hosts`](Self::hosts), if it is there.
    pub fn host(&self, host: &HostKey) -> Option<&HostSnapshot> {
        self.hosts.iter().find(|h| &h.host == host)
    }
}

/// Collects the `top` busiest of many hosts, cloning a host's key only
/// when it makes the cut so far.
pub(crate) struct TopHosts {
    top: usize,
    heap: BinaryHeap<Reverse<Ranked>>,
}

/// A host ranked by how busy it is.
struct Ranked(HostSnapshot);

impl Ranked {
    fn rank(&self) -> (usize, usize) {
        (self.0.queued, self.0.in_flight)
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.rank() == other.rank()
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

impl TopHosts {
    pub(crate) fn new(top: usize) -> Self {
        Self {
            top,
            heap: BinaryHeap::new(),
        }
    }

    /// Offers a host with acquires waiting; `make` builds its entry only
    /// when it is kept.
    pub(crate) fn offer(
        &mut self,
        queued: usize,
        in_flight: usize,
        make: impl FnOnce() -> HostSnapshot,
    ) {
        if self.top == 0 {
            return;
        }
        if self.heap.len() < self.top {
            self.heap.push(Reverse(Ranked(make())));
            return;
        }
        let beats = self
            .heap
            .peek()
            .is_some_and(|Reverse(least)| (queued, in_flight) > least.rank());
        if beats {
            self.heap.pop();
            self.heap.push(Reverse(Ranked(make())));
        }
    }

    /// The hosts kept, busiest first (ties by key).
    pub(crate) fn into_hosts(self) -> Vec<HostSnapshot> {
        let mut hosts: Vec<HostSnapshot> = self.heap.into_iter().map(|Reverse(r)| r.0).collect();
        hosts.sort_by(|a, b| {
            (b.queued, b.in_flight)
                .cmp(&(a.queued, a.in_flight))
                .then_with(|| a.host.cmp(&b.host))
        });
        hosts
    }
}

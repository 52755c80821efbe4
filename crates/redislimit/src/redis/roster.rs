//! How a replica serves a host while Redis is unavailable, from what it
//! knows of its peers (the registry it last read): plain functions of the
//! roster, which every replica that read the same registry computes alike;
//! and the roster a replica keeps through a break in its reads (`Reads`).

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::scripts::register::Roll;
use crate::HostKey;
use crate::fallback::{FallbackPolicy, Plan};

/// When a replica read the registry, and what it named (see
/// `Registry::reads`).
#[derive(Debug, Default)]
pub(super) struct Reads {
    /// The last time.
    last: Option<Instant>,
    /// The replicas it named then (this one included, sorted).
    read: Option<Arc<[String]>>,
    /// The last time after a break (or with this replica's entry added
    /// again).
    back: Option<Instant>,
    /// The replicas it named at the last read before that break, kept in
    /// the roster for `keep` from `back`.
    before: Option<Arc<[String]>>,
}

impl Reads {
    /// The roster of a replica's outage plans as it reads the registry at
    /// `now`: `ids` (what `roll` names) and, for `keep` after a read that
    /// follows a break longer than `keep` (or a renewal that added its
    /// entry again), the replicas the registry named at the last read
    /// before the break, less those `roll` says left since.
    pub(super) fn roster(
        &mut self,
        now: Instant,
        keep: Duration,
        roll: &Roll,
        ids: &Arc<[String]>,
    ) -> Arc<[String]> {
        let gap = self.last.map(|at| now.saturating_duration_since(at));
        let kept = self.back.is_some_and(|at| now < at + keep) && self.before.is_some();
        // A break within the `keep` after another (its entry added again
        // at the first renewal after it, say) keeps the roster from before
        // the first: the window is not drawn out.
        if gap.is_some_and(|gap| gap > keep || roll.added) && !kept {
            self.back = Some(now);
            self.before = self.read.take();
        }
        self.last = Some(now);
        self.read = Some(Arc::clone(ids));
        let known = match (self.back, &self.before) {
            (Some(back), Some(before)) if now < back + keep => before,
            _ => {
                self.before = None;
                return Arc::clone(ids);
            }
        };
        let mut roster: Vec<String> = ids.to_vec();
        roster.extend(known.iter().filter(|id| !roll.left.contains(id)).cloned());
        roster.sort();
        roster.dedup();
        roster.into()
    }
}

/// The turns of the replicas cut off from Redis that share a host, by
/// their indexes among those dividing it (up to [`Turns::MAX`]; a set of
/// bits, so that a request's arguments stay `Copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Turns([u64; 4]);

impl Turns {
    /// Indexes from this one on are not kept (a fleet of more replicas
    /// shares a host among that many at most in an outage's turns).
    pub(super) const MAX: u32 = 256;

    /// These turns and turn `index` (none at or past [`MAX`](Self::MAX)).
    pub(super) fn with(mut self, index: u32) -> Self {
        if index < Self::MAX {
            self.0[(index / 64) as usize] |= 1 << (index % 64);
        }
        self
    }

    /// The turns' indexes, in order.
    pub(super) fn iter(self) -> impl Iterator<Item = u32> {
        (0..Self::MAX).filter(move |i| self.0[(i / 64) as usize] & (1 << (i % 64)) != 0)
    }
}

/// A replica whose entry lapsed, and the roster it plans its outage from:
/// the replicas in the registry when it last renewed its entry (that
/// renewal read them): not those added since, which it never read, and
/// those that left since, which it still counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Absent {
    /// Its id in the registry.
    pub(super) id: String,
    /// The replicas it read (sorted), itself among them.
    pub(super) roster: Arc<[String]>,
}

/// The replicas `roll` names as lapsed, each with the roster it read at its
/// last renewal (an entry lives `entry_ttl` from each): the replicas of
/// `ids` (the roster, sorted) added to the registry before that renewal,
/// or not known to have been added since (an entry without its addition,
/// or a lapse without its expiry), and those that left the registry since
/// (it still counts them).
pub(super) fn absent<'a>(
    roll: &'a Roll,
    ids: &'a Arc<[String]>,
    entry_ttl: Duration,
) -> impl Iterator<Item = Absent> + 'a {
    let ttl = entry_ttl.as_micros() as u64;
    let added = |id: &str| {
        let at = |ids: &[String], times: &[u64]| {
            let i = ids.iter().position(|other| other == id)?;
            times.get(i).copied()
        };
        at(&roll.live, &roll.joined)
            .or_else(|| at(&roll.lapsed, &roll.lapsed_joined))
            .unwrap_or(0)
    };
    roll.lapsed.iter().enumerate().map(move |(i, id)| {
        let roster = match roll.lapsed_expiries.get(i) {
            Some(expiry) => {
                let renewed = expiry.saturating_sub(ttl);
                let mut roster: Vec<String> = ids
                    .iter()
                    .filter(|other| *other == id || added(other) < renewed)
                    .cloned()
                    .collect();
                let gone = roll.left.iter().zip(&roll.left_joined).zip(&roll.left_at);
                roster.extend(
                    gone.filter(|((_, added), left)| **added < renewed && **left > renewed)
                        .map(|((other, _), _)| other.clone()),
                );
                roster.sort();
                roster.dedup();
                roster.into()
            }
            None => Arc::clone(ids),
        };
        Absent {
            id: id.clone(),
            roster,
        }
    })
}

/// What a replica knows of its peers when it plans a host's outage.
#[derive(Debug, Clone, Copy)]
pub(super) struct Roster<'a> {
    /// The live replicas at the last heartbeat Redis answered (sorted), if
    /// it ever answered one.
    pub(super) peers: Option<&'a [String]>,
    /// This replica's id.
    pub(super) me: &'a str,
    /// How many replicas to assume without a registry.
    pub(super) expected: u32,
    /// Whether replicas this one read may not have read it yet (see
    /// `Registry::unread`).
    pub(super) unread: bool,
}

/// How a replica serves the host of `key` while Redis is unavailable, under
/// `policy`, from what `roster` says of its peers: a plain function. With
/// `n` replicas, `divides(n)` says whether the host's limits divide among
/// them; `spare_turn(n)` draws this replica a turn when it never saw the
/// registry.
pub(super) fn plan_for(
    policy: FallbackPolicy,
    roster: &Roster<'_>,
    key: &HostKey,
    divides: impl FnOnce(u32) -> bool,
    spare_turn: impl FnOnce(u32) -> u32,
) -> Plan {
    let n = roster
        .peers
        .map_or(roster.expected, |p| p.len() as u32)
        .max(1);
    if n == 1 || policy == FallbackPolicy::Full {
        return Plan::Alone;
    }
    // Others it read may not have read it: they divide the host among
    // themselves without it, so it leaves them the host (of replicas
    // started together, each sees those that registered before it, and
    // the first is seen by all).
    if roster.unread && roster.peers.is_some() {
        return Plan::Defer;
    }
    // Without a registry, a turn drawn from this replica's id: replicas
    // that never saw one spread over the turns instead of sharing one.
    let index = roster
        .peers
        .and_then(|p| p.iter().position(|id| id == roster.me))
        .map_or_else(|| spare_turn(n), |i| i as u32);
    if policy == FallbackPolicy::Share && divides(n) {
        return Plan::Share { n, index };
    }
    match roster.peers {
        // By key: every host of a key is served by the same replica.
        Some(peers) if owner(peers, key) != Some(roster.me) => Plan::Defer,
        Some(_) => Plan::Own,
        // Nobody known to partition with: divide as well as possible.
        None => Plan::Share { n, index },
    }
}

/// The replica that serves `host` during an outage: the highest score of
/// SHA-256 over (replica, host), so every replica that saw the same
/// registry picks the same one, and a replica leaving moves only its hosts.
pub(super) fn owner<'a>(peers: &'a [String], host: &HostKey) -> Option<&'a str> {
    peers
        .iter()
        .max_by_key(|id| {
            let mut digest = Sha256::new();
            digest.update((id.len() as u64).to_be_bytes());
            digest.update(id.as_bytes());
            digest.update(host.as_str().as_bytes());
            let d = digest.finalize();
            u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
        })
        .map(String::as_str)
}

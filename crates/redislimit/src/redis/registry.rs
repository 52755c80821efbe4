//! The replica registry: each `RedisLimiter` announces itself in its scope,
//! so that during an outage every replica knows how many peers were live
//! just before it, and which ones; and so that while one replica alone is
//! cut off from Redis, the others know it may be sending on its own, and
//! keep its share of each host free.
//!
//! Every limiter starts a heartbeat at its first acquire, off the
//! admission path: every [`HEARTBEAT`] it renews its entry (which lives
//! [`ENTRY_TTL`] unrenewed) and reads the entries, live and lapsed. While
//! Redis is away the heartbeat fails and the last list read stays: that is
//! the registry "seen before the outage". While this replica's circuit is
//! open its heartbeat reads without renewing, so that its entry lapses for
//! the others; it sends on its own only [`ALONE_AFTER`] after the last
//! renewal it sent, by when every replica still on Redis has read the
//! lapse (see [`Registry::lapse`] and docs/DESIGN.md, "Partial outages").
//! The task holds the limiter weakly and ends when the limiter is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::agreement::Agreement;
use super::backend::Backend;
use super::keys::RedisKeys;
use super::lifecycle::Lifecycle;
use super::roster::{Absent, Reads, Roster, Turns, absent, plan_for};
use super::scripts::register::Roll;
use super::settings::{Args, Mode, Settings};
use crate::HostKey;
use crate::fallback::{FallbackPolicy, OutagePlan, Plan};
use crate::limiter::heaviest;
use std::num::NonZeroU32;

/// How often a replica renews its entry and reads the others'.
const HEARTBEAT: Duration = Duration::from_millis(500);
/// How long an entry lives unrenewed: a replica that died is counted live
/// for at most this long.
const ENTRY_TTL: Duration = Duration::from_millis(1500);
/// How long after its last renewal was sent a replica cut off from Redis
/// waits before it sends on its own: its entry's life, a heartbeat for
/// the others to read the lapse, and as much again for a heartbeat of
/// theirs that runs late and an admission they booked ahead.
pub(super) const ALONE_AFTER: Duration = ENTRY_TTL
    .saturating_add(HEARTBEAT)
    .saturating_add(HEARTBEAT);
/// How long Redis must have answered a replica's renewals before the
/// roster it read is taken to name the replicas started beside it, which
/// read its entry as they registered: a heartbeat, and half of one more
/// for one that runs late. In heartbeats: from its third on. Until then
/// it is young (see `Registry::young`). Whether the replicas registered
/// before it have read it is not assumed from time: their renewals say
/// (see `Registry::unread`).
const KNOWN_AFTER: Duration = Duration::from_millis(HEARTBEAT.as_millis() as u64 * 3 / 2);
/// How long a lapsed entry is kept, and its replica's share kept free,
/// under a `lease_ttl`: a replica cut off alone for longer than this is
/// forgotten (the others go back to the whole limit), and one that crashed
/// holds its share until its entry lapsed and this long after: no longer
/// than a lease it held would (the entry lapses within [`ENTRY_TTL`] of
/// its last renewal), and at least [`ALONE_AFTER`].
fn lapse_kept(lease_ttl: Duration) -> Duration {
    lease_ttl.saturating_sub(ENTRY_TTL).max(ALONE_AFTER)
}

/// One limiter's entry in its scope's registry.
#[derive(Debug)]
pub(super) struct Registry {
    key: String,
    /// When each entry of `key` was added (see register.lua).
    joined: String,
    id: String,
    /// How long the registry keeps a lapsed entry (see [`lapse_kept`]).
    keep: Duration,
    /// Whether the heartbeat task runs.
    beating: AtomicBool,
    /// Whether this replica is leaving the registry (it closed, or was
    /// dropped): it renews its entry no more.
    leaving: AtomicBool,
    /// Whether Redis took its entry out.
    left: AtomicBool,
    /// The replicas at the last heartbeat Redis answered, live and lapsed
    /// (this one included), sorted: the roster of outage plans.
    peers: Mutex<Option<Arc<[String]>>>,
    /// The other replicas whose entry lapsed, as last read.
    lapsed: Mutex<Lapsed>,
    /// Whether `lapsed` names anyone: the admission path's one check.
    any_lapsed: AtomicBool,
    /// When the last renewal of this replica's entry was sent.
    renewed: Mutex<Option<Instant>>,
    /// When the renewals Redis answered without a break long enough for
    /// the others to forget this replica began, and when the last of them
    /// was sent, and whether the others have read it (see
    /// [`KNOWN_AFTER`] and [`Registry::unread`]).
    standing: Mutex<Option<Standing>>,
    /// When the registry was last read, and when it was read again after
    /// a break long enough for the others' entries to be forgotten (or
    /// Redis lost this replica's entry): for `keep` from then, the
    /// replicas it named before stay in its roster (see [`Registry::read`]).
    reads: Mutex<Reads>,
}

/// An unbroken run of answered renewals: `since` the first was sent, the
/// last at `last`; `elders`: whether the registry read with the first named
/// other live replicas (registered before this one, they read it only at
/// their next heartbeat; those registered after it read it as they did).
#[derive(Debug, Clone, Copy)]
struct Standing {
    since: Instant,
    last: Instant,
    elders: bool,
    /// When the first renewal of the run ran in Redis (µs on its clock).
    registered: u64,
    /// Whether, at the last renewal answered, every other live replica had
    /// renewed its entry after `registered`: each renewal read this one's
    /// entry (register.lua reads after it writes), so that replica counts
    /// it once it took in the reply.
    read: bool,
}

/// The other replicas whose entry lapsed.
#[derive(Debug, Default)]
struct Lapsed {
    /// Those lapsed at either of the last two heartbeats Redis answered:
    /// a returning one keeps its share free until it has surely left its
    /// fallback.
    kept: Arc<[Absent]>,
    /// Those lapsed at the last.
    last: Arc<[Absent]>,
}

/// What the replicas cut off from Redis ask of an admission to one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Lapse {
    /// Nothing: no replica that lapsed serves the host on its own.
    #[default]
    None,
    /// A replica that lapsed serves the host alone (`Partition`): no
    /// admission here until it is back or forgotten.
    Defer,
    /// Replicas that lapsed share the host: `count` of `n` shares are
    /// theirs, and they send in the turns whose indexes are set in `turns`.
    Shun {
        /// How many replicas divide the host's limits.
        n: u32,
        /// The lapsed replicas' turns.
        turns: Turns,
        /// How many of the shares are the lapsed replicas'.
        count: u32,
    },
}

impl Registry {
    pub(super) fn new(prefix: &str, scope: &str, lease_ttl: Duration) -> Self {
        Self {
            key: RedisKeys::replicas(prefix, scope),
            joined: RedisKeys::joined(prefix, scope),
            keep: lapse_kept(lease_ttl),
            id: format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
            beating: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            left: AtomicBool::new(false),
            peers: Mutex::new(None),
            lapsed: Mutex::new(Lapsed::default()),
            any_lapsed: AtomicBool::new(false),
            renewed: Mutex::new(None),
            standing: Mutex::new(None),
            reads: Mutex::new(Reads::default()),
        }
    }

    /// A turn among `n` derived from this replica's id.
    fn spare_turn(&self, n: u32) -> u32 {
        let d = Sha256::digest(self.id.as_bytes());
        u32::from_be_bytes([d[0], d[1], d[2], d[3]]) % n.max(1)
    }

    fn peers(&self) -> Option<Arc<[String]>> {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether the roster this replica read may not be the one the others
    /// read with it in: its entry has not been answered for
    /// [`KNOWN_AFTER`] yet (it started, or came back after the others
    /// forgot it), so a replica that started beside it may count it while
    /// it does not count that one, or count nobody else at all.
    fn young(&self) -> bool {
        let standing = *self.standing.lock().unwrap_or_else(PoisonError::into_inner);
        standing.is_none_or(|s| s.last < s.since + KNOWN_AFTER)
    }

    /// Whether replicas this one read may not have read it yet: replicas
    /// were live in the registry when its run of renewals began, and at
    /// the last renewal answered one of them had not renewed (and read)
    /// since. The first of replicas started together is read by every
    /// later one as it registers: it is not unread. A replica whose
    /// heartbeat runs late keeps the newcomer unread for as long.
    fn unread(&self) -> bool {
        let standing = *self.standing.lock().unwrap_or_else(PoisonError::into_inner);
        standing.is_some_and(|s| s.elders && !s.read)
    }

    /// From when this replica may send on its own without another, still
    /// on Redis, admitting beside it: [`ALONE_AFTER`] after the last
    /// renewal of its entry was sent. `None` if none ever was (no replica
    /// knows of it), or while it still renews its entry: then the node of
    /// the registry answers it, and only another Cluster node failed, which
    /// the other replicas cannot reach either.
    pub(super) fn alone_from(&self, backend: &Backend) -> Option<Instant> {
        if backend.circuit(&self.key).closed() {
            return None;
        }
        let renewed = *self.renewed.lock().unwrap_or_else(PoisonError::into_inner);
        renewed.map(|at| at + ALONE_AFTER)
    }

    /// What the replicas that lapsed ask of an admission to `host` under
    /// `settings`: the plan each makes for it on its own (from the roster
    /// it read at its last renewal), added up; the host left to them when
    /// they read rosters of different sizes.
    pub(super) fn lapse(&self, settings: &Settings, host: &HostKey) -> Lapse {
        if !self.any_lapsed.load(Ordering::Relaxed) {
            return Lapse::None;
        }
        let lapsed = Arc::clone(
            &self
                .lapsed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .kept,
        );
        let Some(peers) = self.peers() else {
            return Lapse::None;
        };
        let policy = settings.policies.index(host);
        let cap = settings.args[policy].mode.in_flight();
        let key = settings.policies.key(host);
        let mut lapse = Lapse::None;
        for absent in lapsed.iter() {
            // Kept from the heartbeat before, and gone from the registry
            // since (it left, or was forgotten): no turn to keep free.
            if peers.binary_search(&absent.id).is_err() {
                continue;
            }
            // Whether it was unread, this replica cannot tell: it plans as
            // one the others know (an unread one defers: its share is kept
            // free for nothing).
            let roster = Roster {
                peers: Some(&absent.roster),
                me: &absent.id,
                expected: settings.expected_replicas,
                unread: false,
            };
            let divides = |n| settings.policies.at(policy).divides(n, cap);
            match plan_for(settings.fallback_policy, &roster, &key, divides, |_| 0) {
                Plan::Own => return Lapse::Defer,
                Plan::Share { n, index } => {
                    let (turns, count) = match lapse {
                        // Lapsed replicas that read different rosters (one
                        // was added between their last renewals) divide
                        // the host differently: their turns do not fit one
                        // count, so the host is left to them.
                        Lapse::Shun { n: other, .. } if other != n => return Lapse::Defer,
                        Lapse::Shun { turns, count, .. } => (turns, count),
                        _ => (Turns::default(), 0),
                    };
                    lapse = Lapse::Shun {
                        n,
                        turns: turns.with(index),
                        count: count + 1,
                    };
                }
                // `Full` is opt-in excess; a deferring replica sends nothing.
                Plan::Alone | Plan::Defer => {}
            }
        }
        lapse
    }
}

impl Registry {
    /// Starts the heartbeat through `backend` unless it runs; it ends when
    /// the limiter is dropped (`backend` with it) or closed. Every limiter
    /// announces itself, whatever its own policy, so that replicas with
    /// another one still count it.
    pub(super) fn ensure_heartbeat(
        self: &Arc<Self>,
        backend: &Arc<Backend>,
        lifecycle: &Arc<Lifecycle>,
        agreement: &Arc<Agreement>,
    ) {
        if self.beating.load(Ordering::Relaxed) || self.beating.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(heartbeat(
            Arc::downgrade(self),
            Arc::downgrade(backend),
            Arc::clone(lifecycle),
            Arc::downgrade(agreement),
        ));
    }

    /// One heartbeat: renews this replica's entry (unless its circuit is
    /// open: then its entry lapses) and reads the others'.
    async fn beat(&self, backend: &Backend) {
        let renew = backend.circuit(&self.key).closed() && !self.leaving.load(Ordering::Acquire);
        let sent = Instant::now();
        if renew {
            *self.renewed.lock().unwrap_or_else(PoisonError::into_inner) = Some(sent);
        }
        let ttl_us = if renew {
            ENTRY_TTL.as_micros() as u64
        } else {
            0
        };
        let keep_us = self.keep.as_micros() as u64;
        let call = backend.register([&self.key, &self.joined], &self.id, ttl_us, keep_us);
        // Bounded, so a pool without timeouts cannot stop the heartbeat.
        let Ok(answer) = tokio::time::timeout(HEARTBEAT, call).await else {
            return;
        };
        match answer {
            Ok(roll) => {
                if renew {
                    self.stand(sent, &roll);
                }
                self.read(roll);
            }
            Err(err) => tracing::debug!(error = ?err, "registry heartbeat failed"),
        }
    }

    /// Notes that Redis answered a renewal sent at `sent` with `roll`: the
    /// run of them goes on, or starts again when the last one before is so
    /// old that the others may have forgotten this replica since, or when
    /// the renewal added its entry (Redis had lost it: the others' next
    /// renewals may run before it, and not read it).
    fn stand(&self, sent: Instant, roll: &Roll) {
        let ttl = ENTRY_TTL.as_micros() as u64;
        // When each live entry was last renewed.
        let mut renewals = roll
            .live
            .iter()
            .zip(&roll.expiries)
            .map(|(id, expiry)| (id, expiry.saturating_sub(ttl)));
        let Some(renewed) = renewals.clone().find(|(id, _)| **id == self.id) else {
            return;
        };
        let mut standing = self.standing.lock().unwrap_or_else(PoisonError::into_inner);
        let run = match *standing {
            Some(s) if !roll.added && sent.saturating_duration_since(s.last) <= self.keep => {
                Standing {
                    last: sent.max(s.last),
                    ..s
                }
            }
            _ => Standing {
                since: sent,
                last: sent,
                elders: roll.live.iter().any(|id| *id != self.id),
                registered: renewed.1,
                read: false,
            },
        };
        let read = renewals.all(|(id, at)| *id == self.id || at > run.registered);
        *standing = Some(Standing { read, ..run });
    }

    /// Takes in what the registry holds.
    ///
    /// Reading it again after a break longer than the registry keeps a
    /// lapsed entry (or with its entry added again), a replica keeps the
    /// replicas the registry named before the break (less those that left
    /// since) in its roster for `keep` (see `Reads::roster`): the
    /// outage may have been everyone's (Redis away, a Cluster master
    /// failing over), and the others come back one by one, each a
    /// circuit's probe and a heartbeat later, their entries gone meanwhile.
    /// Planning from the registry alone, the first one back found only
    /// itself and, were Redis to fail it again, paced alone at the whole
    /// limits beside them.
    fn read(&self, roll: Roll) {
        let mut ids: Vec<String> = roll.live.iter().chain(&roll.lapsed).cloned().collect();
        ids.push(self.id.clone());
        ids.sort();
        ids.dedup();
        let ids: Arc<[String]> = ids.into();
        let roster = self
            .reads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .roster(Instant::now(), self.keep, &roll, &ids);
        *self.peers.lock().unwrap_or_else(PoisonError::into_inner) = Some(roster);
        // The others plan from what the registry held at their last
        // renewal: their rosters are rebuilt from it alone.
        let others: Arc<[Absent]> = absent(&roll, &ids, ENTRY_TTL)
            .filter(|absent| absent.id != self.id)
            .collect();
        let mut seen = self.lapsed.lock().unwrap_or_else(PoisonError::into_inner);
        // Those lapsed now as read now; those back since as read before.
        let mut kept: Vec<Absent> = others.to_vec();
        kept.extend(
            seen.last
                .iter()
                .filter(|before| others.iter().all(|now| now.id != before.id))
                .cloned(),
        );
        kept.sort_by(|a, b| a.id.cmp(&b.id));
        if others != seen.last {
            let ids: Vec<&str> = others.iter().map(|a| a.id.as_str()).collect();
            tracing::debug!(lapsed = ?ids, "replicas whose registry entry lapsed: their shares are kept free");
        }
        self.any_lapsed.store(!kept.is_empty(), Ordering::Relaxed);
        *seen = Lapsed {
            kept: kept.into(),
            last: others,
        };
    }

    /// Takes this replica's entry out of the registry (it closes): the
    /// others then need not keep its share free as a lapsed replica's.
    pub(super) async fn leave(&self, backend: &Backend) {
        if !self.beating.load(Ordering::Relaxed) || self.left.load(Ordering::Acquire) {
            return;
        }
        // No renewal from now on (one under way may still land: it lapses).
        self.leaving.store(true, Ordering::Release);
        let keep_us = self.keep.as_micros() as u64;
        match backend
            .leave([&self.key, &self.joined], &self.id, keep_us)
            .await
        {
            Ok(()) => self.left.store(true, Ordering::Release),
            Err(err) => tracing::debug!(error = ?err, "leaving the registry failed"),
        }
    }

    /// [`leave`](Self::leave) from a limiter dropped without closing: in
    /// the background on the current Tokio runtime (if any), within a
    /// second. A process that exits at once, or is killed, leaves its entry
    /// to lapse.
    pub(super) fn leave_when_dropped(self: &Arc<Self>, backend: &Arc<Backend>) {
        if !self.beating.load(Ordering::Relaxed) || self.left.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (registry, backend) = (Arc::clone(self), Arc::clone(backend));
        runtime.spawn(async move {
            let leaving = registry.leave(&backend);
            let _ = tokio::time::timeout(Duration::from_secs(1), leaving).await;
        });
    }

    /// How this replica serves `host` while Redis is unavailable, under
    /// `settings`.
    fn outage_plan(&self, settings: &Settings, host: &HostKey) -> Plan {
        let peers = self.peers();
        let policy = settings.policies.index(host);
        let cap = settings.args[policy].mode.in_flight();
        let roster = Roster {
            peers: peers.as_deref(),
            me: &self.id,
            expected: settings.expected_replicas,
            unread: self.unread(),
        };
        plan_for(
            settings.fallback_policy,
            &roster,
            &settings.policies.key(host),
            |n| settings.policies.at(policy).divides(n, cap),
            |n| self.spare_turn(n),
        )
    }
}

/// `args`: the policy's arguments `base` less the shares of the replicas
/// `lapse` names (their part of the in-flight cap and of the quota, as
/// `Pacing::shared_by` gives each), with their turns, for a request of
/// `weight` (at most what is left, as a share in the fallback takes it).
pub(super) fn less_lapsed(args: &mut Args, base: &Args, weight: u32, lapse: Lapse) {
    args.mode = base.mode;
    args.quota = base.quota;
    args.weight = weight;
    args.shun_n = 0;
    args.shun_turns = Turns::default();
    let Lapse::Shun { n, turns, count } = lapse else {
        return;
    };
    if let Mode::Lease(cap) = args.mode {
        let share = (cap.get() / n.max(1)).max(1);
        let left = cap.get().saturating_sub(share.saturating_mul(count));
        args.mode = Mode::Lease(NonZeroU32::new(left).unwrap_or(NonZeroU32::MIN));
    }
    if args.quota > 0 {
        let share = (args.quota / n.max(1)).max(1);
        args.quota = args
            .quota
            .saturating_sub(share.saturating_mul(count))
            .max(1);
    }
    args.weight = weight
        .min(heaviest(args.mode.in_flight(), args.quota))
        .max(1);
    args.shun_n = n;
    args.shun_turns = turns;
}

/// Every [`HEARTBEAT`]: renews this replica's entry and reads the others',
/// and confirms the scope's configuration record, which puts it back
/// within a heartbeat when Redis lost it (see `agreement.rs`).
async fn heartbeat(
    registry: Weak<Registry>,
    backend: Weak<Backend>,
    lifecycle: Arc<Lifecycle>,
    agreement: Weak<Agreement>,
) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the first beat starts now.
    tick.tick().await;
    loop {
        let (Some(registry), Some(backend), Some(agreement)) =
            (registry.upgrade(), backend.upgrade(), agreement.upgrade())
        else {
            return;
        };
        if lifecycle.is_closed() {
            // Closed: the entry lapses within its TTL.
            return;
        }
        registry.beat(&backend).await;
        // A Cluster's slot map, for its node circuits (when none was read
        // yet, or a node failed: a failover moves slots).
        let _ = tokio::time::timeout(HEARTBEAT, backend.map_slots()).await;
        // Bounded, so a pool without timeouts cannot stop the heartbeat.
        let _ = tokio::time::timeout(HEARTBEAT, agreement.keep(&backend)).await;
        drop((registry, backend, agreement));
        // Every HEARTBEAT from the last beat's start, not after its calls.
        tick.tick().await;
    }
}

/// The outage plan a `FallbackLimiter` asks: this replica's registry and
/// its limiter's settings.
pub(super) struct RegistryPlan {
    pub(super) registry: Arc<Registry>,
    pub(super) settings: Arc<Settings>,
    pub(super) backend: Arc<Backend>,
}

impl std::fmt::Debug for RegistryPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryPlan")
            .field("policy", &self.settings.fallback_policy)
            .field("peers", &self.registry.peers())
            .finish()
    }
}

impl OutagePlan for RegistryPlan {
    fn plan(&self, host: &HostKey) -> Plan {
        self.registry.outage_plan(&self.settings, host)
    }

    fn alone_from(&self, plan: Plan) -> Option<Instant> {
        match plan {
            Plan::Share { .. } | Plan::Own => {}
            // Alone as far as the roster it read says, which may not show
            // the replicas that started just after it: they defer, yet
            // what Redis admitted them may still be under way. (Without a
            // roster, `expected_replicas` says how many there are.)
            Plan::Alone
                if self.settings.fallback_policy != FallbackPolicy::Full
                    && self.registry.young()
                    && self.registry.peers().is_some() => {}
            Plan::Alone | Plan::Defer => return None,
        }
        // An admission the others booked ahead may leave that much later.
        let booked = self.settings.book_ahead;
        self.registry
            .alone_from(&self.backend)
            .map(|from| from + booked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::roster::owner;

    #[test]
    fn every_replica_picks_the_same_owner_and_a_leaver_moves_only_its_hosts() {
        let peers: Vec<String> = (0..4).map(|i| format!("replica-{i}")).collect();
        let hosts: Vec<HostKey> = (0..200)
            .map(|i| HostKey::parse(&format!("http://h{i}.test/")).unwrap())
            .collect();
        let before: Vec<&str> = hosts.iter().map(|h| owner(&peers, h).unwrap()).collect();
        for id in &peers {
            let served = before.iter().filter(|o| **o == id.as_str()).count();
            assert!((25..=75).contains(&served), "{id} serves {served} of 200");
        }
        let fewer = &peers[1..];
        for (host, was) in hosts.iter().zip(&before) {
            let now = owner(fewer, host).unwrap();
            if *was != "replica-0" {
                assert_eq!(now, *was, "{host} moved though its owner stayed");
            }
        }
    }

    use proptest::prelude::*;

    /// The plans every replica of `peers` makes for `key` under `policy`.
    fn plans(policy: FallbackPolicy, peers: &[String], key: &HostKey, divides: bool) -> Vec<Plan> {
        peers
            .iter()
            .map(|me| {
                let roster = Roster {
                    peers: Some(peers),
                    me,
                    expected: 1,
                    unread: false,
                };
                plan_for(policy, &roster, key, |_| divides, |_| 0)
            })
            .collect()
    }

    proptest! {
        /// Whatever the replicas and the host: partitioned (by choice, or
        /// because the limits do not divide), exactly one replica serves it
        /// and the others defer; shared, each takes a turn of its own.
        #[test]
        fn the_replicas_plans_for_a_host_add_up_to_one_limit(
            n in 2usize..12,
            seed in any::<u64>(),
            host in 0u32..10_000,
            divides in any::<bool>(),
        ) {
            let mut peers: Vec<String> = (0..n).map(|i| format!("{:016x}", seed.wrapping_add(i as u64 * 7919))).collect();
            peers.sort();
            let key = HostKey::parse(&format!("http://h{host}.test/")).unwrap();
            for policy in [FallbackPolicy::Partition, FallbackPolicy::Share] {
                let plans = plans(policy, &peers, &key, divides);
                if policy == FallbackPolicy::Share && divides {
                    let mut turns: Vec<u32> = plans
                        .iter()
                        .map(|p| match *p {
                            Plan::Share { n: shared, index } => {
                                assert_eq!(shared as usize, n);
                                index
                            }
                            other => panic!("{other:?}"),
                        })
                        .collect();
                    turns.sort_unstable();
                    prop_assert_eq!(turns, (0..n as u32).collect::<Vec<_>>());
                } else {
                    prop_assert_eq!(plans.iter().filter(|p| **p == Plan::Own).count(), 1);
                    prop_assert_eq!(plans.iter().filter(|p| **p == Plan::Defer).count(), n - 1);
                }
            }
            // Full, or alone in the registry: the whole limit.
            prop_assert!(plans(FallbackPolicy::Full, &peers, &key, divides).iter().all(|p| *p == Plan::Alone));
            prop_assert_eq!(plans(FallbackPolicy::Share, &peers[..1], &key, divides), vec![Plan::Alone]);
        }
    }

    /// A limiter (never connected) with `cap` and `policy`, and its
    /// registry having read `others` live and `lapsed` lapsed beside it.
    fn registry_with(
        cap: u32,
        policy: FallbackPolicy,
    ) -> (crate::RedisLimiter, impl Fn(&[&str], &[&str])) {
        let pool =
            crate::RedisPool::standalone("redis://127.0.0.1:1/", crate::RedisTimeouts::default())
                .unwrap();
        let pacing = crate::Pacing::builder()
            .min_delay(Duration::from_millis(100))
            .build()
            .unwrap();
        let limiter = crate::RedisLimiter::builder(pool, "t")
            .pacing(pacing)
            .cluster_concurrency(cap)
            .fallback_policy(policy)
            .build()
            .unwrap();
        let registry = Arc::clone(&limiter.core.registry);
        let read = move |live: &[&str], lapsed: &[&str]| {
            let own = |ids: &[&str]| ids.iter().map(|id| (*id).to_owned()).collect();
            registry.read(Roll {
                live: own(live),
                lapsed: own(lapsed),
                expiries: vec![0; live.len()],
                ..Roll::default()
            });
        };
        (limiter, read)
    }

    #[test]
    fn a_lapsed_replicas_turn_and_share_are_kept_free_until_it_is_back() {
        let (limiter, read) = registry_with(4, FallbackPolicy::Share);
        let (core, a) = (&limiter.core, host_key("a.test"));
        let lapse = || core.registry.lapse(&core.settings, &a);
        assert_eq!(lapse(), Lapse::None);
        read(&["b", "c"], &["d"]);
        // The roster is b, c, d and this replica, sorted.
        let Lapse::Shun { n, turns, count } = lapse() else {
            panic!("{:?}", lapse());
        };
        assert_eq!((n, count), (4, 1));
        let mut roster: Vec<&str> = vec!["b", "c", "d", &core.registry.id];
        roster.sort_unstable();
        let index = roster.iter().position(|id| *id == "d").unwrap();
        assert_eq!(turns, Turns::default().with(index as u32));
        let base = core.settings.args[0];
        let mut args = base;
        less_lapsed(&mut args, &base, 4, lapse());
        assert_eq!(args.mode.in_flight(), 3, "one of four shares is d's");
        assert_eq!(args.weight, 3, "a request takes at most what is left");
        assert_eq!((args.shun_n, args.shun_turns), (4, turns));
        // Gone again, the arguments are the policy's.
        less_lapsed(&mut args, &base, 4, Lapse::None);
        assert_eq!((args.mode.in_flight(), args.weight, args.shun_n), (4, 4, 0));
        // Back: its share stays free one more heartbeat, then not.
        read(&["b", "c", "d"], &[]);
        assert_eq!(lapse(), Lapse::Shun { n, turns, count });
        read(&["b", "c", "d"], &[]);
        assert_eq!(lapse(), Lapse::None);
        // This replica's own lapse is not kept free from itself.
        read(&["b"], &[&core.registry.id.clone()]);
        assert_eq!(lapse(), Lapse::None);
    }

    /// A lapsed replica is planned for from the roster it read at its last
    /// renewal: the replicas added since (this one among them) are not in
    /// it, those that left since are. Two lapsed replicas that read
    /// rosters of different sizes leave the host to them.
    #[test]
    fn a_lapsed_replica_is_planned_for_from_the_roster_it_read() {
        let (limiter, _) = registry_with(6, FallbackPolicy::Share);
        let (core, a) = (&limiter.core, host_key("a.test"));
        let registry = &core.registry;
        let me = registry.id.clone();
        let ttl = ENTRY_TTL.as_micros() as u64;
        let own = |ids: &[&str]| ids.iter().map(|id| (*id).to_owned()).collect::<Vec<_>>();
        // d last renewed at 10 s; e and this replica were added at 11 s, g
        // left at 10.5 s and h at 9 s.
        let roll = Roll {
            live: own(&["b", "c", "e", &me]),
            expiries: vec![12 * S + ttl; 4],
            joined: vec![S, 2 * S, 11 * S, 11 * S],
            lapsed: own(&["d"]),
            lapsed_expiries: vec![10 * S + ttl],
            lapsed_joined: vec![3 * S],
            left: own(&["g", "h"]),
            left_joined: vec![S / 2, S],
            left_at: vec![10 * S + S / 2, 9 * S],
            added: false,
        };
        registry.read(roll.clone());
        let d = Lapse::Shun {
            n: 4,
            turns: Turns::default().with(2),
            count: 1,
        };
        assert_eq!(
            registry.lapse(&core.settings, &a),
            d,
            "d read b, c, d and g"
        );
        // Back, d keeps the roster it was planned from one more heartbeat.
        registry.read(Roll {
            live: own(&["b", "c", "d", "e", &me]),
            expiries: vec![13 * S + ttl; 5],
            joined: vec![S, 2 * S, 3 * S, 11 * S, 11 * S],
            ..Roll::default()
        });
        assert_eq!(registry.lapse(&core.settings, &a), d);
        // f lapsed too, having renewed after e and this replica were added,
        // and after g left: it divides the host among six, d among four.
        registry.read(roll.clone());
        registry.read(Roll {
            lapsed: own(&["d", "f"]),
            lapsed_expiries: vec![10 * S + ttl, 11 * S + S / 2 + ttl],
            lapsed_joined: vec![3 * S, 4 * S],
            ..roll
        });
        assert_eq!(registry.lapse(&core.settings, &a), Lapse::Defer);
    }

    #[test]
    fn turns_past_the_sixty_fourth_are_kept_free_too() {
        let turns = [0, 63, 64, 200, 255, 256, 1000]
            .into_iter()
            .fold(Turns::default(), Turns::with);
        assert_eq!(turns.iter().collect::<Vec<_>>(), [0, 63, 64, 200, 255]);
        // A fleet of 100 sharing a host (a cap of 100), two lapsed with
        // turns past the 64th: both are kept free, and their shares.
        let (limiter, read) = registry_with(100, FallbackPolicy::Share);
        let (core, a) = (&limiter.core, host_key("a.test"));
        let peers: Vec<String> = (0..99).map(|i| format!("p{i:03}")).collect();
        let peers: Vec<&str> = peers.iter().map(String::as_str).collect();
        let (live, lapsed) = peers.split_at(97);
        read(live, lapsed);
        let mut roster = peers.clone();
        roster.push(&core.registry.id);
        roster.sort_unstable();
        let index = |id: &str| roster.iter().position(|r| *r == id).unwrap() as u32;
        let want = lapsed.iter().map(|id| index(id)).collect::<Vec<_>>();
        assert!(want.iter().all(|&i| i >= 64), "{want:?}");
        let lapse = core.registry.lapse(&core.settings, &a);
        let Lapse::Shun { n, turns, count } = lapse else {
            panic!("{lapse:?}");
        };
        assert_eq!((n, count), (100, 2));
        assert_eq!(turns.iter().collect::<Vec<_>>(), want);
        let base = core.settings.args[0];
        let mut args = base;
        less_lapsed(&mut args, &base, 1, lapse);
        assert_eq!(args.shun_turns.iter().collect::<Vec<_>>(), want);
        assert_eq!(args.mode.in_flight(), 98, "two of 100 shares are theirs");
    }

    #[test]
    fn a_host_a_lapsed_replica_serves_alone_is_left_to_it() {
        let (limiter, read) = registry_with(0, FallbackPolicy::Partition);
        let core = &limiter.core;
        read(&["b", "c"], &["d"]);
        let peers = core.registry.peers().unwrap();
        for i in 0..64 {
            let h = host_key(&format!("h{i}.test"));
            let key = core.settings.policies.key(&h);
            let expected = if owner(&peers, &key) == Some("d") {
                Lapse::Defer
            } else {
                Lapse::None
            };
            assert_eq!(core.registry.lapse(&core.settings, &h), expected, "{h}");
        }
    }

    fn host_key(name: &str) -> HostKey {
        HostKey::parse(&format!("http://{name}/")).unwrap()
    }

    #[test]
    fn without_a_registry_a_replica_shares_among_those_expected() {
        let key = HostKey::parse("http://a.test/").unwrap();
        let roster = Roster {
            peers: None,
            me: "me",
            expected: 4,
            unread: false,
        };
        for policy in [FallbackPolicy::Share, FallbackPolicy::Partition] {
            assert_eq!(
                plan_for(policy, &roster, &key, |n| n == 4, |n| n - 1),
                Plan::Share { n: 4, index: 3 }
            );
        }
        let alone = Roster {
            expected: 1,
            ..roster
        };
        assert_eq!(
            plan_for(FallbackPolicy::Share, &alone, &key, |_| true, |_| 0),
            Plan::Alone
        );
    }

    /// Regression: replicas started together each read the registry as it
    /// was when they registered, so the first saw only itself and served
    /// every host alone at once while the others divided them: together
    /// more than a host allows. One the others may not know of yet leaves
    /// the hosts to them, and alone, it first waits as a share does.
    #[test]
    fn a_replica_the_others_may_not_know_yet_leaves_them_the_hosts() {
        let key = HostKey::parse("http://a.test/").unwrap();
        let peers: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        for policy in [FallbackPolicy::Share, FallbackPolicy::Partition] {
            for me in &peers {
                let young = Roster {
                    peers: Some(&peers),
                    me,
                    expected: 1,
                    unread: true,
                };
                assert_eq!(plan_for(policy, &young, &key, |_| true, |_| 0), Plan::Defer);
            }
            let first = Roster {
                peers: Some(&peers[..1]),
                me: "a",
                expected: 1,
                unread: true,
            };
            assert_eq!(plan_for(policy, &first, &key, |_| true, |_| 0), Plan::Alone);
            // Never having read the registry, it goes by `expected` as before.
            let unread = Roster {
                peers: None,
                me: "a",
                expected: 3,
                unread: true,
            };
            assert_eq!(
                plan_for(policy, &unread, &key, |_| true, |_| 1),
                Plan::Share { n: 3, index: 1 }
            );
        }
        let full = Roster {
            peers: Some(&peers),
            me: "a",
            expected: 1,
            unread: true,
        };
        assert_eq!(
            plan_for(FallbackPolicy::Full, &full, &key, |_| true, |_| 0),
            Plan::Alone
        );
    }

    /// What register.lua answers `registry` renewing at `at` (µs on
    /// Redis's clock): its own entry, and `others` last renewed when given.
    fn roll_at(registry: &Registry, at: u64, others: &[(&str, u64)]) -> Roll {
        let ttl = ENTRY_TTL.as_micros() as u64;
        let entries = std::iter::once((registry.id.as_str(), at)).chain(others.iter().copied());
        let (live, expiries) = entries.map(|(id, at)| (id.to_owned(), at + ttl)).unzip();
        Roll {
            live,
            expiries,
            ..Roll::default()
        }
    }

    const S: u64 = 1_000_000;

    /// A replica is young until Redis has answered its renewals for
    /// [`KNOWN_AFTER`] (its third heartbeat), and young again when it comes
    /// back after a break long enough for the others to have forgotten it.
    /// It is unread while a replica live when it registered has not
    /// renewed (and read) since.
    #[tokio::test(start_paused = true)]
    async fn a_replica_is_known_once_its_renewals_were_answered_for_two_heartbeats() {
        let registry = Registry::new("p", "s", Duration::from_secs(4));
        assert!(registry.young());
        assert!(!registry.unread(), "it read no one");
        let start = Instant::now();
        let hb = HEARTBEAT.as_micros() as u64;
        registry.stand(
            start,
            &roll_at(&registry, 10 * S, &[("elder", 10 * S - 100)]),
        );
        assert!(registry.young() && registry.unread());
        // The elder renewed since: it read this one.
        let beat = roll_at(&registry, 10 * S + hb, &[("elder", 10 * S + hb - 100)]);
        registry.stand(start + HEARTBEAT, &beat);
        assert!(registry.young() && !registry.unread());
        registry.stand(
            start + 2 * HEARTBEAT,
            &roll_at(&registry, 10 * S + 2 * hb, &[]),
        );
        assert!(!registry.young() && !registry.unread());
        // A break shorter than the others keep a lapsed entry: still known.
        let back = start + KNOWN_AFTER + registry.keep;
        registry.stand(back, &roll_at(&registry, 20 * S, &[("elder", 19 * S)]));
        assert!(!registry.young() && !registry.unread());
        // Longer: forgotten, young again until known again.
        let later = back + registry.keep + HEARTBEAT;
        registry.stand(later, &roll_at(&registry, 30 * S, &[]));
        assert!(registry.young());
        assert!(!registry.unread(), "no one was live before it");
        registry.stand(
            later + KNOWN_AFTER,
            &roll_at(&registry, 31 * S, &[("new", 30 * S + 1)]),
        );
        assert!(!registry.young());
        // A renewal that is not its own answers nothing about it.
        registry.stand(later + 2 * KNOWN_AFTER, &Roll::default());
        assert!(!registry.young() && !registry.unread());
        // Redis lost its entry (restarted empty): added again, it is young
        // and unread until the elder renews after that, however soon the
        // elder renewed after it first registered.
        let again = later + 2 * KNOWN_AFTER + HEARTBEAT;
        let readded = Roll {
            added: true,
            ..roll_at(&registry, 40 * S, &[("new", 40 * S - 100)])
        };
        registry.stand(again, &readded);
        assert!(registry.young() && registry.unread());
        registry.stand(
            again + HEARTBEAT,
            &roll_at(&registry, 40 * S + hb, &[("new", 40 * S + 1)]),
        );
        assert!(!registry.unread());
    }

    /// Regression (a Cluster master failing over mid-crawl): back after an
    /// outage that outlasted the others' memory of its entry, a replica
    /// read a registry the others had not renewed in yet, planned alone,
    /// and when the new master then did not answer within its turn, sent
    /// at the whole limits beside them. It keeps the replicas it knew for
    /// `keep`, then goes by the registry.
    #[tokio::test(start_paused = true)]
    async fn a_replica_back_from_a_long_outage_keeps_the_replicas_it_knew_for_a_while() {
        let registry = Registry::new("p", "s", Duration::from_secs(4));
        let three = roll_at(
            &registry,
            10 * S,
            &[("a", 10 * S - 100), ("b", 10 * S - 200)],
        );
        registry.stand(Instant::now(), &three);
        registry.read(three);
        let size = || registry.peers().map_or(0, |p| p.len());
        assert_eq!(size(), 3);
        // Redis away for 5 s, for every replica: back, this one reads the
        // registry (its circuit still open: no renewal), which names no one.
        tokio::time::advance(Duration::from_secs(5)).await;
        registry.read(Roll::default());
        assert_eq!(size(), 3, "the replicas it knew were dropped at once");
        // Its next renewal adds its entry again; still no one else.
        tokio::time::advance(HEARTBEAT).await;
        let alone = Roll {
            added: true,
            ..roll_at(&registry, 15 * S, &[])
        };
        registry.stand(Instant::now(), &alone);
        registry.read(alone);
        assert_eq!(size(), 3);
        // One of them is back; the other is still away.
        tokio::time::advance(HEARTBEAT).await;
        let two = roll_at(&registry, 15 * S + 500_000, &[("a", 15 * S + 400_000)]);
        registry.stand(Instant::now(), &two);
        registry.read(two);
        assert_eq!(size(), 3);
        // A replica it knew left meanwhile (it closed): not kept.
        let left = Roll {
            left: vec!["b".to_owned()],
            left_joined: vec![1],
            left_at: vec![15 * S + 450_000],
            ..roll_at(&registry, 15 * S + 600_000, &[("a", 15 * S + 400_000)])
        };
        registry.read(left);
        assert_eq!(size(), 2, "a replica that left is kept");
        // `keep` after its return, the registry alone says.
        tokio::time::advance(registry.keep).await;
        let later = roll_at(&registry, 18 * S, &[("a", 18 * S - 100)]);
        registry.stand(Instant::now(), &later);
        registry.read(later);
        assert_eq!(size(), 2);
        // Its first start was no return: nothing before it to keep.
        let fresh = Registry::new("p", "s", Duration::from_secs(4));
        let first = roll_at(&fresh, 20 * S, &[]);
        fresh.stand(Instant::now(), &first);
        fresh.read(first);
        assert_eq!(fresh.peers().map_or(0, |p| p.len()), 1);
    }

    /// Regression: a replica took itself to be read by the replicas live
    /// when it registered once its renewals had been answered for one and
    /// a half heartbeats, assuming their heartbeats ran at most half a
    /// heartbeat late; one that ran later (a busy process) had not counted
    /// it, and in an outage the two planned from different rosters. Now it
    /// is unread until every one of them has renewed since it registered,
    /// however long that takes, or has lapsed.
    #[tokio::test(start_paused = true)]
    async fn a_replica_is_unread_until_every_elder_has_renewed_since_it_registered() {
        let registry = Registry::new("p", "s", Duration::from_secs(4));
        let start = Instant::now();
        let hb = HEARTBEAT.as_micros() as u64;
        let late = 10 * S - 100;
        for beat in 0..6u32 {
            let at = 10 * S + u64::from(beat) * hb;
            let roll = roll_at(&registry, at, &[("prompt", at - 100), ("late", late)]);
            registry.stand(start + HEARTBEAT * beat, &roll);
            assert!(
                registry.unread(),
                "beat {beat}: the late one has not read it"
            );
        }
        assert!(!registry.young(), "known by time alone");
        // Lapsed (no longer live): it counts no one, and no one waits on it.
        let at = 10 * S + 6 * hb;
        registry.stand(
            start + HEARTBEAT * 6,
            &roll_at(&registry, at, &[("prompt", at - 100)]),
        );
        assert!(!registry.unread());
    }
}

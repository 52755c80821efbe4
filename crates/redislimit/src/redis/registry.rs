//! The replica registry: each `RedisLimiter` announces itself in its scope,
//! so that during an outage every replica knows how many peers were live
//! just before it, and which ones.
//!
//! Every limiter starts a heartbeat at its first acquire, off the
//! admission path: every second it renews its entry (which lives 3 s
//! unrenewed) and reads the live entries. While Redis is away the heartbeat fails and the
//! last list read stays: that is the registry "seen before the outage".
//! The task holds the limiter weakly and ends when the limiter is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::agreement::Agreement;
use super::backend::Backend;
use super::keys::RedisKeys;
use super::lifecycle::Lifecycle;
use super::settings::Settings;
use crate::HostKey;
use crate::fallback::{FallbackPolicy, OutagePlan, Plan};

/// How often a replica renews its entry and reads the others'.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long an entry lives unrenewed: a replica that died is counted for
/// at most this long.
const ENTRY_TTL: Duration = Duration::from_secs(3);

/// One limiter's entry in its scope's registry.
#[derive(Debug)]
pub(super) struct Registry {
    key: String,
    id: String,
    /// Whether the heartbeat task runs.
    beating: AtomicBool,
    /// The live replicas at the last heartbeat Redis answered, sorted.
    peers: Mutex<Option<Arc<[String]>>>,
}

impl Registry {
    pub(super) fn new(prefix: &str, scope: &str) -> Self {
        Self {
            key: RedisKeys::replicas(prefix, scope),
            id: format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
            beating: AtomicBool::new(false),
            peers: Mutex::new(None),
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

    /// One heartbeat: renews this replica's entry and reads the live ones.
    async fn beat(&self, backend: &Backend) {
        let ttl_us = ENTRY_TTL.as_micros() as u64;
        let call = backend.register(&self.key, &self.id, ttl_us);
        // Bounded, so a pool without timeouts cannot stop the heartbeat.
        let Ok(answer) = tokio::time::timeout(HEARTBEAT, call).await else {
            return;
        };
        match answer {
            Ok(mut ids) => {
                if !ids.contains(&self.id) {
                    ids.push(self.id.clone());
                }
                ids.sort();
                *self.peers.lock().unwrap_or_else(PoisonError::into_inner) = Some(ids.into());
            }
            Err(err) => tracing::debug!(error = ?err, "registry heartbeat failed"),
        }
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

/// Every [`HEARTBEAT`]: renews this replica's entry and reads the others',
/// and confirms the scope's configuration record, which puts it back
/// within a heartbeat when Redis lost it (see `agreement.rs`).
async fn heartbeat(
    registry: Weak<Registry>,
    backend: Weak<Backend>,
    lifecycle: Arc<Lifecycle>,
    agreement: Weak<Agreement>,
) {
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
        tokio::time::sleep(HEARTBEAT).await;
    }
}

/// The replica that serves `host` during an outage: the highest score of
/// SHA-256 over (replica, host), so every replica that saw the same
/// registry picks the same one, and a replica leaving moves only its hosts.
fn owner<'a>(peers: &'a [String], host: &HostKey) -> Option<&'a str> {
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

/// The outage plan a `FallbackLimiter` asks: this replica's registry and
/// its limiter's settings.
pub(super) struct RegistryPlan {
    pub(super) registry: Arc<Registry>,
    pub(super) settings: Arc<Settings>,
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
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn without_a_registry_a_replica_shares_among_those_expected() {
        let key = HostKey::parse("http://a.test/").unwrap();
        let roster = Roster {
            peers: None,
            me: "me",
            expected: 4,
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
}

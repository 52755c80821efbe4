//! Per-host rules and keying through Redis: each host paced by its own
//! rule across replicas (standalone and Cluster), hosts of one registrable
//! domain paced as one, and replicas with other rules refused; judged from
//! what the recording upstream saw.

use std::sync::Arc;
use std::time::Duration;

use redislimit::{Error, KeyBy, Limiter, Pacing, Policies, RedisPool, RedisTimeouts, Rule};
use redislimit_tests::record::{Request, assert_serialized, max_in_flight, min_send_gap};
use redislimit_tests::{RedisCluster, RedisServer};

use crate::agreement::assert_mismatch;
use crate::modes::SLACK;
use crate::{MS, drive_all, host, limiter, standalone};

fn gap(d: Duration) -> Pacing {
    Pacing::builder().min_delay(d).build().unwrap()
}

/// The default: serialized, 5 ms. `a.test`: serialized, 60 ms.
/// `*.b.test`: two in flight across the replicas, sends 30 ms apart.
fn rules() -> Policies {
    Policies::new(gap(5 * MS))
        .with_rule(Rule::new("a.test", gap(60 * MS)))
        .unwrap()
        .with_rule(
            Rule::new(
                "*.b.test",
                Pacing::builder()
                    .min_delay(30 * MS)
                    .max_concurrent(2)
                    .build()
                    .unwrap(),
            )
            .with_cluster_concurrency(2),
        )
        .unwrap()
}

async fn each_host_by_its_own_rule(pool: impl Fn() -> RedisPool) {
    let replicas: Vec<Arc<dyn Limiter>> = (0..2)
        .map(|_| Arc::new(limiter(pool(), |p| p, |b| b.policies(rules()))) as Arc<dyn Limiter>)
        .collect();
    let hosts = ["a.test", "x.b.test", "b.test", "c.test"];
    let rec = drive_all(&replicas, &hosts, 4, 4, 20 * MS).await;
    let a = rec.host("a.test");
    assert_eq!(a.len(), 8);
    assert_serialized(&a, 60 * MS);
    // The suffix rule: lease mode, at most 2 in flight, sends 30 ms apart.
    let xb = rec.host("x.b.test");
    assert_eq!(xb.len(), 8);
    assert!(max_in_flight(&xb) <= 2, "x.b.test: {}", max_in_flight(&xb));
    let spacing = min_send_gap(&xb);
    assert!(
        spacing + SLACK >= 30 * MS,
        "x.b.test sends {spacing:?} apart"
    );
    // The apex and other hosts: the default, serialized at 5 ms, so far
    // quicker than a.test's rule.
    for name in ["b.test", "c.test"] {
        let reqs = rec.host(name);
        let gap = assert_serialized(&reqs, 5 * MS);
        assert!(gap < 60 * MS, "{name} was paced like a.test: {gap:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_host_is_paced_by_its_own_rule_across_replicas() {
    let server = RedisServer::start();
    each_host_by_its_own_rule(|| standalone(&server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_host_is_paced_by_its_own_rule_through_a_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    each_host_by_its_own_rule(|| {
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        RedisPool::cluster(&urls, RedisTimeouts::default()).unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_of_one_registrable_domain_share_one_pace_across_replicas() {
    let server = RedisServer::start();
    let by_domain = || Policies::new(gap(40 * MS)).with_key_by(KeyBy::RegistrableDomain);
    let replicas: Vec<Arc<dyn Limiter>> = (0..2)
        .map(|_| {
            Arc::new(limiter(
                standalone(&server.url()),
                |p| p,
                |b| b.policies(by_domain()),
            )) as Arc<dyn Limiter>
        })
        .collect();
    let hosts = ["a.example.co.uk", "b.example.co.uk"];
    let rec = drive_all(&replicas, &hosts, 2, 4, 10 * MS).await;
    let mut both: Vec<Request> = rec.host(hosts[0]);
    both.extend(rec.host(hosts[1]));
    both.sort_by_key(|r| r.send);
    assert_eq!(both.len(), 16);
    assert!(both.iter().any(|r| r.host == hosts[0]) && both.iter().any(|r| r.host == hosts[1]));
    // One pace for the two: never overlapping, 40 ms after each end.
    assert_serialized(&both, 40 * MS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_other_rules_are_refused() {
    let server = RedisServer::start();
    let with =
        |policies: Policies| limiter(standalone(&server.url()), |p| p, |b| b.policies(policies));
    let first = with(rules());
    drop(first.acquire_host("t", host("c.test"), None).await.unwrap());
    let record = first.config_record().to_owned();
    assert!(record.contains(" rules=2:"), "{record}");
    let other_gap = Policies::new(gap(5 * MS))
        .with_rule(Rule::new("a.test", gap(61 * MS)))
        .unwrap()
        .with_rule(Rule::new("*.b.test", gap(30 * MS)).with_cluster_concurrency(2))
        .unwrap();
    let cases = [
        (other_gap, " rules=2:"),
        (Policies::new(gap(5 * MS)), "lease_ttl=30s"),
        (
            // Keyed by domain, rules may not mix serialized and lease
            // modes: the same rules without the lease one.
            Policies::new(gap(5 * MS))
                .with_rule(Rule::new("a.test", gap(60 * MS)))
                .unwrap()
                .with_key_by(KeyBy::RegistrableDomain),
            "key_by=domain",
        ),
    ];
    for (policies, ours) in cases {
        let other = with(policies);
        assert_ne!(other.config_record(), record);
        let acquired = other.acquire_host("t", host("c.test"), None).await;
        assert_mismatch(acquired.map(drop), ours, " rules=2:");
    }
    // The same rules agree.
    let same = with(rules());
    drop(same.acquire_host("t", host("c.test"), None).await.unwrap());
}

/// `snapshot()` and `max_queued` through Redis and its fallback: this
/// process's queue and permits, paced through Redis; a waiter beyond the
/// bound refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_bounded_queues_through_redis() {
    let server = RedisServer::start();
    let limiter = Arc::new(
        limiter(
            standalone(&server.url()),
            |p| p.min_delay(10 * MS).max_queued(2),
            |b| b,
        )
        .with_fallback(),
    );
    let held = limiter
        .acquire_host("t", host("a.test"), None)
        .await
        .unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                drop(
                    limiter
                        .acquire_host("t", host("a.test"), None)
                        .await
                        .unwrap(),
                );
            })
        })
        .collect();
    tokio::time::sleep(100 * MS).await;
    let snapshot = limiter.snapshot(5);
    let a = snapshot.host(&host("a.test")).expect("a.test is busy");
    assert_eq!((a.queued, a.in_flight), (2, 1), "{snapshot:?}");
    assert_eq!(a.paced_by, redislimit::snapshot::PacedBy::Shared);
    assert_eq!((snapshot.queued, snapshot.in_flight), (2, 1));
    assert!(matches!(
        limiter.acquire_host("t", host("a.test"), None).await,
        Err(Error::QueueFull {
            queued: 2,
            max: 2,
            ..
        })
    ));
    drop(held);
    for w in waiters {
        crate::bounded(10, w).await.unwrap();
    }
    let idle = limiter.snapshot(5);
    assert_eq!((idle.queued, idle.in_flight), (0, 0), "{idle:?}");
}

/// Redis killed mid-run: the fallback keeps each host's own rule (judged
/// at the recorded sends), not the default for all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_dead_each_host_keeps_its_rule_in_process() {
    let server = RedisServer::start();
    let limiter: Arc<dyn Limiter> = Arc::new(
        limiter(
            standalone(&server.url()),
            |p| p,
            |b| b.policies(rules()).lease_ttl(Duration::from_secs(2)),
        )
        .with_fallback(),
    );
    drop(
        limiter
            .acquire_host("t", host("warm.test"), None)
            .await
            .unwrap(),
    );
    server.kill();
    let rec = drive_all(&[limiter], &["a.test", "c.test"], 2, 6, 10 * MS).await;
    let a = rec.host("a.test");
    assert_eq!(a.len(), 6);
    assert_serialized(&a, 60 * MS);
    let c = rec.host("c.test");
    let gap = assert_serialized(&c, 5 * MS);
    assert!(gap < 60 * MS, "c.test was paced like a.test: {gap:?}");
}

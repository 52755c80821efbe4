//! The same limiter through a real 3-master Redis Cluster and through
//! Sentinel, including a failover mid-run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redislimit::{Limiter, RedisLimiter, RedisPool, RedisTimeouts};
use redislimit_tests::record::{assert_serialized, max_in_flight, min_send_gap};
use redislimit_tests::{RedisCluster, RedisSentinel};

use crate::modes::SLACK;
use crate::{MS, bounded, drive_all, host, limiter};

/// Host names whose keys land on different masters.
const HOSTS: [&str; 6] = ["a.test", "b.test", "c.test", "d.test", "e.test", "f.test"];

fn cluster_pool(cluster: &RedisCluster) -> RedisPool {
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisPool::cluster(&urls, RedisTimeouts::default()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_serialized_mode_keeps_invariant_1() {
    let cluster = RedisCluster::start();
    let gap = 5 * MS;
    let replicas: Vec<Arc<dyn Limiter>> = (0..3)
        .map(|_| {
            Arc::new(limiter(
                cluster_pool(&cluster),
                |p| p.max_concurrent(2).min_delay(gap),
                |b| b,
            )) as Arc<dyn Limiter>
        })
        .collect();
    let rec = drive_all(&replicas, &HOSTS, 3, 6, 20 * MS).await;
    for name in HOSTS {
        let reqs = rec.host(name);
        assert_eq!(reqs.len(), 9, "{name}");
        assert_serialized(&reqs, gap);
    }
    // The keys really are spread over the masters.
    let populated = cluster
        .nodes()
        .iter()
        .filter(|n| n.command(&["DBSIZE"]).trim() != ":0")
        .count();
    assert!(populated >= 2, "all hosts' keys landed on one master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_lease_mode_keeps_invariant_2() {
    let cluster = RedisCluster::start();
    let spacing = 15 * MS;
    let replicas: Vec<Arc<dyn Limiter>> = (0..3)
        .map(|_| {
            Arc::new(limiter(
                cluster_pool(&cluster),
                |p| p.min_delay(spacing),
                |b| {
                    b.cluster_concurrency(2)
                        .tuning(redislimit::Tuning::default().with_concurrency_retry(5 * MS))
                },
            )) as Arc<dyn Limiter>
        })
        .collect();
    let rec = drive_all(&replicas, &HOSTS[..3], 2, 6, 30 * MS).await;
    for name in &HOSTS[..3] {
        let reqs = rec.host(name);
        assert!(max_in_flight(&reqs) <= 2, "{name}");
        let gap = min_send_gap(&reqs);
        assert!(gap + SLACK >= spacing, "{name}: sends {gap:?} apart");
    }
}

fn sentinel_limiter(set: &RedisSentinel) -> RedisLimiter {
    let url = set.sentinel().url();
    let pool =
        RedisPool::sentinel(&[url.as_str()], set.master_name(), RedisTimeouts::default()).unwrap();
    limiter(
        pool,
        |p| p.min_delay(10 * MS),
        |b| b.lease_ttl(Duration::from_secs(2)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_paces_and_survives_a_failover() {
    let set = RedisSentinel::start();
    let replicas: Vec<Arc<dyn Limiter>> = (0..2)
        .map(|_| Arc::new(sentinel_limiter(&set)) as Arc<dyn Limiter>)
        .collect();
    let rec = drive_all(&replicas, &["a.test"], 2, 4, 30 * MS).await;
    assert_serialized(&rec.host("a.test"), 10 * MS);

    let plain = sentinel_limiter(&set);
    let fallback = sentinel_limiter(&set).with_fallback();
    drop(plain.acquire_host("t", host("b.test"), None).await.unwrap());
    let old_master = set.master_addr().unwrap();
    set.sentinel()
        .command(&["SENTINEL", "FAILOVER", set.master_name()]);
    // Whatever happens during the failover, the fallback keeps admitting.
    let mut new_master = None;
    for _ in 0..100 {
        drop(
            bounded(10, fallback.acquire_host("t", host("c.test"), None))
                .await
                .unwrap(),
        );
        match set.master_addr() {
            Some(addr) if addr != old_master => {
                new_master = Some(addr);
                break;
            }
            _ => tokio::time::sleep(100 * MS).await,
        }
    }
    let new_master = new_master.expect("the failover never happened");
    // The pooled connection still points at the old master, now a replica
    // answering READONLY; the limiter must drop it and find the new master.
    let mut recovered = false;
    for _ in 0..100 {
        if let Ok(p) = bounded(10, plain.acquire_host("t", host("d.test"), None)).await {
            drop(p);
            recovered = true;
            break;
        }
        tokio::time::sleep(100 * MS).await;
    }
    assert!(
        recovered,
        "never recovered after the failover to {new_master}"
    );
    drop(
        bounded(10, fallback.acquire_host("t", host("e.test"), None))
            .await
            .unwrap(),
    );
}

/// Invariants 3-5 on the Cluster: the quota window, a penalty seen by
/// every replica, and a dropped acquire that books nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_quota_penalty_and_cancellation() {
    use redislimit_tests::record::max_in_window;

    let cluster = RedisCluster::start();
    let window = 300 * MS;
    let replicas: Vec<Arc<dyn Limiter>> = (0..3)
        .map(|_| {
            Arc::new(limiter(
                cluster_pool(&cluster),
                |p| p.max_concurrent(8).quota(3).window(window),
                |b| b.cluster_concurrency(8),
            )) as Arc<dyn Limiter>
        })
        .collect();
    let rec = drive_all(&replicas, &HOSTS[..2], 2, 4, 2 * MS).await;
    for name in &HOSTS[..2] {
        let reqs = rec.host(name);
        assert_eq!(reqs.len(), 12);
        assert!(
            max_in_window(&reqs, window - SLACK) <= 3,
            "{name}: quota broken on the Cluster"
        );
    }

    // A penalty from one replica holds the host for the others.
    let before = std::time::Instant::now();
    replicas[0]
        .penalize_host(host("c.test"), 500 * MS)
        .await
        .unwrap();
    drop(
        bounded(10, replicas[1].acquire_host("t", host("c.test"), None))
            .await
            .unwrap(),
    );
    assert!(
        before.elapsed() >= 500 * MS,
        "admitted {:?} into a 500 ms penalty",
        before.elapsed()
    );

    // Dropped acquires, some mid-call: nothing stays booked.
    let serialized = limiter(
        cluster_pool(&cluster),
        |p| p,
        // Other settings than the replicas above: another key space.
        |b| b.lease_ttl(Duration::from_secs(30)).prefix("serialized"),
    );
    for _ in 0..20 {
        let _ = tokio::time::timeout(
            Duration::ZERO,
            serialized.acquire_host("t", host("d.test"), None),
        )
        .await;
    }
    tokio::time::sleep(100 * MS).await;
    let soon = Some(tokio::time::Instant::now() + 500 * MS);
    let p = serialized.acquire_host("t", host("d.test"), soon).await;
    assert!(p.is_ok(), "a dropped acquire left d.test booked: {p:?}");
}

/// Regression: one circuit for the whole limiter sent every host to the
/// fallback when one Cluster master died, so hosts on the healthy masters
/// dropped to their outage share (half the rate with two replicas). Each
/// master now has a circuit of its own: with one master killed (and the
/// cluster serving the slots it still covers), a host on a healthy master
/// keeps its whole rate through Redis, and its gap, while a host on the
/// dead master carries on in the fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_sends_only_its_own_hosts_to_the_fallback() {
    use redislimit::{Error, FallbackPolicy};
    use redislimit_tests::keys::HostKeys;
    use redislimit_tests::record::{Recorder, max_in_window};

    let cluster = RedisCluster::start();
    for node in cluster.nodes() {
        node.query(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
    }
    let gap = 100 * MS;
    let name_on = |pick: &dyn Fn(u16) -> bool| {
        (0..200)
            .map(|i| format!("h{i}.nodes.test"))
            .find(|name| pick(cluster.key_slot(&HostKeys::of("test", name).gate)))
            .expect("a host in 200")
    };
    let dead_host = name_on(&|_| true);
    let dead_master = cluster.master_of(&HostKeys::of("test", &dead_host).gate);
    let healthy_host = name_on(&|slot| !std::ptr::eq(cluster.master_of_slot(slot), dead_master));
    let replicas: Vec<_> = (0..2)
        .map(|_| {
            Arc::new(
                limiter(
                    cluster_pool(&cluster),
                    |p| p.min_delay(gap),
                    |b| {
                        b.cluster_concurrency(2)
                            .fallback_policy(FallbackPolicy::Share)
                    },
                )
                .with_fallback(),
            )
        })
        .collect();
    // Registered, and the slot map read (both from the heartbeat).
    for l in &replicas {
        for name in [&dead_host, &healthy_host] {
            drop(
                bounded(5, l.acquire_host("t", host(name), None))
                    .await
                    .unwrap(),
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let recorder = Arc::new(Recorder::new());
    dead_master.kill();
    let killed = Instant::now();
    let stop = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut tasks = Vec::new();
    for (replica, l) in replicas.iter().enumerate() {
        for name in [&dead_host, &healthy_host, &healthy_host] {
            let (l, recorder, name) = (Arc::clone(l), Arc::clone(&recorder), name.clone());
            tasks.push(tokio::spawn(async move {
                while tokio::time::Instant::now() < stop {
                    match l.acquire_host("t", host(&name), Some(stop)).await {
                        Ok(permit) => {
                            let send = Instant::now();
                            tokio::time::sleep(10 * MS).await;
                            recorder.record(&name, replica, send, Instant::now());
                            drop(permit);
                        }
                        // Refused at once: a moment before the next try,
                        // so as not to spin a worker.
                        Err(Error::WaitBudget { .. }) => tokio::time::sleep(MS).await,
                        Err(err) => panic!("{name}: {err:?}"),
                    }
                }
            }));
        }
    }
    for task in tasks {
        bounded(30, task).await.unwrap();
    }
    // From once the first calls to the dead master have timed out.
    let since = killed + Duration::from_millis(1500);
    let healthy: Vec<_> = recorder
        .host(&healthy_host)
        .into_iter()
        .filter(|r| r.send >= since)
        .collect();
    let window = Duration::from_millis(3400);
    let whole = (window.as_micros() / gap.as_micros()) as usize;
    assert!(
        healthy.len() * 10 >= whole * 8,
        "{} sends to a host on a healthy master in {window:?}; its whole rate is {whole}",
        healthy.len()
    );
    let peak = max_in_window(&healthy, Duration::from_secs(1) - 5 * MS);
    assert!(peak <= 11, "{peak} sends in 1 s at a 100 ms gap");
    // Through Redis all along: every gap kept (going back and forth between
    // Redis and the outage's turns, replicas sent closer than that).
    let closest = min_send_gap(&healthy);
    assert!(closest + 5 * MS >= gap, "two sends {closest:?} apart");
    assert!(
        recorder.host(&dead_host).iter().any(|r| r.send >= since),
        "the dead master's host was not served by the fallback"
    );
}

//! Garbage in the limiter's keys: replaced by fresh state within one
//! `lease_ttl` (reported), never a panic, never a host stuck forever.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redislimit::{Hooks, Limiter};
use redislimit_tests::RedisServer;
use redislimit_tests::keys::HostKeys;

use crate::{MS, bounded, host, limiter, standalone};

const LEASE: Duration = Duration::from_millis(300);

/// Records the keys reported as repaired.
#[derive(Debug, Default)]
struct Repairs(Mutex<Vec<String>>);

impl Hooks for Repairs {
    fn on_repair(&self, key: &str) {
        self.0.lock().unwrap().push(key.to_owned());
    }
}

/// Regression: `SET <leases-key> garbage` (or any state of the wrong type
/// or unparseable) made the host `Unavailable` forever, and through the
/// fallback paced N times too fast, until someone deleted the key by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_the_keys_is_replaced_within_one_lease() {
    let server = RedisServer::start();
    for cap in [0u32, 2] {
        let repairs = Arc::new(Repairs::default());
        let l = limiter(
            standalone(&server.url()),
            |p| p.min_delay(10 * MS).quota(5).window(1000 * MS),
            // One key space per mode: replicas of one scope must agree.
            |b| {
                b.cluster_concurrency(cap)
                    .lease_ttl(LEASE)
                    .prefix(format!("cap{cap}"))
                    .hooks(repairs.clone())
            },
        );
        let keys = HostKeys::with_prefix(&format!("cap{cap}"), "test", "a.test");
        let corruptions: Vec<Vec<&str>> = vec![
            vec!["SET", &keys.gate, "not a hash"],
            vec!["HSET", &keys.gate, "next", "soon"],
            vec!["HSET", &keys.gate, "next", "inf"],
            vec!["HSET", &keys.gate, "next", "nan"],
            vec!["HSET", &keys.gate, "busy", "-"],
            vec!["SET", &keys.leases, "not a zset"],
            vec!["LPUSH", &keys.admits, "not a zset"],
            vec!["SET", &keys.void, "not a zset"],
        ];
        for corruption in corruptions {
            // A serialized limiter never reads the leases key.
            if cap == 0 && corruption[1] == keys.leases {
                continue;
            }
            server.command(&["DEL", &keys.gate, &keys.leases, &keys.admits, &keys.void]);
            server.command(&corruption);
            repairs.0.lock().unwrap().clear();
            let start = Instant::now();
            let permit = bounded(5, l.acquire_host("t", host("a.test"), None))
                .await
                .unwrap_or_else(|e| panic!("cap {cap}, {corruption:?}: {e:?}"));
            let waited = start.elapsed();
            // Held for one lease (whatever the garbage stood for has lapsed),
            // then admitted from fresh state.
            assert!(
                waited + 10 * MS >= LEASE && waited < 4 * LEASE,
                "cap {cap}, {corruption:?}: admitted after {waited:?}"
            );
            assert_eq!(
                repairs.0.lock().unwrap().as_slice(),
                std::slice::from_ref(&keys.gate),
                "cap {cap}, {corruption:?}: the repair was not reported once"
            );
            drop(permit);
            // Paced from fresh state: the next request keeps min_delay, and
            // a penalty is honoured.
            tokio::time::sleep(50 * MS).await;
            // Stamped before the call: the hold starts when Redis runs it,
            // after this (stamped after the reply, a busy machine made the
            // hold look 10 ms short).
            let held = Instant::now();
            bounded(5, l.penalize_host(host("a.test"), 200 * MS))
                .await
                .unwrap();
            drop(
                bounded(5, l.acquire_host("t", host("a.test"), None))
                    .await
                    .unwrap(),
            );
            assert!(
                held.elapsed() + 10 * MS >= 200 * MS,
                "cap {cap}: the penalty was lost"
            );
            // Its release lands before the next corruption (a late one
            // would meet that garbage and replace it, unreported).
            tokio::time::sleep(50 * MS).await;
        }
    }
}

/// A penalty, a release and a renewal that meet garbage replace it too,
/// and never fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_heals_what_it_meets() {
    let server = RedisServer::start();
    let l = limiter(
        standalone(&server.url()),
        |p| p.min_delay(10 * MS),
        |b| b.cluster_concurrency(1).lease_ttl(LEASE),
    );
    let keys = HostKeys::of("test", "b.test");
    server.command(&["SET", &keys.gate, "garbage"]);
    bounded(5, l.penalize_host(host("b.test"), 10 * MS))
        .await
        .unwrap();
    let held = bounded(5, l.acquire_host("t", host("b.test"), None))
        .await
        .unwrap();
    // Garbage while the permit is held: the renewal and the release meet it.
    server.command(&["SET", &keys.leases, "garbage"]);
    tokio::time::sleep(LEASE).await;
    drop(held);
    tokio::time::sleep(100 * MS).await;
    let start = Instant::now();
    drop(
        bounded(5, l.acquire_host("t", host("b.test"), None))
            .await
            .unwrap(),
    );
    assert!(start.elapsed() < 4 * LEASE);

    // Garbage met by the release alone (a lease-mode release is a plain
    // `ZREM`, which the server refuses on a string): the release replaces
    // it, as the script does, instead of failing until the lease lapses.
    tokio::time::sleep(100 * MS).await;
    let held = bounded(5, l.acquire_host("t", host("b.test"), None))
        .await
        .unwrap();
    server.command(&["SET", &keys.leases, "garbage"]);
    drop(held);
    tokio::time::sleep(100 * MS).await;
    assert_eq!(
        server.command(&["TYPE", &keys.leases]).trim(),
        "+none",
        "the release left the garbage in place"
    );
}

/// A bucketed quota's state (large quotas) that does not parse is replaced
/// like any other garbage: reported once, the host held for one lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_a_bucketed_quota_is_replaced_within_one_lease() {
    let server = RedisServer::start();
    let repairs = Arc::new(Repairs::default());
    let l = limiter(
        standalone(&server.url()),
        |p| p.max_concurrent(4).quota(100).window(1000 * MS),
        |b| {
            b.cluster_concurrency(4)
                .lease_ttl(LEASE)
                .hooks(repairs.clone())
        },
    );
    let keys = HostKeys::of("test", "a.test");
    drop(
        bounded(5, l.acquire_host("t", host("a.test"), None))
            .await
            .unwrap(),
    );
    tokio::time::sleep(50 * MS).await; // its release lands
    assert_eq!(server.command(&["TYPE", &keys.admits]).trim(), "+hash");
    server.command(&["HSET", &keys.admits, "12", "not a bucket"]);
    let start = Instant::now();
    let permit = bounded(5, l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    let waited = start.elapsed();
    assert!(
        waited + 10 * MS >= LEASE && waited < 4 * LEASE,
        "admitted after {waited:?}"
    );
    assert_eq!(
        repairs.0.lock().unwrap().as_slice(),
        std::slice::from_ref(&keys.gate)
    );
    drop(permit);
}

/// Garbage in the registry (its entries, or when each was added) is
/// replaced at the next heartbeat; a replica that leaves is taken out, its
/// departure kept while a replica cut off could still count it (a lapsed
/// entry's keep: 2.5 s at the least), then dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_the_registry_is_replaced_and_a_leaver_is_forgotten() {
    let server = RedisServer::start();
    let (replicas, joined) = redislimit_tests::keys::registry("test");
    server.command(&["SET", &replicas, "not a zset"]);
    server.command(&["SET", &joined, "not a hash"]);
    let make = || {
        limiter(
            standalone(&server.url()),
            |p| p.min_delay(10 * MS),
            |b| b.lease_ttl(Duration::from_secs(2)),
        )
    };
    let (a, b) = (make(), make());
    for l in [&a, &b] {
        drop(
            bounded(5, l.acquire_host("t", host("a.test"), None))
                .await
                .unwrap(),
        );
    }
    let count = |what: &str, key: &str| server.command(&[what, key]).trim().to_owned();
    // Two heartbeats each.
    tokio::time::sleep(1100 * MS).await;
    assert_eq!(count("TYPE", &replicas), "+zset");
    assert_eq!(count("TYPE", &joined), "+hash");
    assert_eq!(count("ZCARD", &replicas), ":2");
    assert_eq!(count("HLEN", &joined), ":2");
    bounded(5, b.close(None)).await.unwrap();
    assert_eq!(count("ZCARD", &replicas), ":1");
    let values = server.command(&["HVALS", &joined]);
    let departed = |v: &str| {
        v.split_once(' ')
            .is_some_and(|(at, left)| at.parse::<u64>().is_ok() && left.parse::<u64>().is_ok())
    };
    assert_eq!(
        values.lines().filter(|v| departed(v.trim())).count(),
        1,
        "one departure kept: {values}"
    );
    tokio::time::sleep(3100 * MS).await;
    assert_eq!(count("HLEN", &joined), ":1");
    drop(a);
}

//! Lease renewal through a stalled connection: a blip shorter than half the
//! lease never lets another replica take a slot whose permit is held.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redislimit::{Limiter, RedisPool, RedisTimeouts};
use redislimit_tests::record::Recorder;
use redislimit_tests::{RedisServer, StallProxy};

use crate::{MS, bounded, host, limiter, standalone};

const LEASE: Duration = Duration::from_millis(1200);

/// Quick timeouts for the replica behind the proxy, so that its renewal
/// fails (rather than merely arrives late) while the stall lasts.
fn quick(url: &str) -> RedisPool {
    RedisPool::standalone(
        url,
        RedisTimeouts {
            connect: 150 * MS,
            response: 150 * MS,
            pool_wait: 300 * MS,
            ..RedisTimeouts::default()
        },
    )
    .unwrap()
}

/// Replica A (behind the proxy) holds a permit on each of five cap-1 hosts
/// for longer than the lease while replica B (direct) asks for the same
/// hosts; A's connection stalls for 500 ms (less than `LEASE / 2`) around
/// its first renewal. Four rounds: 20 tries. B must never be admitted
/// while A holds the host, as the record of both shows.
async fn a_stall_keeps_the_lease(cap: u32) {
    let server = RedisServer::start();
    let proxy = StallProxy::start(server.addr()).await;
    let configure =
        |b: redislimit::redis::RedisLimiterBuilder| b.cluster_concurrency(cap).lease_ttl(LEASE);
    let a = Arc::new(limiter(
        quick(&proxy.url()),
        |p| p.min_delay(10 * MS),
        configure,
    ));
    let b = Arc::new(limiter(
        standalone(&server.url()),
        |p| p.min_delay(10 * MS),
        configure,
    ));
    let recorder = Arc::new(Recorder::new());
    for round in 0..4 {
        let names: Vec<String> = (0..5).map(|i| format!("r{round}h{i}.test")).collect();
        let mut held = Vec::new();
        for name in &names {
            let permit = bounded(5, a.acquire_host("a", host(name), None))
                .await
                .unwrap();
            held.push((name.clone(), Instant::now(), permit));
        }
        let waiting: Vec<_> = names
            .iter()
            .map(|name| {
                let (b, recorder, name) = (Arc::clone(&b), Arc::clone(&recorder), name.clone());
                tokio::spawn(async move {
                    let permit = bounded(10, b.acquire_host("b", host(&name), None))
                        .await
                        .unwrap();
                    let send = Instant::now();
                    recorder.record(&name, 1, send, send);
                    drop(permit);
                })
            })
            .collect();
        tokio::time::sleep(500 * MS).await;
        proxy.stall();
        tokio::time::sleep(500 * MS).await;
        proxy.resume();
        tokio::time::sleep(LEASE).await;
        for (name, send, permit) in held {
            let end = Instant::now();
            drop(permit);
            recorder.record(&name, 0, send, end);
        }
        for w in waiting {
            bounded(10, w).await.unwrap();
        }
        for name in &names {
            let seen = recorder.host(name);
            assert_eq!(seen.len(), 2, "{name}: {seen:?}");
            let (held, taken) = (&seen[0], &seen[1]);
            assert_eq!((held.replica, taken.replica), (0, 1), "{name}: {seen:?}");
            assert!(
                taken.send >= held.end,
                "{name}: replica B was admitted {:?} before replica A released \
                 (round {round}, mode cap {cap})",
                held.end - taken.send
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shorter_than_half_the_lease_keeps_a_lease_mode_slot() {
    a_stall_keeps_the_lease(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shorter_than_half_the_lease_keeps_a_serialized_host() {
    a_stall_keeps_the_lease(0).await;
}

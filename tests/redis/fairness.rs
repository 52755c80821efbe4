//! The waiting line across replicas: replicas saturating one host take
//! turns, judged from the order of the sends, and a waiter that gives up
//! leaves the line at once instead of holding up the waiters behind it.

use std::sync::Arc;
use std::time::Duration;

use redislimit::Limiter;
use redislimit_tests::RedisServer;
use redislimit_tests::keys::HostKeys;
use redislimit_tests::record::{Request, assert_serialized, min_send_gap};
use redislimit_tests::resp::Reply;

use crate::modes::SLACK;
use crate::{MS, bounded, drive_all, host, limiter, standalone};

const REPLICAS: usize = 3;
const TASKS: usize = 4;
const PER_TASK: usize = 5;

/// The longest run of consecutive sends from one replica, among the sends
/// before the first replica's last one (after it, the others have the host
/// to themselves and take it in turns of their own).
fn longest_run(sends: &[Request]) -> usize {
    let first_done = (0..REPLICAS)
        .map(|r| sends.iter().rposition(|s| s.replica == r).unwrap())
        .min()
        .unwrap();
    let mut longest = 0;
    let mut run = 0;
    for (i, s) in sends[..=first_done].iter().enumerate() {
        run = if i > 0 && sends[i - 1].replica == s.replica {
            run + 1
        } else {
            1
        };
        longest = longest.max(run);
    }
    longest
}

fn order(sends: &[Request]) -> String {
    sends.iter().map(|s| s.replica.to_string()).collect()
}

/// `REPLICAS` replicas of `TASKS` tasks each saturate one host, paced with
/// `min_delay` (and `cap` in flight, 0: serialized), each request holding
/// its permit for `work`; the sends in order, after checking that none
/// came in a run of more than two from one replica while others waited.
async fn saturate(min_delay: Duration, cap: u32, work: Duration) -> Vec<Request> {
    let server = RedisServer::start();
    let replicas: Vec<Arc<dyn Limiter>> = (0..REPLICAS)
        .map(|_| {
            Arc::new(limiter(
                standalone(&server.url()),
                |p| p.min_delay(min_delay).max_concurrent(TASKS as u32),
                |b| b.cluster_concurrency(cap),
            )) as Arc<dyn Limiter>
        })
        .collect();
    let recorder = drive_all(&replicas, &["fair.test"], TASKS, PER_TASK, work).await;
    let sends = recorder.host("fair.test");
    assert_eq!(sends.len(), REPLICAS * TASKS * PER_TASK);
    let run = longest_run(&sends);
    assert!(
        run <= 2,
        "one replica sent {run} in a row while the others waited: {}",
        order(&sends)
    );
    sends
}

/// Without the line, a replica whose own release lands first wakes its
/// next waiter at once, while the others ask again on their retry: it was
/// seen keeping the host until its queue was empty (runs of 6 and more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_saturating_a_serialized_host_take_turns() {
    let sends = saturate(5 * MS, 0, 5 * MS).await;
    assert_serialized(&sends, 5 * MS - SLACK);
}

/// Lease mode with a gap: each waiter ahead takes a slot of its own, and
/// the replicas take turns at them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_saturating_a_host_in_lease_mode_take_turns() {
    let sends = saturate(8 * MS, 2, 12 * MS).await;
    let gap = min_send_gap(&sends);
    assert!(gap + SLACK >= 8 * MS, "sends {gap:?} apart");
}

/// A waiter at the head of the line that gives up (its caller's timeout)
/// leaves the line: the waiter behind it, on another replica, is admitted
/// once the host's gap allows, not after the place of the one that left
/// lapses (five seconds here, its retry interval and slack).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_line() {
    let server = RedisServer::start();
    let make = |retry: Duration| {
        limiter(
            standalone(&server.url()),
            |p| p.min_delay(300 * MS),
            move |b| {
                b.cluster_concurrency(10)
                    .tuning(redislimit::Tuning::default().with_concurrency_retry(retry))
            },
        )
    };
    let (a, b, c) = (
        make(Duration::from_millis(50)),
        make(Duration::from_secs(5)),
        make(Duration::from_millis(50)),
    );
    let h = host("line.test");
    let keys = HostKeys::of("test", h.as_str());
    let first = a.acquire_host("t", h.clone(), None).await.unwrap();
    // B asks next and waits at the head of the line, C behind it.
    let b_waits = tokio::spawn({
        let (b, h) = (b.clone(), h.clone());
        async move { b.acquire_host("t", h, None).await }
    });
    let waiting = || match server.query(&["HLEN", &keys.waiting]) {
        Reply::Integer(n) => n,
        other => panic!("HLEN: {other:?}"),
    };
    bounded(5, async {
        while waiting() < 1 {
            tokio::time::sleep(MS).await;
        }
    })
    .await;
    let c_waits = tokio::spawn({
        let (c, h) = (c.clone(), h.clone());
        async move { c.acquire_host("t", h, None).await }
    });
    bounded(5, async {
        while waiting() < 2 {
            tokio::time::sleep(MS).await;
        }
    })
    .await;
    // B's caller gives up.
    b_waits.abort();
    assert!(b_waits.await.unwrap_err().is_cancelled());
    drop(first);
    // Well within B's five seconds of patience.
    let admitted = bounded(2, c_waits).await.unwrap();
    assert!(admitted.is_ok(), "{admitted:?}");
    assert_eq!(waiting(), 0, "the line is empty once C is admitted");
}

/// Keyed by registrable domain, hosts of one domain share one state but
/// wait in lines of their own rules: a request that waits for its rule's
/// quota (ten seconds here) does not hold back a host of the same domain
/// whose rule has no quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_of_one_domain_under_other_rules_do_not_wait_behind_each_other() {
    let server = RedisServer::start();
    let policies = || {
        redislimit::Policies::new(
            redislimit::Pacing::builder()
                .min_delay(20 * MS)
                .build()
                .unwrap(),
        )
        .with_rule(redislimit::Rule::new(
            "api.lane.com",
            redislimit::Pacing::builder()
                .min_delay(20 * MS)
                .quota(1)
                .window(Duration::from_secs(10))
                .build()
                .unwrap(),
        ))
        .unwrap()
        .with_key_by(redislimit::KeyBy::RegistrableDomain)
    };
    let make = || {
        limiter(
            standalone(&server.url()),
            |p| p,
            |b| b.policies(policies()).cluster_concurrency(4),
        )
    };
    let (a, b) = (make(), make());
    drop(
        a.acquire_host("t", host("api.lane.com"), None)
            .await
            .unwrap(),
    );
    // The quota is spent: the next api request waits ten seconds, in line.
    let api = host("api.lane.com");
    let api_waits = tokio::spawn({
        let a = a.clone();
        async move { a.acquire_host("t", api, None).await }
    });
    // Keyed by domain, each rule's requests wait in a line of their own.
    let keys = HostKeys::of("test", "lane.com").in_lane("api.lane.com");
    bounded(5, async {
        while server.query(&["HLEN", &keys.waiting]) != Reply::Integer(1) {
            tokio::time::sleep(MS).await;
        }
    })
    .await;
    // Another replica's www requests go at their own pace meanwhile.
    for _ in 0..3 {
        let permit = bounded(2, b.acquire_host("t", host("www.lane.com"), None))
            .await
            .unwrap();
        drop(permit);
    }
    api_waits.abort();
}

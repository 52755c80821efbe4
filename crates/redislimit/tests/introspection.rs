//! Bounded queues and snapshots of the in-process limiter, under a paused
//! clock: exact counts and instants.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redislimit::snapshot::PacedBy;
use redislimit::{
    DomainLimiter, Error, Hooks, HostKey, Limiter, Pacing, Policies, Rule, WaitOutcome,
};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

fn host(name: &str) -> HostKey {
    HostKey::parse(&format!("http://{name}/")).unwrap()
}

/// Records every wait outcome.
#[derive(Debug, Default)]
struct Outcomes(Mutex<Vec<WaitOutcome>>);

impl Hooks for Outcomes {
    fn on_wait(&self, _engine: &str, outcome: WaitOutcome, _waited: Duration) {
        self.0.lock().unwrap().push(outcome);
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_beyond_the_bound_is_refused_at_once_booking_nothing() {
    let pacing = Pacing::builder()
        .min_delay(100 * MS)
        .max_queued(2)
        .build()
        .unwrap();
    let outcomes = Arc::new(Outcomes::default());
    let limiter = DomainLimiter::with_hooks(pacing, outcomes.clone());
    let start = Instant::now();
    let first = limiter
        .acquire_host("t", host("a.test"), None)
        .await
        .unwrap();
    let waiter = |limiter: DomainLimiter| {
        tokio::spawn(async move {
            let permit = limiter
                .acquire_host("t", host("a.test"), None)
                .await
                .unwrap();
            let at = start.elapsed();
            permit.release();
            at
        })
    };
    let (w1, w2) = (waiter(limiter.clone()), waiter(limiter.clone()));
    tokio::task::yield_now().await;
    // Two wait: a third is refused now, not after a wait.
    match limiter.acquire_host("t", host("a.test"), None).await {
        Err(Error::QueueFull { host, queued, max }) => {
            assert_eq!((host.as_str(), queued, max), ("a.test", 2, 2));
        }
        other => panic!("expected QueueFull, got {other:?}"),
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Another host is not affected.
    drop(
        limiter
            .acquire_host("t", host("b.test"), None)
            .await
            .unwrap(),
    );
    first.release();
    // The refused acquire booked nothing: the two waiters go at the gaps
    // the first release set.
    assert_eq!(w1.await.unwrap(), 100 * MS);
    assert_eq!(w2.await.unwrap(), 200 * MS);
    let outcomes = outcomes.0.lock().unwrap().clone();
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == WaitOutcome::QueueFull)
            .count(),
        1
    );
    // A bound of 0: admitted at once or refused.
    let none = DomainLimiter::new(Pacing::builder().max_queued(0).build().unwrap());
    let held = none.acquire_host("t", host("a.test"), None).await.unwrap();
    assert!(matches!(
        none.acquire_host("t", host("a.test"), None).await,
        Err(Error::QueueFull {
            queued: 0,
            max: 0,
            ..
        })
    ));
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_snapshot_lists_the_hosts_with_most_waiting_and_totals_exactly() {
    let policies = Policies::new(Pacing::builder().min_delay(100 * MS).build().unwrap())
        .with_rule(Rule::new(
            "b.test",
            Pacing::builder().max_concurrent(2).build().unwrap(),
        ))
        .unwrap();
    let limiter = DomainLimiter::new(policies);
    let t0 = Instant::now();
    let wait = |name: &'static str| {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire_host("t", host(name), None).await })
    };
    // a.test: one in flight, three waiting. b.test: two in flight, one
    // waiting. c.test: one in flight, held back by a penalty, one waiting.
    // d.test: one in flight, none waiting (counted, not listed).
    let a = limiter
        .acquire_host("t", host("a.test"), None)
        .await
        .unwrap();
    let b1 = limiter
        .acquire_host("t", host("b.test"), None)
        .await
        .unwrap();
    let b2 = limiter
        .acquire_host("t", host("b.test"), None)
        .await
        .unwrap();
    let c = limiter
        .acquire_host("t", host("c.test"), None)
        .await
        .unwrap();
    let d = limiter
        .acquire_host("t", host("d.test"), None)
        .await
        .unwrap();
    limiter
        .penalize_host(host("c.test"), Duration::from_secs(5))
        .await
        .unwrap();
    let waiters: Vec<_> = ["a.test", "a.test", "a.test", "b.test", "c.test"]
        .into_iter()
        .map(wait)
        .collect();
    tokio::task::yield_now().await;

    let top = limiter.snapshot(2);
    assert_eq!(
        (top.active_hosts, top.queued, top.in_flight),
        (4, 5, 5),
        "totals over every host, listed or not"
    );
    let listed: Vec<_> = top
        .hosts
        .iter()
        .map(|h| (h.host.as_str(), h.queued, h.in_flight))
        .collect();
    assert_eq!(listed, [("a.test", 3, 1), ("b.test", 1, 2)]);
    assert_eq!(top.hosts[0].paced_by, PacedBy::InProcess);
    assert_eq!(top.hosts[0].next_send, Some(t0 + 100 * MS));
    assert_eq!(top.hosts[0].held_until, None);
    let all = limiter.snapshot(10);
    assert_eq!(all.hosts.len(), 3);
    let c_entry = all.host(&host("c.test")).expect("c.test has a waiter");
    assert_eq!((c_entry.queued, c_entry.in_flight), (1, 1));
    assert_eq!(c_entry.held_until, Some(t0 + Duration::from_secs(5)));
    assert_eq!(c_entry.next_send, Some(t0 + Duration::from_secs(5)));
    assert!(all.host(&host("d.test")).is_none());
    assert!(limiter.snapshot(0).hosts.is_empty());

    drop((a, b1, b2, c, d));
    for w in waiters {
        drop(w.await.unwrap().unwrap());
    }
    let after = limiter.snapshot(10);
    assert_eq!((after.queued, after.in_flight), (0, 0));
    assert!(after.hosts.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_higher_priority_goes_first_and_equal_ones_keep_their_order() {
    use redislimit::RequestPacing;
    let limiter = DomainLimiter::new(Pacing::builder().min_delay(10 * MS).build().unwrap());
    let order = Arc::new(Mutex::new(Vec::new()));
    let held = limiter
        .acquire_host("t", host("a.test"), None)
        .await
        .unwrap();
    let waiter = |name: &'static str, priority: u8| {
        let (limiter, order) = (limiter.clone(), Arc::clone(&order));
        tokio::spawn(async move {
            let pacing = RequestPacing::new().with_priority(priority);
            let permit = limiter
                .acquire_with("t", host("a.test"), None, pacing)
                .await
                .unwrap();
            order.lock().unwrap().push(name);
            permit.release();
        })
    };
    // Ten low ones queue first, then a high one, then a default one and
    // another high one.
    let mut tasks = Vec::new();
    for name in ["l0", "l1", "l2", "l3", "l4", "l5", "l6", "l7", "l8", "l9"] {
        tasks.push(waiter(name, 10));
        tokio::task::yield_now().await;
    }
    for (name, priority) in [
        ("h0", 250),
        ("d0", RequestPacing::DEFAULT_PRIORITY),
        ("h1", 250),
    ] {
        tasks.push(waiter(name, priority));
        tokio::task::yield_now().await;
    }
    assert_eq!(limiter.snapshot(1).queued, 13);
    held.release();
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        [
            "h0", "h1", "d0", "l0", "l1", "l2", "l3", "l4", "l5", "l6", "l7", "l8", "l9"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_counts_only_the_waiters_a_priority_queues_behind() {
    use redislimit::RequestPacing;
    let limiter = DomainLimiter::new(Pacing::builder().min_delay(100 * MS).build().unwrap());
    let held = limiter
        .acquire_host("t", host("a.test"), None)
        .await
        .unwrap();
    let mut lows = Vec::new();
    for _ in 0..10 {
        let limiter = limiter.clone();
        lows.push(tokio::spawn(async move {
            let low = RequestPacing::new().with_priority(1);
            drop(limiter.acquire_with("t", host("a.test"), None, low).await);
        }));
        tokio::task::yield_now().await;
    }
    // Behind ten others the wait would be a second; ahead of them, one gap.
    let deadline = Some(Instant::now() + 150 * MS);
    let high = RequestPacing::new().with_priority(250);
    let (acquired, ()) = tokio::join!(
        limiter.acquire_with("t", host("a.test"), deadline, high),
        async { held.release() },
    );
    assert!(acquired.is_ok(), "{acquired:?}");
    drop(acquired);
    for low in lows {
        low.await.unwrap();
    }
}

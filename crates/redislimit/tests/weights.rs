//! Request weights in the in-process limiter, under a paused clock: a
//! request of weight `w` takes `w` slots of the cap and `w` units of the
//! quota; one that cannot fit is refused; lighter waiters go while a heavy
//! one waits (best fit) and the heavy one keeps its place.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redislimit::{DomainLimiter, Error, HostKey, Limiter, Pacing, Permit, RequestPacing};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

fn host() -> HostKey {
    HostKey::parse("http://w.test/").unwrap()
}

fn weighing(weight: u32) -> RequestPacing {
    RequestPacing::new().with_weight(weight)
}

fn limiter(cap: u32, quota: u32) -> DomainLimiter {
    let mut pacing = Pacing::builder().max_concurrent(cap);
    if quota > 0 {
        pacing = pacing.quota(quota).window(Duration::from_secs(1));
    }
    DomainLimiter::new(pacing.build().unwrap())
}

/// Spawns an acquire of `weight` that records `name` in `order` once
/// admitted and hands its permit back through the join handle.
fn waiter(
    limiter: &DomainLimiter,
    order: &Arc<Mutex<Vec<&'static str>>>,
    name: &'static str,
    weight: u32,
    priority: u8,
) -> tokio::task::JoinHandle<Permit> {
    let (limiter, order) = (limiter.clone(), Arc::clone(order));
    tokio::spawn(async move {
        let request = weighing(weight).with_priority(priority);
        let permit = limiter.acquire_with("t", host(), None, request).await;
        order.lock().unwrap().push(name);
        permit.unwrap()
    })
}

/// Lets every spawned task run as far as it can at this instant.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_weight_that_can_never_fit_is_refused_booking_nothing() {
    let limiter = limiter(3, 2);
    for weight in [0, 3, 4] {
        let refused = limiter
            .acquire_with("t", host(), None, weighing(weight))
            .await;
        match refused {
            Err(Error::InvalidWeight {
                weight: w, limit, ..
            }) => assert_eq!((w, limit), (weight, 2), "the quota is the smaller bound"),
            other => panic!("weight {weight}: {other:?}"),
        }
    }
    assert_eq!(limiter.host_count(), 0, "nothing was booked");
    let start = Instant::now();
    let two = limiter
        .acquire_with("t", host(), None, weighing(2))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    two.release();
}

#[tokio::test(start_paused = true)]
async fn a_weight_of_two_takes_two_slots_of_a_cap_of_three() {
    let limiter = limiter(3, 0);
    let order = Arc::new(Mutex::new(Vec::new()));
    let two = limiter
        .acquire_with("t", host(), None, weighing(2))
        .await
        .unwrap();
    let one = waiter(&limiter, &order, "one", 1, 128);
    let other = waiter(&limiter, &order, "other", 1, 128);
    settle().await;
    assert_eq!(*order.lock().unwrap(), ["one"], "2 + 1 fill the cap of 3");
    let snapshot = limiter.snapshot(1);
    assert_eq!((snapshot.queued, snapshot.in_flight), (1, 3));
    tokio::time::sleep(50 * MS).await;
    two.release();
    settle().await;
    assert_eq!(*order.lock().unwrap(), ["one", "other"]);
    one.await.unwrap().release();
    other.await.unwrap().release();
}

#[tokio::test(start_paused = true)]
async fn lighter_requests_go_while_a_heavy_one_waits_and_it_keeps_its_place() {
    let limiter = limiter(3, 0);
    let order = Arc::new(Mutex::new(Vec::new()));
    let first = limiter
        .acquire_with("t", host(), None, weighing(1))
        .await
        .unwrap();
    // The heavy one cannot fit beside the first (1 + 3 > 3), even at the
    // highest priority; two light ones of the lowest priority queue behind.
    let heavy = waiter(&limiter, &order, "heavy", 3, 255);
    settle().await;
    let light = waiter(&limiter, &order, "light", 1, 0);
    settle().await;
    let middle = waiter(&limiter, &order, "middle", 2, 0);
    settle().await;
    assert_eq!(
        *order.lock().unwrap(),
        ["light"],
        "the light one fits beside the first; weight 2 would not (1 + 1 + 2 > 3)"
    );
    // A later light one still fits; the cap is then full.
    let late = waiter(&limiter, &order, "late", 1, 0);
    settle().await;
    assert_eq!(*order.lock().unwrap(), ["light", "late"]);
    first.release();
    light.await.unwrap().release();
    settle().await;
    assert_eq!(
        *order.lock().unwrap(),
        ["light", "late", "middle"],
        "beside the late one, 2 fits and 3 does not"
    );
    late.await.unwrap().release();
    settle().await;
    assert_eq!(*order.lock().unwrap(), ["light", "late", "middle"]);
    // A light one arriving now still fits beside the weight-2 one.
    let last = waiter(&limiter, &order, "last", 1, 0);
    settle().await;
    assert_eq!(*order.lock().unwrap(), ["light", "late", "middle", "last"]);
    middle.await.unwrap().release();
    last.await.unwrap().release();
    settle().await;
    // Everything is free: the heavy one goes, and a light one arriving
    // now waits for it.
    assert_eq!(
        *order.lock().unwrap(),
        ["light", "late", "middle", "last", "heavy"]
    );
    let after = waiter(&limiter, &order, "after", 1, 255);
    settle().await;
    assert_eq!(limiter.snapshot(1).queued, 1);
    heavy.await.unwrap().release();
    after.await.unwrap().release();
    assert_eq!(
        *order.lock().unwrap(),
        ["light", "late", "middle", "last", "heavy", "after"]
    );
    let snapshot = limiter.snapshot(1);
    assert_eq!((snapshot.queued, snapshot.in_flight), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_light_request_never_overtakes_one_that_waits_for_time_only() {
    // The heavy head fits the cap but waits for the quota: nobody passes
    // it, since a lighter request would only spend the units it waits for.
    let limiter = limiter(4, 4);
    let start = Instant::now();
    limiter
        .acquire_with("t", host(), None, weighing(3))
        .await
        .unwrap()
        .release();
    let order = Arc::new(Mutex::new(Vec::new()));
    let heavy = waiter(&limiter, &order, "heavy", 2, 128);
    settle().await;
    let light = waiter(&limiter, &order, "light", 1, 128);
    settle().await;
    assert!(order.lock().unwrap().is_empty(), "one unit left; 2 wait");
    let permit = heavy.await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1), "the window");
    permit.release();
    light.await.unwrap().release();
    assert_eq!(*order.lock().unwrap(), ["heavy", "light"]);
}

#[tokio::test(start_paused = true)]
async fn a_weighted_admission_counts_its_weight_in_the_quota() {
    let limiter = limiter(4, 4);
    let start = Instant::now();
    let three = limiter
        .acquire_with("t", host(), None, weighing(3))
        .await
        .unwrap();
    three.release();
    let one = limiter.acquire_host("t", host(), None).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "3 + 1 fill the quota of 4");
    one.release();
    let two = limiter
        .acquire_with("t", host(), None, weighing(2))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    // An abandoned weighted admission gives its units back.
    two.abandon();
    let again = limiter
        .acquire_with("t", host(), None, weighing(2))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    again.release();
}

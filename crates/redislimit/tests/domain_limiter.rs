//! `DomainLimiter` rules under a paused Tokio clock, with exact instants.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redislimit::{DomainLimiter, Error, Hooks, HostKey, Limiter, Pacing, Permit, WaitOutcome};
use tokio::task::JoinHandle;
use tokio::time::{Instant, advance, sleep};

const MS: Duration = Duration::from_millis(1);

fn host(name: &str) -> HostKey {
    HostKey::parse(&format!("http://{name}/")).unwrap()
}

fn limiter(
    build: impl FnOnce(redislimit::pacing::PacingBuilder) -> redislimit::pacing::PacingBuilder,
) -> DomainLimiter {
    DomainLimiter::new(build(Pacing::builder()).build().unwrap())
}

/// Awaits `fut`, failing the test instead of hanging when it never ends
/// (a lost wake-up would otherwise park a paused runtime forever).
async fn bounded<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(3600), fut)
        .await
        .expect("never completed: a waiter was not woken")
}

/// Lets every runnable task run until all are parked on a timer or a wake-up.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Starts an acquire in its own task; the task returns its permit and the
/// instant it was admitted (since `t0`).
fn spawn_acquire(l: &DomainLimiter, name: &str, t0: Instant) -> JoinHandle<(Permit, Duration)> {
    let l = l.clone();
    let h = host(name);
    tokio::spawn(async move {
        let permit = bounded(l.acquire_host("test", h, None)).await.unwrap();
        (permit, t0.elapsed())
    })
}

#[tokio::test(start_paused = true)]
async fn max_concurrent_caps_in_flight_per_host() {
    let l = limiter(|b| b.max_concurrent(2));
    let t0 = Instant::now();
    let a = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    let b = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    let third = spawn_acquire(&l, "a.test", t0);
    // Another host is not held up by a.test being full.
    let other = bounded(l.acquire_host("t", host("b.test"), None))
        .await
        .unwrap();
    assert_eq!(t0.elapsed(), Duration::ZERO);
    sleep(300 * MS).await;
    assert!(
        !third.is_finished(),
        "a third request got in while two were in flight"
    );
    drop(a);
    let (_c, at) = third.await.unwrap();
    assert_eq!(at, 300 * MS);
    drop((b, other));
}

#[tokio::test(start_paused = true)]
async fn min_delay_counts_from_the_previous_send() {
    let l = limiter(|b| b.max_concurrent(4).min_delay(100 * MS));
    let t0 = Instant::now();
    let mut held = Vec::new();
    let mut sends = Vec::new();
    for _ in 0..4 {
        held.push(
            bounded(l.acquire_host("t", host("a.test"), None))
                .await
                .unwrap(),
        );
        sends.push(t0.elapsed());
    }
    assert_eq!(sends, [0, 100, 200, 300].map(|ms| ms * MS));
}

#[tokio::test(start_paused = true)]
async fn min_delay_counts_from_the_latest_completion() {
    let l = limiter(|b| b.max_concurrent(2).min_delay(100 * MS));
    let t0 = Instant::now();
    let first = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    sleep(250 * MS).await; // a slow response, still in flight
    first.release();
    let second = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    assert_eq!(t0.elapsed(), 350 * MS);
    assert_eq!(second.waited(), 100 * MS);
}

#[tokio::test(start_paused = true)]
async fn quota_is_a_sliding_window_over_admissions() {
    let l = limiter(|b| b.max_concurrent(10).quota(3).window(1000 * MS));
    let t0 = Instant::now();
    let mut sends = Vec::new();
    for i in 0..7 {
        if i == 1 {
            sleep(400 * MS).await;
        }
        let p = bounded(l.acquire_host("t", host("a.test"), None))
            .await
            .unwrap();
        sends.push(t0.elapsed());
        drop(p);
    }
    // Admissions at 0, 400, 400; the fourth must wait for 0 to leave the
    // window (1000), the fifth and sixth for 400 to leave it (1400), the
    // seventh for 1000 to leave it (2000). No burst is banked.
    assert_eq!(
        sends,
        [0, 400, 400, 1000, 1400, 1400, 2000].map(|ms| ms * MS)
    );
}

#[tokio::test(start_paused = true)]
async fn jitter_is_added_to_every_nonzero_wait_only() {
    let l = limiter(|b| b.min_delay(100 * MS).jitter(50 * MS));
    let mut extras = Vec::new();
    for i in 0..40 {
        let h = host(&format!("h{i}.test"));
        let first = bounded(l.acquire_host("t", h.clone(), None)).await.unwrap();
        assert_eq!(first.waited(), Duration::ZERO, "a free host got jitter");
        drop(first);
        let second = bounded(l.acquire_host("t", h, None)).await.unwrap();
        let waited = second.waited();
        assert!(waited >= 100 * MS && waited <= 150 * MS, "{waited:?}");
        extras.push(waited - 100 * MS);
    }
    extras.sort();
    extras.dedup();
    assert!(extras.len() > 5, "jitter barely varies: {extras:?}");
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_strictly_first_come_first_served() {
    let l = limiter(|b| b.max_concurrent(1).min_delay(10 * MS));
    let order = Arc::new(Mutex::new(Vec::new()));
    let first = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (l, order) = (l.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let p = bounded(l.acquire_host("t", host("a.test"), None))
                .await
                .unwrap();
            order.lock().unwrap().push(i);
            sleep(MS).await;
            drop(p);
        }));
        settle().await; // task i is queued before task i + 1 starts
    }
    drop(first);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_frees_its_place_at_once() {
    let l = limiter(|b| b.max_concurrent(1).min_delay(100 * MS));
    let t0 = Instant::now();
    let holder = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    let b = spawn_acquire(&l, "a.test", t0);
    settle().await;
    let c = spawn_acquire(&l, "a.test", t0);
    settle().await;
    sleep(50 * MS).await;
    b.abort(); // the head of the line gives up
    assert!(b.await.unwrap_err().is_cancelled());
    sleep(50 * MS).await;
    holder.release(); // at 100 ms
    let (_c, at) = c.await.unwrap();
    // C goes exactly min_delay after the completion, as if B had never queued.
    assert_eq!(at, 200 * MS);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_sleeping_head_costs_the_next_waiter_nothing() {
    let l = limiter(|b| b.max_concurrent(4).min_delay(100 * MS));
    let t0 = Instant::now();
    let _first = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    let b = spawn_acquire(&l, "a.test", t0); // sleeps until 100 ms
    settle().await;
    let c = spawn_acquire(&l, "a.test", t0); // behind B: would go at 200 ms
    settle().await;
    sleep(30 * MS).await;
    b.abort();
    let (_c, at) = c.await.unwrap();
    assert_eq!(
        at,
        100 * MS,
        "C should take B's turn, not wait behind a ghost"
    );
}

#[tokio::test(start_paused = true)]
async fn penalize_holds_a_host_and_only_ever_extends() {
    let l = limiter(|b| b.max_concurrent(4));
    let t0 = Instant::now();
    l.penalize_host(host("a.test"), 500 * MS).await.unwrap();
    l.penalize_host(host("a.test"), 100 * MS).await.unwrap(); // shorter: ignored
    let other = bounded(l.acquire_host("t", host("b.test"), None))
        .await
        .unwrap();
    assert_eq!(
        other.waited(),
        Duration::ZERO,
        "a penalty leaked to another host"
    );
    let p = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    assert_eq!(t0.elapsed(), 500 * MS);
    drop(p);
}

#[tokio::test(start_paused = true)]
async fn penalize_extends_the_wait_of_a_sleeping_waiter() {
    let l = limiter(|b| b.min_delay(100 * MS));
    let t0 = Instant::now();
    drop(
        bounded(l.acquire_host("t", host("a.test"), None))
            .await
            .unwrap(),
    );
    let waiter = spawn_acquire(&l, "a.test", t0); // due at 100 ms
    settle().await;
    sleep(50 * MS).await;
    l.penalize_host(host("a.test"), 1000 * MS).await.unwrap();
    let (_p, at) = waiter.await.unwrap();
    assert_eq!(at, 1050 * MS);
}

#[tokio::test(start_paused = true)]
async fn a_penalty_is_capped_by_max_penalty() {
    let l = limiter(|b| b.max_penalty(2000 * MS));
    let t0 = Instant::now();
    l.penalize_host(host("a.test"), Duration::from_secs(86_400 * 365))
        .await
        .unwrap();
    let _p = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    assert_eq!(t0.elapsed(), 2000 * MS);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_shorter_than_the_wait_fails_at_once() {
    let l = limiter(|b| b.min_delay(1000 * MS));
    let _p = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    sleep(100 * MS).await;
    let t1 = Instant::now();
    let err = bounded(l.acquire_host("t", host("a.test"), Some(t1 + 300 * MS)))
        .await
        .unwrap_err();
    assert_eq!(t1.elapsed(), Duration::ZERO, "the budget was slept out");
    match err {
        Error::WaitBudget {
            host,
            wait,
            remaining,
        } => {
            assert_eq!(host, "a.test");
            assert_eq!(wait, 900 * MS);
            assert_eq!(remaining, 300 * MS);
        }
        other => panic!("expected WaitBudget, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_deadline_counts_the_waiters_ahead() {
    let l = limiter(|b| b.max_concurrent(8).min_delay(100 * MS));
    let t0 = Instant::now();
    let _p = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    let _queued: Vec<_> = (0..3).map(|_| spawn_acquire(&l, "a.test", t0)).collect();
    settle().await;
    // Three ahead, due at 100, 200 and 300 ms: this one cannot go before 400.
    let err = bounded(l.acquire_host("t", host("a.test"), Some(t0 + 350 * MS)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::WaitBudget { wait, .. } if wait == 400 * MS),
        "{err:?}"
    );
    assert_eq!(t0.elapsed(), Duration::ZERO);
    // Enough budget: admitted at its turn.
    let p = bounded(l.acquire_host("t", host("a.test"), Some(t0 + 400 * MS)))
        .await
        .unwrap();
    assert_eq!(t0.elapsed(), 400 * MS);
    drop(p);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_on_a_full_host_fails_when_it_passes() {
    let l = limiter(|b| b.max_concurrent(1));
    let t0 = Instant::now();
    let _holder = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    let err = bounded(l.acquire_host("t", host("a.test"), Some(t0 + 250 * MS)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WaitBudget { .. }), "{err:?}");
    assert_eq!(t0.elapsed(), 250 * MS);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_gives_up_hands_its_turn_on() {
    let l = limiter(|b| b.max_concurrent(1));
    let t0 = Instant::now();
    let holder = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    let l2 = l.clone();
    let impatient = tokio::spawn(async move {
        bounded(l2.acquire_host("t", host("a.test"), Some(Instant::now() + 100 * MS))).await
    });
    settle().await;
    let patient = spawn_acquire(&l, "a.test", t0);
    settle().await;
    assert!(impatient.await.unwrap().is_err());
    sleep(100 * MS).await;
    drop(holder);
    let (_p, at) = patient.await.unwrap();
    assert_eq!(at, 200 * MS);
}

#[derive(Debug, Default)]
struct Recorded(Mutex<Vec<(String, WaitOutcome, Duration)>>);

impl Hooks for Recorded {
    fn on_wait(&self, engine: &str, outcome: WaitOutcome, waited: Duration) {
        self.0
            .lock()
            .unwrap()
            .push((engine.to_owned(), outcome, waited));
    }
}

#[tokio::test(start_paused = true)]
async fn hooks_report_each_acquire_once_with_its_outcome() {
    let hooks = Arc::new(Recorded::default());
    let pacing = Pacing::builder().min_delay(100 * MS).build().unwrap();
    let l = DomainLimiter::with_hooks(pacing, hooks.clone());
    let a = bounded(l.acquire_host("crawl", host("a.test"), None))
        .await
        .unwrap();
    drop(a);
    let l2 = l.clone();
    let cancelled =
        tokio::spawn(async move { bounded(l2.acquire_host("search", host("a.test"), None)).await });
    settle().await;
    sleep(40 * MS).await;
    cancelled.abort();
    let _ = cancelled.await;
    let over =
        bounded(l.acquire_host("crawl", host("a.test"), Some(Instant::now() + 10 * MS))).await;
    assert!(over.is_err());
    let ok = bounded(l.acquire_host("crawl", host("a.test"), None))
        .await
        .unwrap();
    drop(ok);
    let seen = hooks.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("crawl".into(), WaitOutcome::Acquired, Duration::ZERO),
            ("search".into(), WaitOutcome::Canceled, 40 * MS),
            ("crawl".into(), WaitOutcome::BudgetExceeded, Duration::ZERO),
            ("crawl".into(), WaitOutcome::Acquired, 60 * MS),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_url_without_a_host_is_a_typed_error() {
    let l = limiter(|b| b);
    let url = "mailto:someone@example.com".parse().unwrap();
    let err = l.acquire("t", &url, None).await.unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    let err = l.penalize(&url, MS).await.unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn idle_hosts_are_evicted_but_constraining_state_is_kept() {
    let l = limiter(|b| b.min_delay(100 * MS).quota(2).window(1000 * MS));
    drop(
        bounded(l.acquire_host("t", host("a.test"), None))
            .await
            .unwrap(),
    );
    l.penalize_host(host("b.test"), 5000 * MS).await.unwrap();
    assert_eq!(l.host_count(), 2);
    sleep(999 * MS).await;
    settle().await;
    assert_eq!(
        l.host_count(),
        2,
        "a.test's admission is still in its window"
    );
    sleep(MS).await;
    settle().await;
    assert_eq!(l.host_count(), 1, "a.test is idle and should be gone");
    // b.test's penalty survives until it ends.
    let t1 = Instant::now();
    let p = bounded(l.acquire_host("t", host("b.test"), None))
        .await
        .unwrap();
    assert_eq!(t1.elapsed(), 4000 * MS);
    drop(p);
    advance(1000 * MS).await;
    settle().await;
    assert_eq!(l.host_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_million_hosts_touched_once_leave_nothing_behind() {
    let l = limiter(|b| b.min_delay(50 * MS));
    for i in 0..1_000_000u32 {
        let h = HostKey::parse(&format!("http://h{i}.example/")).unwrap();
        drop(bounded(l.acquire_host("t", h, None)).await.unwrap());
    }
    assert_eq!(l.host_count(), 1_000_000);
    // Idle after min_delay; swept on the next 25 ms grain.
    sleep(100 * MS).await;
    settle().await;
    assert_eq!(l.host_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn busy_hosts_are_never_evicted() {
    let l = limiter(|b| b.max_concurrent(1).min_delay(10 * MS));
    let t0 = Instant::now();
    let held = bounded(l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    sleep(10_000 * MS).await;
    settle().await;
    assert_eq!(l.host_count(), 1);
    let next = spawn_acquire(&l, "a.test", t0);
    settle().await;
    assert!(!next.is_finished());
    drop(held);
    let (_p, at) = next.await.unwrap();
    assert_eq!(at, 10_010 * MS);
}

/// On a real multi-threaded runtime: many tasks, several hosts; what the
/// "server" saw (send and end instants recorded around the work) keeps
/// every rule. Asserts invariants only, never elapsed time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_keep_the_rules_on_a_real_clock() {
    let max = 2;
    let delay = 30 * MS;
    // A send is stamped after its admission; a task preempted in between
    // makes two stamps look closer than the admissions were, and a send
    // stamped after another request's end that came after its admission
    // look too close to that end. On a busy machine (a test suite beside
    // it) a 2 ms slack at a 5 ms gap failed so.
    let slack = 10 * MS;
    let l = limiter(|b| b.max_concurrent(max).min_delay(delay));
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..120 {
        let (l, log) = (l.clone(), Arc::clone(&log));
        tasks.push(tokio::spawn(async move {
            let name = format!("h{}.test", i % 3);
            let p = bounded(l.acquire_host("t", host(&name), None))
                .await
                .unwrap();
            let send = std::time::Instant::now();
            tokio::time::sleep(Duration::from_micros(300 * (i % 5))).await;
            let end = std::time::Instant::now();
            drop(p);
            log.lock().unwrap().push((name, send, end));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 120);
    for h in 0..3 {
        let name = format!("h{h}.test");
        let mut reqs: Vec<_> = log
            .iter()
            .filter(|r| r.0 == name)
            .map(|r| (r.1, r.2))
            .collect();
        reqs.sort();
        for (k, &(send, _)) in reqs.iter().enumerate() {
            let overlapping = reqs.iter().filter(|&&(s, e)| s <= send && e > send).count();
            assert!(
                overlapping <= max as usize,
                "{overlapping} in flight on {name}"
            );
            if k > 0 {
                assert!(
                    send + slack >= reqs[k - 1].0 + delay,
                    "sends closer than min_delay on {name}"
                );
            }
            let latest_end_before = reqs[..k].iter().map(|r| r.1).filter(|&e| e <= send).max();
            if let Some(end) = latest_end_before {
                assert!(
                    send + slack >= end + delay,
                    "send within min_delay of a completion on {name}"
                );
            }
        }
    }
}

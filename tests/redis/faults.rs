//! Redis killed, frozen and restarted mid-run: typed errors within the
//! client timeouts, in-process pacing meanwhile, shared pacing afterwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redislimit::{Error, FallbackLimiter, Limiter, RedisLimiter};
use redislimit_tests::RedisServer;
use redislimit_tests::record::{Recorder, assert_serialized};

use crate::{MS, bounded, host, limiter, standalone};

/// Milliseconds after its first acquire by which Redis has answered three
/// of a replica's heartbeats: the others know it (docs/DESIGN.md,
/// "Partial outages").
const KNOWN: u32 = 1200;

fn serialized(server: &RedisServer) -> RedisLimiter {
    limiter(
        standalone(&server.url()),
        |p| p.min_delay(20 * MS),
        |b| b.lease_ttl(Duration::from_secs(2)),
    )
}

/// Acquires through `l` until `stop`, counting admissions.
fn keep_crawling(
    l: Arc<FallbackLimiter<RedisLimiter>>,
    count: Arc<AtomicUsize>,
    stop: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while stop.load(Ordering::SeqCst) == 0 {
            let p = l
                .acquire_host("t", host("a.test"), None)
                .await
                .expect("the fallback must keep pacing");
            tokio::time::sleep(2 * MS).await;
            drop(p);
            count.fetch_add(1, Ordering::SeqCst);
        }
    })
}

async fn assert_unavailable_soon(l: &RedisLimiter) {
    let start = Instant::now();
    let err = bounded(10, l.acquire_host("t", host("a.test"), None))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?} to fail",
        start.elapsed()
    );
}

/// After a fault ends, the plain limiter works again (retrying a few times:
/// the first calls may still meet the old connection).
async fn recovers(l: &RedisLimiter) {
    for _ in 0..50 {
        if let Ok(p) = l.acquire_host("t", host("recovered.test"), None).await {
            drop(p);
            return;
        }
        tokio::time::sleep(100 * MS).await;
    }
    panic!("the limiter never recovered");
}

/// Two replicas share pacing again: serialized, no overlap.
async fn shared_again(server: &RedisServer) {
    let replicas: Vec<Arc<dyn Limiter>> = (0..2)
        .map(|_| Arc::new(serialized(server)) as Arc<dyn Limiter>)
        .collect();
    let rec: Arc<Recorder> = crate::drive_all(&replicas, &["shared.test"], 2, 4, 30 * MS).await;
    assert_serialized(&rec.host("shared.test"), 20 * MS);
}

/// A fallback limiter keeps admitting while `fault` strikes Redis, the
/// plain limiter fails fast with `Unavailable`, and after `heal` the plain
/// limiter works again and two replicas share one pace.
async fn falls_back_and_recovers(
    fault: fn(&RedisServer),
    heal: fn(&RedisServer),
    outage: Duration,
) {
    let server = RedisServer::start();
    let plain = serialized(&server);
    let fallback = Arc::new(serialized(&server).with_fallback());
    let (count, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let crawler = keep_crawling(Arc::clone(&fallback), Arc::clone(&count), Arc::clone(&stop));
    // Past its first second: a replica Redis leaves earlier may not have
    // seen others that started beside it, and waits before it sends alone
    // (`degraded::replicas_started_together_keep_the_limit_when_redis_goes_at_once`).
    tokio::time::sleep(KNOWN * MS).await;

    fault(&server);
    assert_unavailable_soon(&plain).await;
    let at_fault = count.load(Ordering::SeqCst);
    tokio::time::sleep(outage).await;
    assert!(
        count.load(Ordering::SeqCst) > at_fault + 3,
        "the fallback stopped pacing"
    );

    heal(&server);
    recovers(&plain).await;
    shared_again(&server).await;
    stop.store(1, Ordering::SeqCst);
    bounded(20, crawler).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_falls_back_then_shares_again() {
    // The restart is a fresh server: no scripts cached, no state.
    falls_back_and_recovers(RedisServer::kill, RedisServer::restart, 500 * MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_mid_run_never_hangs_an_acquire() {
    falls_back_and_recovers(
        RedisServer::pause,
        RedisServer::resume,
        Duration::from_secs(3),
    )
    .await;
}

#[derive(Debug, Default)]
struct Counted {
    waits: std::sync::Mutex<Vec<redislimit::WaitOutcome>>,
    errors: std::sync::Mutex<Vec<(redislimit::Op, String)>>,
}

impl redislimit::Hooks for Counted {
    fn on_wait(&self, _engine: &str, outcome: redislimit::WaitOutcome, _waited: Duration) {
        self.waits.lock().unwrap().push(outcome);
    }

    fn on_error(&self, op: redislimit::Op, error: &Error) {
        assert!(error.is_unavailable(), "{error:?}");
        self.errors.lock().unwrap().push((op, error.to_string()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_count_each_decision_once_while_falling_back_and_report_failed_releases() {
    use redislimit::{Op, WaitOutcome};

    let server = RedisServer::start();
    let hooks = Arc::new(Counted::default());
    let l = limiter(
        standalone(&server.url()),
        |p| p.min_delay(MS),
        |b| b.hooks(hooks.clone()),
    )
    .with_fallback();

    // Healthy: one decision, one report.
    let held = l.acquire_host("t", host("a.test"), None).await.unwrap();
    assert_eq!(*hooks.waits.lock().unwrap(), [WaitOutcome::Acquired]);

    // Redis dies while the permit is held: the release fails off the
    // caller's path and is reported with its error.
    server.kill();
    drop(held);
    for _ in 0..100 {
        if !hooks.errors.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(20 * MS).await;
    }
    assert_eq!(
        hooks.errors.lock().unwrap().first().map(|e| e.0),
        Some(Op::Release)
    );

    // While down, every acquire is decided once (by the fallback); the
    // failure that trips the circuit is reported (the failed release may
    // already have tripped it), and Redis is then skipped for a second
    // rather than failing (and being reported) per request.
    hooks.waits.lock().unwrap().clear();
    hooks.errors.lock().unwrap().clear();
    for _ in 0..5 {
        drop(
            bounded(10, l.acquire_host("t", host("a.test"), None))
                .await
                .unwrap(),
        );
    }
    assert_eq!(*hooks.waits.lock().unwrap(), [WaitOutcome::Acquired; 5]);
    let errors = hooks.errors.lock().unwrap().clone();
    assert!(
        errors.iter().filter(|e| e.0 == Op::Acquire).count() <= 1,
        "{errors:?}"
    );
}

/// Regression: an acquire whose call timed out while Redis was frozen used
/// to leave its admission booked when Redis ran it later, blocking the host
/// on every replica for `lease_ttl`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_timed_out_books_nothing_when_redis_runs_it_later() {
    let server = RedisServer::start();
    let timeouts = redislimit::RedisTimeouts {
        response: 200 * MS,
        ..redislimit::RedisTimeouts::default()
    };
    let make = || {
        let pool = redislimit::RedisPool::standalone(&server.url(), timeouts).unwrap();
        limiter(pool, |p| p, |b| b.lease_ttl(Duration::from_secs(10)))
    };
    let (frozen, other) = (make(), make());
    drop(
        frozen
            .acquire_host("t", host("warm.test"), None)
            .await
            .unwrap(),
    );
    server.pause();
    let err = frozen
        .acquire_host("t", host("a.test"), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    tokio::time::sleep(300 * MS).await;
    server.resume();
    // Whichever runs first, the stalled acquire or its abandoned release,
    // the host ends up free.
    let p = bounded(
        10,
        other.acquire_host(
            "t",
            host("a.test"),
            Some(tokio::time::Instant::now() + Duration::from_secs(3)),
        ),
    )
    .await
    .expect("the timed-out acquire left the host booked");
    drop(p);
}

/// Regression: the fallback paced as if requests admitted through Redis
/// were not in flight, so losing Redis let a second request overlap them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_admitted_through_redis_still_count_when_redis_is_lost() {
    let server = RedisServer::start();
    let l = limiter(
        standalone(&server.url()),
        |p| p.max_concurrent(2).min_delay(Duration::from_secs(1)),
        |b| b,
    )
    .with_fallback();
    let held = l.acquire_host("t", host("a.test"), None).await.unwrap();
    server.kill();
    let soon = tokio::time::Instant::now() + 300 * MS;
    let err = bounded(10, l.acquire_host("t", host("a.test"), Some(soon)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::WaitBudget { .. }),
        "overlapped a request in flight: {err:?}"
    );
    drop(held);
    let released = Instant::now();
    drop(
        bounded(10, l.acquire_host("t", host("a.test"), None))
            .await
            .unwrap(),
    );
    assert!(
        released.elapsed() >= Duration::from_secs(1),
        "min_delay after the completion was not kept"
    );
}

/// Regression: with Redis frozen, waiters for one host queued behind each
/// other's timeouts (the k-th paid k of them). A Redis that failed to answer
/// is now skipped for a second, so it costs one timeout, not one per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_one_timeout_not_one_per_request() {
    use redislimit::{Op, WaitOutcome};

    let server = RedisServer::start();
    let hooks = Arc::new(Counted::default());
    let l = Arc::new(
        limiter(
            standalone(&server.url()),
            |p| p.max_concurrent(4),
            |b| b.cluster_concurrency(4).hooks(hooks.clone()),
        )
        .with_fallback(),
    );
    drop(l.acquire_host("t", host("warm.test"), None).await.unwrap());
    // Past its first second (see `falls_back_and_recovers`).
    tokio::time::sleep(KNOWN * MS).await;
    hooks.waits.lock().unwrap().clear();
    server.pause();
    let acquires: Vec<_> = (0..4)
        .map(|_| {
            let l = Arc::clone(&l);
            tokio::spawn(async move { l.acquire_host("t", host("a.test"), None).await.map(drop) })
        })
        .collect();
    for a in acquires {
        bounded(10, a)
            .await
            .unwrap()
            .expect("the fallback should have admitted it");
    }
    server.resume();
    let errors = hooks.errors.lock().unwrap().clone();
    assert!(
        errors.iter().filter(|e| e.0 == Op::Acquire).count() <= 1,
        "{errors:?}"
    );
    assert_eq!(*hooks.waits.lock().unwrap(), [WaitOutcome::Acquired; 4]);
}

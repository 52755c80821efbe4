//! Configuration agreement: replicas of one scope with different settings
//! are refused with both configurations named; a drained scope takes new
//! settings.

use std::time::Duration;

use redislimit::{Error, Limiter, RedisLimiter};
use redislimit_tests::RedisServer;

use crate::{MS, bounded, host, limiter, standalone};

fn with(server: &RedisServer, min_delay: Duration, cap: u32) -> RedisLimiter {
    limiter(
        standalone(&server.url()),
        |p| p.min_delay(min_delay),
        |b| {
            b.cluster_concurrency(cap)
                .lease_ttl(Duration::from_millis(300))
        },
    )
}

/// `result` is a configuration mismatch whose two records contain `ours`
/// and `theirs`.
pub(crate) fn assert_mismatch(result: Result<(), Error>, ours: &str, theirs: &str) {
    match result {
        Err(Error::ConfigMismatch {
            ours: o, theirs: t, ..
        }) => {
            assert!(o.contains(ours), "ours: {o}");
            assert!(t.contains(theirs), "theirs: {t}");
        }
        other => panic!("expected a configuration mismatch, got {other:?}"),
    }
}

/// Regression: `--min-delay 2s` beside `100ms` gave gaps alternating
/// between the two, and caps of 1 beside 0 or 3 let 2 or 3 requests fly
/// while every replica believed in 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_other_settings_are_refused_and_told_both() {
    let server = RedisServer::start();
    let first = with(&server, 2000 * MS, 1);
    drop(first.acquire_host("t", host("a.test"), None).await.unwrap());
    for (other, theirs_differ) in [
        (with(&server, 100 * MS, 1), "min_delay=100ms"),
        (with(&server, 2000 * MS, 0), "mode=serialized"),
        (with(&server, 2000 * MS, 3), "cluster_concurrency=3"),
    ] {
        let acquired = other.acquire_host("t", host("b.test"), None).await;
        assert_mismatch(acquired.map(drop), theirs_differ, "min_delay=2s");
        assert_mismatch(
            other.check_config().await,
            theirs_differ,
            "cluster_concurrency=1",
        );
        // The fallback does not pace on past a disagreement either.
        let wrapped = other.with_fallback();
        let acquired = wrapped.acquire_host("t", host("b.test"), None).await;
        assert!(
            matches!(acquired, Err(Error::ConfigMismatch { .. })),
            "{acquired:?}"
        );
    }
    // The same settings agree.
    let twin = with(&server, 2000 * MS, 1);
    twin.check_config().await.unwrap();
}

/// Once the replicas with the recorded settings have been idle for the
/// scope's longest window (here `lease_ttl` + `min_delay` + 1 s), a replica
/// with new settings records them, and an old replica that comes back is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_scope_takes_the_new_settings() {
    let server = RedisServer::start();
    let old = with(&server, 10 * MS, 1);
    drop(old.acquire_host("t", host("a.test"), None).await.unwrap());
    let new = with(&server, 20 * MS, 1);
    assert!(new.check_config().await.is_err());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    bounded(5, new.acquire_host("t", host("a.test"), None))
        .await
        .map(drop)
        .unwrap();
    let back = old.acquire_host("t", host("a.test"), None).await;
    assert!(
        matches!(back, Err(Error::ConfigMismatch { .. })),
        "an old replica paced beside the new settings: {back:?}"
    );
}

/// A task acquiring for `name` through `limiter` every 50 ms, as a crawl in
/// use does (whatever each acquire answers).
fn in_use(
    limiter: &std::sync::Arc<RedisLimiter>,
    name: &'static str,
) -> tokio::task::JoinHandle<()> {
    let limiter = std::sync::Arc::clone(limiter);
    tokio::spawn(async move {
        loop {
            let soon = tokio::time::Instant::now() + Duration::from_millis(200);
            let _ = limiter.acquire_host("t", host(name), Some(soon)).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// Regression: after Redis restarted empty, a replica started with other
/// settings recorded them first; the replicas already running were then
/// refused mid-crawl (and paced beside it until they found out). Now a
/// replica in use puts its record back within a heartbeat of seeing it
/// gone or displaced, and the newcomer is the one refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_lost_with_redis_is_put_back_and_the_newcomer_refused() {
    let server = RedisServer::start();
    let old = std::sync::Arc::new(with(&server, 100 * MS, 1));
    let old_crawl = in_use(&old, "a.test");
    tokio::time::sleep(Duration::from_millis(300)).await;
    old.check_config().await.unwrap();
    server.restart();
    // The newcomer reaches the empty Redis first, records its settings,
    // and crawls too.
    let new = std::sync::Arc::new(with(&server, 50 * MS, 1));
    bounded(5, new.check_config()).await.unwrap();
    let new_crawl = in_use(&new, "b.test");
    // Within a few heartbeats the running replica has put its record back.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    old_crawl.abort();
    new_crawl.abort();
    bounded(5, old.check_config())
        .await
        .expect("the replica already running keeps the scope");
    assert_mismatch(
        new.check_config().await,
        "min_delay=50ms",
        "min_delay=100ms",
    );
    let refused = new.acquire_host("t", host("b.test"), None).await;
    assert!(
        matches!(refused, Err(Error::ConfigMismatch { .. })),
        "{refused:?}"
    );
}

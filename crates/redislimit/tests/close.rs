//! `close()`: new acquires are refused, waiters wake, granted permits keep
//! working. In-process limiters under a paused clock.

use std::sync::Arc;
use std::time::Duration;

use redislimit::{DomainLimiter, Error, FallbackLimiter, HostKey, Limiter, Pacing};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

fn host(name: &str) -> HostKey {
    HostKey::parse(&format!("http://{name}/")).unwrap()
}

fn one_at_a_time() -> Pacing {
    Pacing::builder()
        .max_concurrent(1)
        .min_delay(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// A waiter parked behind a held permit, one sleeping out a gap and one
/// behind a penalty all wake with `Closed` the moment the limiter closes;
/// nothing is admitted afterwards, and the permit granted before still
/// releases.
async fn close_wakes_every_waiter(limiter: Arc<dyn Limiter>) {
    let held = limiter
        .acquire_host("t", host("a.test"), None)
        .await
        .unwrap();
    let gap = limiter
        .acquire_host("t", host("b.test"), None)
        .await
        .unwrap();
    drop(gap);
    limiter
        .penalize_host(host("c.test"), Duration::from_secs(60))
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for name in ["a.test", "b.test", "c.test"] {
        let l = Arc::clone(&limiter);
        waiters.push(tokio::spawn(async move {
            let r = l.acquire_host("t", host(name), None).await;
            (r.map(drop), Instant::now())
        }));
    }
    tokio::time::sleep(100 * MS).await;
    let closed_at = Instant::now();
    limiter.close(None).await.unwrap();
    for waiter in waiters {
        let (result, at) = waiter.await.unwrap();
        assert!(matches!(result, Err(Error::Closed)), "{result:?}");
        assert_eq!(at, closed_at, "woken late");
    }
    let after = limiter.acquire_host("t", host("d.test"), None).await;
    assert!(matches!(after, Err(Error::Closed)), "{after:?}");
    held.release();
}

#[tokio::test(start_paused = true)]
async fn closing_a_domain_limiter_wakes_its_waiters_with_closed() {
    close_wakes_every_waiter(Arc::new(DomainLimiter::new(one_at_a_time()))).await;
}

#[tokio::test(start_paused = true)]
async fn closing_a_fallback_limiter_wakes_its_waiters_with_closed() {
    let l = FallbackLimiter::new(
        DomainLimiter::new(one_at_a_time()),
        DomainLimiter::new(one_at_a_time()),
    );
    close_wakes_every_waiter(Arc::new(l)).await;
}

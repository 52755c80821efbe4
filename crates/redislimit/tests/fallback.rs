//! `FallbackLimiter` with in-process limiters on both sides, under a paused
//! clock: what a refusal or a cancellation by the primary leaves behind.

use std::time::Duration;

use redislimit::{DomainLimiter, Error, FallbackLimiter, HostKey, Limiter, Pacing};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

fn host() -> HostKey {
    HostKey::parse("http://a.test/").unwrap()
}

/// Regression: an admission by the in-process side stayed recorded when the
/// primary then refused, so refused attempts used up the local quota.
#[tokio::test(start_paused = true)]
async fn a_refusal_by_the_primary_takes_the_local_admission_back() {
    let fallback = DomainLimiter::new(
        Pacing::builder()
            .max_concurrent(4)
            .min_delay(Duration::from_secs(1))
            .quota(2)
            .window(Duration::from_secs(60))
            .build()
            .unwrap(),
    );
    let primary = DomainLimiter::new(Pacing::builder().max_concurrent(4).build().unwrap());
    primary.penalize_host(host(), 500 * MS).await.unwrap();
    let l = FallbackLimiter::new(primary, fallback);
    for _ in 0..3 {
        let refused = l
            .acquire_host("t", host(), Some(Instant::now() + 100 * MS))
            .await;
        assert!(
            matches!(refused, Err(Error::WaitBudget { .. })),
            "{refused:?}"
        );
    }
    tokio::time::sleep(500 * MS).await;
    // Nothing was sent: the local quota and gap are untouched.
    let t = Instant::now();
    let first = l.acquire_host("t", host(), Some(t + 10 * MS)).await;
    assert!(first.is_ok(), "{first:?}");
    assert_eq!(t.elapsed(), Duration::ZERO);
}

/// Regression: a cancelled acquire left its local admission behind, and
/// the next request waited a whole min_delay for a send that never was.
#[tokio::test(start_paused = true)]
async fn a_cancelled_acquire_costs_the_next_one_nothing() {
    let fallback = DomainLimiter::new(
        Pacing::builder()
            .min_delay(Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    let primary = DomainLimiter::new(Pacing::builder().max_concurrent(4).build().unwrap());
    primary.penalize_host(host(), 300 * MS).await.unwrap();
    let l = FallbackLimiter::new(primary, fallback);
    // Admitted locally, then waiting on the primary: dropped.
    let _ = tokio::time::timeout(100 * MS, l.acquire_host("t", host(), None)).await;
    tokio::time::sleep(200 * MS).await;
    let t = Instant::now();
    let next = l.acquire_host("t", host(), None).await.unwrap();
    assert_eq!(
        t.elapsed(),
        Duration::ZERO,
        "the cancelled acquire's gap was kept"
    );
    drop(next);
}

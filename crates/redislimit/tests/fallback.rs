//! `FallbackLimiter` with in-process limiters on both sides, under a paused
//! clock: what a refusal or a cancellation by the primary leaves behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redislimit::pacing::Spacing;
use redislimit::{
    BoxFuture, DomainLimiter, Error, FallbackLimiter, HostKey, Limiter, Op, Pacing, Permit,
    RequestPacing,
};
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

/// A primary that paces like a shared limiter and can be switched to fail:
/// while down, every acquire hangs for `stall` (a frozen server's timeout)
/// and then fails as unavailable.
#[derive(Debug, Clone)]
struct Switch {
    inner: DomainLimiter,
    down: Arc<AtomicBool>,
    stall: Duration,
}

impl Switch {
    fn new(pacing: Pacing, stall: Duration) -> Self {
        Self {
            inner: DomainLimiter::new(pacing),
            down: Arc::default(),
            stall,
        }
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
}

impl Limiter for Switch {
    fn acquire_with<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> BoxFuture<'a, Result<Permit, Error>> {
        Box::pin(async move {
            if self.down.load(Ordering::SeqCst) {
                tokio::time::sleep(self.stall).await;
                return Err(Error::unavailable(Op::Acquire, "switched off"));
            }
            // The shared side: it may make the caller wait; while it waits,
            // it may go down, and then the wait ends in a failure.
            let down = Arc::clone(&self.down);
            let stall = self.stall;
            tokio::select! {
                permit = self.inner.acquire_with(engine, host, deadline, request) => permit,
                () = async move {
                    while !down.load(Ordering::SeqCst) {
                        tokio::time::sleep(MS).await;
                    }
                    tokio::time::sleep(stall).await;
                } => Err(Error::unavailable(Op::Acquire, "switched off mid-wait")),
            }
        })
    }

    fn penalize_host<'a>(
        &'a self,
        host: HostKey,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.penalize_host(host, hold)
    }
}

/// Sends `count` requests to one host from `count` tasks at once, each
/// holding its permit for `hold`; returns the send instants, sorted.
async fn send_all<L: Limiter + Clone + 'static>(
    l: &L,
    count: usize,
    hold: Duration,
) -> Vec<Instant> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..count {
        let l = l.clone();
        tasks.spawn(async move {
            let permit = l.acquire_host("t", host(), None).await.unwrap();
            let sent = Instant::now();
            tokio::time::sleep(hold).await;
            drop(permit);
            sent
        });
    }
    let mut sends = tasks.join_all().await;
    sends.sort();
    sends
}

/// Lease-mode pacing: at most `max` in flight, sends `gap` apart
/// (completions move nothing).
fn sends_apart(max: u32, gap: Duration) -> Pacing {
    Pacing::builder()
        .max_concurrent(max)
        .min_delay(gap)
        .spacing(Spacing::Sends)
        .build()
        .unwrap()
}

fn assert_spaced(sends: &[Instant], gap: Duration) {
    for pair in sends.windows(2) {
        assert!(
            pair[1] - pair[0] >= gap,
            "two sends {:?} apart, less than {gap:?}",
            pair[1] - pair[0]
        );
    }
}

/// Regression (lease-mode shape): acquires queued behind a shared limiter
/// that goes down all failed over at the same instant and were sent at
/// once, on local admissions made long before, while the process's own
/// gap was 100 ms.
#[tokio::test(start_paused = true)]
async fn acquires_failing_over_together_keep_the_local_gap() {
    let gap = 100 * MS;
    let local = sends_apart(4, gap);
    // The shared side is four times slower than this process's own pace
    // (other replicas take their share), so local admissions run ahead.
    let shared = sends_apart(4, 4 * gap);
    let primary = Switch::new(shared, 500 * MS);
    let l = FallbackLimiter::new(primary.clone(), DomainLimiter::new(local));
    let crawl = {
        let l = l.clone();
        tokio::spawn(async move { send_all(&l, 12, 30 * MS).await })
    };
    tokio::time::sleep(1000 * MS).await;
    primary.set_down(true);
    tokio::time::sleep(1500 * MS).await;
    primary.set_down(false);
    let sends = crawl.await.unwrap();
    assert_eq!(sends.len(), 12);
    assert_spaced(&sends, gap);
}

/// Regression (one request at a time): the request after one the shared
/// side admitted late was sent right after it when the shared side then
/// failed at once, because the local record of the previous send was its
/// (early) local admission.
#[tokio::test(start_paused = true)]
async fn a_late_shared_admission_counts_as_the_last_send() {
    let gap = 100 * MS;
    let local = sends_apart(1, gap);
    let primary = Switch::new(Pacing::default(), Duration::ZERO);
    let l = FallbackLimiter::new(primary.clone(), DomainLimiter::new(local));
    // The shared side holds the host for 300 ms (another replica's turn).
    primary.penalize_host(host(), 300 * MS).await.unwrap();
    let first = l.acquire_host("t", host(), None).await.unwrap();
    let sent = Instant::now();
    drop(first);
    primary.set_down(true);
    let second = l.acquire_host("t", host(), None).await.unwrap();
    assert_eq!(
        Instant::now() - sent,
        gap,
        "the fallback did not count the send the shared side admitted"
    );
    drop(second);
}

/// Coming back: requests the fallback admitted and those the shared side
/// admits next keep the local gap between them.
#[tokio::test(start_paused = true)]
async fn moving_back_to_the_shared_limiter_keeps_the_local_gap() {
    let gap = 100 * MS;
    let local = sends_apart(4, gap);
    let primary = Switch::new(
        Pacing::builder().max_concurrent(4).build().unwrap(),
        200 * MS,
    );
    primary.set_down(true);
    let l = FallbackLimiter::new(primary.clone(), DomainLimiter::new(local));
    let crawl = {
        let l = l.clone();
        tokio::spawn(async move { send_all(&l, 10, 50 * MS).await })
    };
    tokio::time::sleep(350 * MS).await;
    primary.set_down(false);
    let sends = crawl.await.unwrap();
    assert_eq!(sends.len(), 10);
    assert_spaced(&sends, gap);
}

/// Regression (recovery): an acquire admitted in-process before another
/// one failed over, and then admitted by the primary that came back, was
/// sent right after the failed-over one.
#[tokio::test(start_paused = true)]
async fn admissions_by_both_paths_do_not_fall_together() {
    let gap = 100 * MS;
    let local = sends_apart(4, gap);
    let primary = Switch::new(
        Pacing::builder().max_concurrent(4).build().unwrap(),
        150 * MS,
    );
    let l = FallbackLimiter::new(primary.clone(), DomainLimiter::new(local));
    let t0 = Instant::now();
    // The shared side holds the host until 250 ms, and is down at first.
    primary.penalize_host(host(), 250 * MS).await.unwrap();
    primary.set_down(true);
    let first = {
        let l = l.clone();
        tokio::spawn(async move {
            let p = l.acquire_host("t", host(), None).await.unwrap();
            (Instant::now(), p)
        })
    };
    tokio::time::sleep(50 * MS).await;
    primary.set_down(false);
    // Admitted in-process at 100 ms, then by the shared side at 250 ms.
    let second = l.acquire_host("t", host(), None).await.unwrap();
    let second_at = Instant::now();
    let (first_at, first) = first.await.unwrap();
    // The first failed over at 150 ms and was sent in-process at 200 ms.
    assert_eq!(first_at - t0, 200 * MS);
    assert!(
        second_at - first_at >= gap,
        "sent {:?} after the failed-over request",
        second_at - first_at
    );
    drop((first, second));
}

/// An admission given back unsent (a middleware chose not to send) costs
/// the next request nothing, on either side: the primary's admission and
/// the local send record are both taken back.
#[tokio::test(start_paused = true)]
async fn an_abandoned_permit_costs_the_next_request_nothing() {
    let pacing = || {
        Pacing::builder()
            .min_delay(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let l = FallbackLimiter::new(DomainLimiter::new(pacing()), DomainLimiter::new(pacing()));
    let first = l.acquire_host("t", host(), None).await.unwrap();
    first.abandon();
    let t = Instant::now();
    let next = l.acquire_host("t", host(), None).await.unwrap();
    assert_eq!(
        t.elapsed(),
        Duration::ZERO,
        "the unsent request held the host"
    );
    // A released one does hold it.
    next.release();
    let t = Instant::now();
    drop(l.acquire_host("t", host(), None).await.unwrap());
    assert_eq!(t.elapsed(), Duration::from_secs(1));
}

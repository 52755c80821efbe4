//! The reqwest middleware and the tower layer against a real HTTP server on
//! loopback that records, per host, when each request arrived and when its
//! response ended. Pacing is checked from that record.

mod priorities;
mod rate_limits;
mod reqwest_client;
mod reqwest_redirects;
mod tower_client;
mod tower_redirects;
mod weights;

use std::future::Future;
use std::time::Duration;

use redislimit::pacing::PacingBuilder;
use redislimit::{DomainLimiter, Pacing};
use redislimit_tests::Upstream;
use redislimit_tests::record::Request;

pub(crate) const MS: Duration = Duration::from_millis(1);
pub(crate) const HOSTS: [&str; 3] = ["a.test", "b.test", "c.test"];

pub(crate) fn domain_limiter(pacing: impl FnOnce(PacingBuilder) -> PacingBuilder) -> DomainLimiter {
    DomainLimiter::new(pacing(Pacing::builder()).build().unwrap())
}

/// Fails the test instead of hanging.
pub(crate) async fn bounded<T>(secs: u64, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("did not finish within {secs}s"))
}

/// Hosts that redirect to `t.test` in the redirect scenarios.
pub(crate) const REDIRECTORS: [&str; 5] = ["r1.test", "r2.test", "r3.test", "r4.test", "r5.test"];

/// Two redirects from each of r1..r5.test to t.test, and three direct
/// t.test requests, all at once.
pub(crate) fn redirect_scenario(upstream: &Upstream) -> Vec<String> {
    let mut urls = Vec::new();
    for host in REDIRECTORS {
        for n in 0..2 {
            let to = upstream.url("t.test", &format!("/?via={host}&n={n}"));
            urls.push(upstream.redirect_url(host, &to, 302));
        }
    }
    for n in 0..3 {
        urls.push(upstream.url("t.test", &format!("/?direct={n}")));
    }
    urls
}

/// The requests of `all` to `host`, in arrival order.
pub(crate) fn on(all: &[Request], host: &str) -> Vec<Request> {
    all.iter().filter(|r| r.host == host).cloned().collect()
}

/// After `r.test` redirected to a `t.test` URL that answered 429 with a
/// `hold`, and both hosts were asked once more: only `t.test` was held.
pub(crate) fn assert_only_the_target_was_held(upstream: &Upstream, hold: std::time::Duration) {
    let all = upstream.recorder().all();
    let (target, redirector) = (on(&all, "t.test"), on(&all, "r.test"));
    assert_eq!((target.len(), redirector.len()), (2, 2), "{all:?}");
    assert!(
        target[1].send - target[0].send >= hold,
        "t.test was not held: its next request came {:?} after the 429",
        target[1].send - target[0].send
    );
    assert!(
        redirector[1].send < target[0].send + hold,
        "r.test was held for t.test's 429: its next request came {:?} after it",
        redirector[1].send - target[0].send
    );
}

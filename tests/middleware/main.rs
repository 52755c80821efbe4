//! The reqwest middleware and the tower layer against a real HTTP server on
//! loopback that records, per host, when each request arrived and when its
//! response ended. Pacing is checked from that record.

mod reqwest_client;
mod tower_client;
mod tower_redirects;

use std::future::Future;
use std::time::Duration;

use redislimit::{DomainLimiter, Pacing, PacingBuilder};

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

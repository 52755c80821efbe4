//! `FallbackLimiter`: a shared limiter, and in-process pacing when it is unavailable.

use std::time::Duration;

use tokio::time::Instant;

use crate::{BoxFuture, DomainLimiter, Error, HostKey, Limiter, Permit};

/// Paces through `primary` (typically a Redis-backed limiter) and, whenever
/// it fails with [`Error::Unavailable`], re-runs the same acquire on an
/// in-process [`DomainLimiter`], so retrieval goes on while the shared
/// backend is away. Every other error (a blown wait budget, a URL without
/// a host) is returned as it is.
///
/// Hooks are reported once per decision: the primary reports nothing for
/// an acquire it could not decide (only `on_error`), and the fallback
/// reports the wait it then makes. Penalties go to both limiters, so the
/// fallback honours a `Retry-After` seen while the primary was healthy.
///
/// ```
/// use redislimit::{DomainLimiter, FallbackLimiter, Limiter, Pacing};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), redislimit::Error> {
/// // Any limiter can be the primary; usually it is `RedisLimiter::with_fallback()`.
/// let limiter = FallbackLimiter::new(
///     DomainLimiter::new(Pacing::default()),
///     DomainLimiter::new(Pacing::default()),
/// );
/// let url = "https://example.com/".parse().unwrap();
/// drop(limiter.acquire("docs", &url, None).await?);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FallbackLimiter<P> {
    primary: P,
    fallback: DomainLimiter,
}

impl<P: Limiter> FallbackLimiter<P> {
    /// Paces through `primary`, and through `fallback` while it is unavailable.
    pub fn new(primary: P, fallback: DomainLimiter) -> Self {
        Self { primary, fallback }
    }

    /// The limiter tried first.
    pub fn primary(&self) -> &P {
        &self.primary
    }

    /// The in-process limiter used while the primary is unavailable.
    pub fn fallback(&self) -> &DomainLimiter {
        &self.fallback
    }
}

impl<P: Limiter> Limiter for FallbackLimiter<P> {
    fn acquire_host<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<Permit, Error>> {
        Box::pin(async move {
            match self
                .primary
                .acquire_host(engine, host.clone(), deadline)
                .await
            {
                Err(err) if err.is_unavailable() => {
                    tracing::warn!(host = %host, error = %err, "pacing in-process: the shared limiter is unavailable");
                    self.fallback.acquire_host(engine, host, deadline).await
                }
                result => result,
            }
        })
    }

    fn penalize_host<'a>(
        &'a self,
        host: HostKey,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.fallback.penalize_host(host.clone(), hold).await?;
            match self.primary.penalize_host(host, hold).await {
                // Reported by the primary; the fallback holds the host.
                Err(err) if err.is_unavailable() => Ok(()),
                result => result,
            }
        })
    }
}

//! `FallbackLimiter`: a shared limiter on top of in-process pacing that
//! carries on alone while the shared one is unavailable.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::hooks::WaitReport;
use crate::{
    BoxFuture, DomainLimiter, Error, Hooks, HostKey, Limiter, NoHooks, Permit, WaitOutcome,
};

/// Paces every request through an in-process [`DomainLimiter`] first and
/// then through `primary` (typically a Redis-backed limiter); when the
/// primary fails with [`Error::Unavailable`], the in-process admission
/// stands alone, so retrieval goes on while the shared backend is away.
/// Every other error (a blown wait budget, a URL without a host) is
/// returned as it is.
///
/// The in-process limiter is always consulted, not only during an outage.
/// Its pacing is implied by the shared limit (a replica that keeps the
/// cluster-wide pace keeps its own), so while the primary is healthy it
/// adds no wait; what it adds is memory: it knows this replica's recent
/// requests, so neither losing the primary nor getting it back lets this
/// replica burst, and there is never a second, independent pace running in
/// the same process.
///
/// That memory is of sends, not of admissions: an acquire is admitted
/// in-process first (which keeps this process's FIFO order and in-flight
/// cap) and then waits on the primary, so its request leaves when the
/// primary admits it, and that instant is what the in-process gap and quota
/// count from. An acquire that the primary fails gives its early in-process
/// admission back and queues again for one made now: acquires that fail
/// over together (all the waiters behind a frozen Redis) go out one
/// `min_delay` apart, the first one `min_delay` after the latest request
/// the primary admitted.
///
/// Hooks are reported here, once per decision: give the inner limiters
/// none for waits ([`RedisLimiter::with_fallback`](crate::RedisLimiter::with_fallback)
/// arranges this; the primary still reports its errors). Penalties go to
/// both limiters, so the in-process one honours a `Retry-After` seen while
/// the primary was healthy.
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
    hooks: Arc<dyn Hooks>,
}

impl<P: Limiter> FallbackLimiter<P> {
    /// Paces through `fallback` and then `primary`, and through `fallback`
    /// alone while `primary` is unavailable.
    pub fn new(primary: P, fallback: DomainLimiter) -> Self {
        Self {
            primary,
            fallback,
            hooks: Arc::new(NoHooks),
        }
    }

    /// Reports every decision to `hooks`.
    pub fn with_hooks(mut self, hooks: Arc<dyn Hooks>) -> Self {
        self.hooks = hooks;
        self
    }

    /// The shared limiter.
    pub fn primary(&self) -> &P {
        &self.primary
    }

    /// The in-process limiter.
    pub fn fallback(&self) -> &DomainLimiter {
        &self.fallback
    }
}

/// Records `local`'s request as leaving now, after waiting (at most one
/// `min_delay`) if another request of this process left too recently: an
/// admission by the primary that came back and one made in-process during
/// its absence could otherwise fall together.
async fn leave(local: &mut Permit) {
    while let Err(at) = local.try_send(Instant::now()) {
        tokio::time::sleep_until(at).await;
    }
}

/// An in-process admission awaiting the primary's decision; abandoned
/// (taken back) unless taken out.
struct Provisional(Option<Permit>);

impl Drop for Provisional {
    fn drop(&mut self) {
        if let Some(permit) = self.0.take() {
            permit.abandon();
        }
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
            let mut report = WaitReport::new(&*self.hooks, engine, &host, Instant::now());
            // Until the primary has decided, this admission is provisional:
            // a refusal or a dropped future takes it back.
            let mut local = Provisional(Some(
                self.fallback
                    .acquire_host(engine, host.clone(), deadline)
                    .await
                    .map_err(|e| report.fail(e))?,
            ));
            match self
                .primary
                .acquire_host(engine, host.clone(), deadline)
                .await
            {
                Ok(shared) => {
                    // The request leaves now, perhaps long after the local
                    // admission (the primary may have made it wait): the
                    // local gap and quota count from now, so the next send
                    // keeps this process's own spacing whoever admits it.
                    let mut local = local.0.take();
                    if let Some(local) = &mut local {
                        leave(local).await;
                    }
                    let waited = report.finish(WaitOutcome::Acquired);
                    Ok(Permit::new(host, waited, move || {
                        drop(shared);
                        drop(local);
                    }))
                }
                Err(err) if err.is_unavailable() => {
                    // The primary may have taken the budget to fail.
                    let now = Instant::now();
                    if let Some(deadline) = deadline
                        && now >= deadline
                    {
                        return Err(report.over_budget(now, deadline, now));
                    }
                    tracing::warn!(host = %host, error = %err, "pacing in-process: the shared limiter is unavailable");
                    // The provisional admission was made before the wait on
                    // the primary; sending on it now could follow this
                    // process's last send too closely, and waiters that fail
                    // over together would all go at once. Give it back and
                    // queue again for a real admission, which waits for the
                    // gap from the latest send this process made.
                    drop(local);
                    let mut local = self
                        .fallback
                        .acquire_host(engine, host.clone(), deadline)
                        .await
                        .map_err(|e| report.fail(e))?;
                    leave(&mut local).await;
                    let waited = report.finish(WaitOutcome::Acquired);
                    Ok(Permit::new(host, waited, move || drop(local)))
                }
                Err(err) => Err(report.fail(err)),
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
                // Reported by the primary; the in-process limiter holds the host.
                Err(err) if err.is_unavailable() => Ok(()),
                result => result,
            }
        })
    }
}

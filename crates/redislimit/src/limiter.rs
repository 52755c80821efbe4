//! The `Limiter` trait every pacing backend implements, and the `Permit` it grants.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use url::Url;

use crate::{Error, HostKey, Permit, Snapshot};

/// A boxed, `Send` future, as the object-safe [`Limiter`] methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Paces requests per host.
///
/// Implemented by [`DomainLimiter`](crate::DomainLimiter) (in-process) and by
/// the Redis-backed limiter; usable as `Arc<dyn Limiter>`, which is how the
/// middleware crates hold one.
///
/// Cancellation is dropping the future returned by [`acquire`](Self::acquire):
/// a dropped acquire leaves nothing booked and frees its place in the queue.
///
/// ```
/// use std::sync::Arc;
/// use redislimit::{DomainLimiter, Limiter, Pacing};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), redislimit::Error> {
/// let limiter: Arc<dyn Limiter> = Arc::new(DomainLimiter::new(Pacing::default()));
/// let url = "https://example.com/robots.txt".parse().unwrap();
/// let permit = limiter.acquire("docs", &url, None).await?;
/// assert_eq!(permit.host().as_str(), "example.com");
/// // ... send the request and read the body, then:
/// permit.release();
/// # Ok(()) }
/// ```
pub trait Limiter: Send + Sync + fmt::Debug {
    /// Waits until a request to `host` may be sent, paced as `request`
    /// says: its [`priority`](RequestPacing::with_priority) orders this
    /// process's waiters for the host, higher first and in arrival order
    /// among equals, and its [`weight`](RequestPacing::with_weight) is how
    /// many slots of the cap and units of the quota it takes. Across
    /// replicas, each process orders its own waiters.
    ///
    /// `engine` labels the caller in hooks and logs. With a `deadline`, a
    /// wait that would end after it fails at once with
    /// [`Error::WaitBudget`] instead of sleeping the budget out.
    fn acquire_with<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> BoxFuture<'a, Result<Permit, Error>>;

    /// [`acquire_with`](Self::acquire_with) for a request paced by
    /// default (middle priority, weight 1).
    fn acquire_host<'a>(
        &'a self,
        engine: &'a str,
        host: HostKey,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<Permit, Error>> {
        self.acquire_with(engine, host, deadline, RequestPacing::default())
    }

    /// Holds `host` back for `hold` (capped by the configured maximum
    /// penalty), counted from now. It only ever extends a hold; it never
    /// shortens one already in place. A zero `hold` does nothing.
    fn penalize_host<'a>(
        &'a self,
        host: HostKey,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Whether responses from `host` are counted in bytes: its pacing has
    /// a [`max_bytes_per_sec`](crate::pacing::PacingBuilder::max_bytes_per_sec).
    /// The middlewares then count a response's body as it is read and
    /// [`charge_bytes`](Self::charge_bytes) it before its permit goes
    /// back. False by default.
    fn counts_bytes(&self, host: &HostKey) -> bool {
        let _ = host;
        false
    }

    /// Charges `bytes` of a response from `host` against its
    /// [`max_bytes_per_sec`](crate::pacing::PacingBuilder::max_bytes_per_sec):
    /// the host's next send waits until every byte charged so far fits in
    /// that rate. Charges add up (unlike holds); a host that counts no
    /// bytes ignores them. Does nothing by default.
    fn charge_bytes<'a>(&'a self, host: HostKey, bytes: u64) -> BoxFuture<'a, Result<(), Error>> {
        let _ = (host, bytes);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Caps `host`'s requests in flight at `cap` (at least 1) for
    /// `window`, as the host stated (a `RateLimit-Policy` with
    /// `qu=concurrent-requests`, read by `http::rate_limit_concurrency`
    /// with the `http` feature):
    /// the lower of it and the configured cap applies until it lapses or
    /// the host states another. A request heavier than the cap goes alone.
    /// Does nothing by default.
    fn cap_host<'a>(
        &'a self,
        host: HostKey,
        cap: u32,
        window: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let _ = (host, cap, window);
        Box::pin(std::future::ready(Ok(())))
    }

    /// What this limiter shares beyond admissions and penalties (a backoff
    /// gap, requests to adopt, holds to report): for this crate's own
    /// layers, which reach it through [`sealed::Coordination`]. None by
    /// default.
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn coordination(&self, _: sealed::Token) -> Option<&dyn sealed::Coordination> {
        None
    }

    /// What the limiter is doing now: the `top` hosts with the most
    /// acquires waiting (then most in flight) with their queues, requests
    /// in flight, next send and penalty end where known, and where they
    /// are paced; and totals over every host (hosts held, waiting, in
    /// flight). It visits only hosts with acquires waiting, kept in a set
    /// as they queue, and sends nothing anywhere: cheap enough to call
    /// every second on a crawl of millions of hosts. The default reports
    /// nothing (a limiter keeping no state of its own).
    fn snapshot(&self, top: usize) -> Snapshot {
        let _ = top;
        Snapshot::default()
    }

    /// Shuts the limiter down: from now on acquires fail with
    /// [`Error::Closed`], and those waiting wake with it; permits already
    /// granted stay valid and release as usual. The future ends once every
    /// release that is on its way to a shared backend has landed, or at
    /// `deadline`, whichever is first; at the deadline it fails with
    /// [`Error::CloseIncomplete`] (also reported to the hooks), and the
    /// releases still pending end with their leases.
    ///
    /// A program calls it (after dropping its permits) before it ends:
    /// releases go out on spawned tasks, and a runtime that stops first
    /// takes them with it, leaving the host booked in Redis until the lease
    /// runs out. Calling it again waits again. The default does nothing,
    /// for limiters that hold nothing to flush.
    fn close(&self, deadline: Option<Instant>) -> BoxFuture<'_, Result<(), Error>> {
        let _ = deadline;
        Box::pin(std::future::ready(Ok(())))
    }

    /// [`acquire_host`](Self::acquire_host) for the host of `url`; a URL
    /// without a host fails with [`Error::InvalidUrl`].
    fn acquire<'a>(
        &'a self,
        engine: &'a str,
        url: &Url,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<Permit, Error>> {
        match HostKey::from_url(url) {
            Ok(host) => self.acquire_host(engine, host, deadline),
            Err(err) => Box::pin(std::future::ready(Err(err))),
        }
    }

    /// [`penalize_host`](Self::penalize_host) for the host of `url`.
    fn penalize<'a>(&'a self, url: &Url, hold: Duration) -> BoxFuture<'a, Result<(), Error>> {
        match HostKey::from_url(url) {
            Ok(host) => self.penalize_host(host, hold),
            Err(err) => Box::pin(std::future::ready(Err(err))),
        }
    }
}

/// How one request is paced beside the others to its host: its priority
/// and its weight. A pacing middleware reads it from the request's
/// extensions.
///
/// The **priority** orders the waiters of one process for one host: higher
/// first, in arrival order among equals.
///
/// The **weight** (1 unless set) is how much of the host the request
/// takes: it counts as `weight` requests of the in-flight cap
/// ([`max_concurrent`](crate::pacing::PacingBuilder::max_concurrent), and the
/// Redis limiter's cross-replica cap) and `weight` admissions of the
/// [`quota`](crate::pacing::PacingBuilder::quota). A weight of 0, or one above
/// what it must fit in, is refused with [`Error::InvalidWeight`]. A
/// request that does not fit beside those in flight lets lighter ones
/// behind it go first (best fit), without losing its place: it is admitted
/// as soon as its weight fits and nothing ahead of it waits.
///
/// ```
/// use redislimit::RequestPacing;
///
/// let urgent = RequestPacing::new().with_priority(200);
/// assert!(urgent.priority() > RequestPacing::default().priority());
/// let export = RequestPacing::new().with_weight(3);
/// assert_eq!(export.weight(), 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct RequestPacing {
    priority: u8,
    weight: u32,
}

impl RequestPacing {
    /// The priority of a request that sets none: the middle of the range.
    pub const DEFAULT_PRIORITY: u8 = 128;

    /// The default: priority [`DEFAULT_PRIORITY`](Self::DEFAULT_PRIORITY),
    /// weight 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits ahead of the waiters of lower priority (higher goes first;
    /// equal priorities keep their arrival order).
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// Counts as `weight` requests in flight and `weight` admissions of
    /// the quota. Checked when acquiring: 0, or more than the host's cap
    /// or quota, fails with [`Error::InvalidWeight`].
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The priority.
    pub fn priority(&self) -> u8 {
        self.priority
    }

    /// The weight.
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// Checks the weight against what a request must fit in under
    /// `pacing`: its in-flight cap `cap` and its quota.
    pub(crate) fn check_weight(&self, host: &HostKey, cap: u32, quota: u32) -> Result<u32, Error> {
        let limit = heaviest(cap, quota);
        if self.weight == 0 || self.weight > limit {
            return Err(Error::InvalidWeight {
                host: host.to_string(),
                weight: self.weight,
                limit,
            });
        }
        Ok(self.weight)
    }
}

/// The largest weight a host with in-flight cap `cap` and `quota` (0: none)
/// can ever admit.
pub(crate) fn heaviest(cap: u32, quota: u32) -> u32 {
    if quota > 0 { cap.min(quota) } else { cap }
}

impl Default for RequestPacing {
    fn default() -> Self {
        Self {
            priority: Self::DEFAULT_PRIORITY,
            weight: 1,
        }
    }
}

/// One move of a host's adaptive backoff (see
/// [`http::Backoff`](crate::http::Backoff)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) enum BackoffStep {
    /// An overload signal that states no delay: the gap doubles, starting
    /// at `start`, up to `max`.
    Widen {
        /// The first gap.
        start: Duration,
        /// The widest gap.
        max: Duration,
    },
    /// A success while backing off: the gap narrows to three quarters, and
    /// is dropped once below `start`.
    Narrow {
        /// The gap below which the host is back on its own pacing.
        start: Duration,
    },
}

impl BackoffStep {
    /// The gap after this step from `gap` (`None`: not backing off), as
    /// every limiter computes it.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn apply(self, gap: Option<Duration>) -> Option<Duration> {
        match self {
            Self::Widen { start, max } => Some(
                gap.map_or(start, |g| g.saturating_mul(2).max(start))
                    .min(max),
            ),
            Self::Narrow { start } => gap.map(|g| g.mul_f64(0.75)).filter(|g| *g >= start),
        }
    }
}

/// What a limiter shares beyond admissions and penalties, for this
/// crate's own layers only: a trait nothing outside the crate can name,
/// implement or call (see [`Limiter::coordination`]).
pub(crate) mod sealed {
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::{BackoffStep, BoxFuture, Error, HostKey, Permit};

    /// Proof that the caller is this crate.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Token(());

    impl Token {
        pub(crate) fn new() -> Self {
            Self(())
        }
    }

    /// The operations a shared limiter (and a limiter in front of one)
    /// offers this crate's fallback and HTTP layers.
    pub(crate) trait Coordination: Send + Sync {
        /// Counts a request to `host` of `weight` that is already in
        /// flight, sent `ago` without this limiter's admission (a fallback
        /// admitted it while this limiter was unavailable), against its
        /// shared limits, so that nothing else is admitted beside it beyond
        /// them. The permit returned holds its slot until released; `None`
        /// when there is nothing to count it in.
        fn adopt_host<'a>(
            &'a self,
            host: HostKey,
            ago: Duration,
            weight: u32,
        ) -> BoxFuture<'a, Result<Option<Permit>, Error>> {
            let _ = (host, ago, weight);
            Box::pin(std::future::ready(Ok(None)))
        }

        /// Moves `host`'s adaptive backoff gap one `step` in state shared
        /// with every replica, and holds the host for the gap now in force
        /// (capped by the maximum penalty). The future returns that gap,
        /// `None` once the host is back on its own pacing. No future when
        /// no such state is kept: the caller keeps the gap itself (see
        /// [`http::Backoff`](crate::http::Backoff)); a future that fails as
        /// unavailable leaves the caller to do the same.
        #[cfg_attr(not(feature = "http"), allow(dead_code))]
        fn back_off_host<'a>(
            &'a self,
            host: HostKey,
            step: BackoffStep,
        ) -> Option<BoxFuture<'a, Result<Option<Duration>, Error>>> {
            let _ = (host, step);
            None
        }

        /// Tells the limiter's hooks that `host` was held back for `hold`
        /// because of `cause` ([`Hooks::on_hold`](crate::Hooks::on_hold)).
        #[cfg_attr(not(feature = "http"), allow(dead_code))]
        fn report_hold(&self, host: &HostKey, cause: &str, hold: Duration) {
            let _ = (host, cause, hold);
        }

        /// Which part of the shared backend `host`'s state lives on, as far
        /// as it fails apart from the rest (a Redis Cluster master); 0 for
        /// the whole. A fallback keeps its outage shares per part.
        fn failure_domain(&self, host: &HostKey) -> u32 {
            let _ = host;
            0
        }

        /// Whether the shared backend answered any call (an error reply
        /// included) at or after `at`: a wait it named is its answer, one
        /// the limiter's own queues named is not. False by default.
        #[cfg_attr(not(feature = "redis"), allow(dead_code))]
        fn answered_since(&self, at: Instant) -> bool {
            let _ = at;
            false
        }

        /// Whether the part of the shared backend serving `host` is taken
        /// to answer now: its last call answered (a Redis circuit that is
        /// closed). False by default.
        fn answers_for(&self, host: &HostKey) -> bool {
            let _ = host;
            false
        }

        /// Probes the part of the shared backend serving `host` when it
        /// failed to answer moments ago and is due to be asked again (a
        /// cheap call, nothing admitted), so that an answer closes its
        /// circuit. Nothing by default.
        fn probe_host<'a>(&'a self, host: &HostKey) -> BoxFuture<'a, ()> {
            let _ = host;
            Box::pin(std::future::ready(()))
        }
    }
}

/// `limiter`'s [`sealed::Coordination`], if it has one.
pub(crate) fn coordination<L: Limiter + ?Sized>(limiter: &L) -> Option<&dyn sealed::Coordination> {
    limiter.coordination(sealed::Token::new())
}

macro_rules! forward_limiter {
    ($($ty:ty),*) => {$(
        impl<L: Limiter + ?Sized> Limiter for $ty {
            fn acquire_with<'a>(
                &'a self,
                engine: &'a str,
                host: HostKey,
                deadline: Option<Instant>,
                request: RequestPacing,
            ) -> BoxFuture<'a, Result<Permit, Error>> {
                (**self).acquire_with(engine, host, deadline, request)
            }

            fn acquire_host<'a>(
                &'a self,
                engine: &'a str,
                host: HostKey,
                deadline: Option<Instant>,
            ) -> BoxFuture<'a, Result<Permit, Error>> {
                (**self).acquire_host(engine, host, deadline)
            }

            fn penalize_host<'a>(
                &'a self,
                host: HostKey,
                hold: Duration,
            ) -> BoxFuture<'a, Result<(), Error>> {
                (**self).penalize_host(host, hold)
            }

            fn counts_bytes(&self, host: &HostKey) -> bool {
                (**self).counts_bytes(host)
            }

            fn cap_host<'a>(
                &'a self,
                host: HostKey,
                cap: u32,
                window: Duration,
            ) -> BoxFuture<'a, Result<(), Error>> {
                (**self).cap_host(host, cap, window)
            }

            fn charge_bytes<'a>(
                &'a self,
                host: HostKey,
                bytes: u64,
            ) -> BoxFuture<'a, Result<(), Error>> {
                (**self).charge_bytes(host, bytes)
            }

            #[allow(private_interfaces)]
            fn coordination(&self, token: sealed::Token) -> Option<&dyn sealed::Coordination> {
                (**self).coordination(token)
            }

            fn snapshot(&self, top: usize) -> Snapshot {
                (**self).snapshot(top)
            }

            fn close(&self, deadline: Option<Instant>) -> BoxFuture<'_, Result<(), Error>> {
                (**self).close(deadline)
            }
        }
    )*};
}

forward_limiter!(Arc<L>, Box<L>, &L);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_is_object_safe_and_permit_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Permit>();
        assert_send_sync::<Arc<dyn Limiter>>();
    }
}

//! `PaceOptions`: what an HTTP middleware decides per request besides the
//! limiter itself, shared by the reqwest and tower integrations.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use http::{Extensions, HeaderMap, StatusCode};
use tokio::time::Instant;

use super::backoff::Backoff;
use super::rate_limit::{Budget, rate_limit_budget, rate_limit_concurrency};
use super::retry_after::{penalty_from, retry_after};
use super::{Engine, MaxWait};
use crate::{HostKey, Limiter};

/// The per-request choices of a pacing middleware (both
/// `PacingMiddleware::with_options` and `PaceLayer::with_options` take
/// one): which engine label a request waits under, how long it may wait,
/// what a `429`/`503` without a usable `Retry-After` costs its host,
/// whether rate limit headers are honored, and the adaptive backoff.
///
/// ```
/// use std::time::Duration;
/// use redislimit::http::{PaceOptions, RateLimitHeaders};
///
/// let options = PaceOptions::default()
///     .with_engine("crawler")
///     .with_max_wait(Duration::from_secs(30))
///     .with_default_penalty(Duration::from_secs(5))
///     .with_rate_limit_headers(RateLimitHeaders::Ignore);
/// # drop(options);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaceOptions {
    engine: Engine,
    max_wait: Option<Duration>,
    default_penalty: Option<Duration>,
    rate_limit_headers: RateLimitHeaders,
    backoff: Option<Backoff>,
}

/// Whether a response's `RateLimit` field and vendor `X-RateLimit-*`
/// headers pace its host (see [`rate_limit_hold`](super::rate_limit_hold)).
/// `Retry-After` is read either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum RateLimitHeaders {
    /// A spent budget holds the host until its reset, and a low one
    /// spreads the rest of it up to the reset. The default.
    #[default]
    Honor,
    /// The headers are not read.
    Ignore,
}

impl Default for PaceOptions {
    /// Engine `default`, no maximum wait, no default penalty, rate limit
    /// headers read, [`Backoff::default`] on.
    fn default() -> Self {
        Self {
            engine: Engine::new("default"),
            max_wait: None,
            default_penalty: None,
            rate_limit_headers: RateLimitHeaders::Honor,
            backoff: Some(Backoff::default()),
        }
    }
}

impl PaceOptions {
    /// The engine label for requests that carry no [`Engine`] extension.
    pub fn with_engine(mut self, engine: impl Into<Cow<'static, str>>) -> Self {
        self.engine = Engine::new(engine);
        self
    }

    /// The longest any request may wait for its turn.
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// The penalty for a `429` or `503` without a usable `Retry-After`.
    pub fn with_default_penalty(mut self, penalty: Duration) -> Self {
        self.default_penalty = Some(penalty);
        self
    }

    /// The engine a request waits under: its own [`Engine`] extension, or
    /// the default.
    pub fn engine<'a>(&'a self, extensions: &'a Extensions) -> &'a Engine {
        extensions.get::<Engine>().unwrap_or(&self.engine)
    }

    /// How a request is paced beside the others to its host: its
    /// [`RequestPacing`](crate::RequestPacing) extension, or the default.
    pub fn request_pacing(&self, extensions: &Extensions) -> crate::RequestPacing {
        extensions
            .get::<crate::RequestPacing>()
            .copied()
            .unwrap_or_default()
    }

    /// The instant a request's wait must end by: the shorter of its own
    /// timeout (when the client exposes one) and the maximum wait, which a
    /// [`MaxWait`] extension on the request replaces.
    pub fn deadline(
        &self,
        extensions: &Extensions,
        request_timeout: Option<Duration>,
    ) -> Option<Instant> {
        let max_wait = extensions.get::<MaxWait>().map(|m| m.0).or(self.max_wait);
        let budget = match (request_timeout, max_wait) {
            (Some(own), Some(max)) => Some(own.min(max)),
            (own, max) => own.or(max),
        };
        budget.map(|b| crate::pacing::after(Instant::now(), b))
    }

    /// Whether the `RateLimit` field and vendor `X-RateLimit-*` headers
    /// pace a host (honored by default). `Retry-After` is read either way.
    pub fn with_rate_limit_headers(mut self, headers: RateLimitHeaders) -> Self {
        self.rate_limit_headers = headers;
        self
    }

    /// Widens a host's gap on overload signals that carry no delay, and
    /// narrows it back on success (see [`Backoff`]); `None` switches it
    /// off. On by default, from 1 s up to 10 minutes.
    pub fn with_backoff(mut self, backoff: Option<Backoff>) -> Self {
        self.backoff = backoff;
        self
    }

    /// What `host` answering `status` with `headers` asks of it, to
    /// [`apply`](Self::apply): a `Retry-After` on a `429`/`503` (which
    /// takes precedence) or a spent rate limit budget decides alone; else,
    /// for a `429`, `503` or other `5xx`, a widened backoff gap; else,
    /// while the host is backing off, a narrowed one. A low budget's
    /// spread (and for a `429`/`503` the default penalty) is the least any
    /// of these holds, and alone it holds a host that is not backing off.
    /// A cap on requests in flight the response states
    /// ([`rate_limit_concurrency`]) comes along with any of these, or
    /// alone. `None` when the host may go on at its pacing. Cheap: it reads
    /// headers only.
    pub fn react(
        &self,
        host: &HostKey,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Option<Reaction> {
        let cap = (self.rate_limit_headers == RateLimitHeaders::Honor)
            .then(|| rate_limit_concurrency(headers))
            .flatten();
        match (self.react_kind(host, status, headers), cap) {
            (None, None) => None,
            (Some(reaction), cap) => Some(Reaction { cap, ..reaction }),
            (None, cap) => Some(Reaction { kind: None, cap }),
        }
    }

    /// [`react`](Self::react) but for a stated cap on requests in flight.
    fn react_kind(
        &self,
        host: &HostKey,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Option<Reaction> {
        // A stated delay or a spent budget decides alone; a low budget is
        // a floor under whatever else the response asks for.
        let low = match self.stated(status, headers) {
            Some(ServerSignal::BudgetLow(hold)) => Some(ServerSignal::BudgetLow(hold)),
            Some(signal) => return Some(reaction(Kind::Hold(signal))),
            None => None,
        };
        let default = matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        )
        .then_some(self.default_penalty)
        .flatten()
        .map(ServerSignal::DefaultPenalty);
        let floor = longer(low, default);
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            return match self.backoff {
                Some(_) => Some(reaction(Kind::Widen { floor })),
                None => floor.map(|f| reaction(Kind::Hold(f))),
            };
        }
        let backing_off = self
            .backoff
            .as_ref()
            .is_some_and(|b| b.is_backing_off(host));
        if backing_off {
            return Some(reaction(Kind::Narrow { floor }));
        }
        floor.map(|f| reaction(Kind::Hold(f)))
    }

    /// What a request to a host that failed without a response asks of it:
    /// for a `transport` failure (a timeout, a refused or reset connection;
    /// see [`is_transport_failure`](super::is_transport_failure)), a
    /// widened backoff gap.
    pub fn react_to_failure(&self, transport: bool) -> Option<Reaction> {
        (transport && self.backoff.is_some()).then_some(reaction(Kind::Widen { floor: None }))
    }

    /// Applies `reaction` to `host` through `limiter`: holds the host (as
    /// [`Limiter::penalize_host`] does, for every replica sharing the
    /// limiter) and moves its backoff gap, in the limiter's shared state
    /// when it keeps one (as `RedisLimiter` does) and in this process
    /// otherwise. Returns what was applied, `None` when nothing was (a
    /// backoff narrowed away). Failures of the limiter are its hooks' to
    /// report: the response itself is still good.
    pub async fn apply(
        &self,
        limiter: &dyn Limiter,
        host: HostKey,
        reaction: Reaction,
    ) -> Option<ServerSignal> {
        if let Some((cap, window)) = reaction.cap {
            let _ = limiter.cap_host(host.clone(), cap, window).await;
        }
        let signal = match reaction.kind? {
            Kind::Hold(signal) => {
                let _ = limiter.penalize_host(host.clone(), signal.hold()).await;
                signal
            }
            Kind::Widen { floor } => {
                let gap = self.backoff.as_ref()?.widen_through(limiter, &host).await?;
                match floor {
                    Some(floor) if floor.hold() > gap => {
                        let _ = limiter.penalize_host(host.clone(), floor.hold()).await;
                        floor
                    }
                    _ => ServerSignal::Backoff(gap),
                }
            }
            Kind::Narrow { floor } => {
                let gap = self.backoff.as_ref()?.narrow_through(limiter, &host).await;
                match (gap, floor) {
                    (gap, Some(floor)) if gap.is_none_or(|g| floor.hold() > g) => {
                        let _ = limiter.penalize_host(host.clone(), floor.hold()).await;
                        floor
                    }
                    (Some(gap), _) => ServerSignal::Recovering(gap),
                    (None, _) => {
                        tracing::debug!(host = %host, "recovered: back on its own pacing");
                        return None;
                    }
                }
            }
        };
        if let Some(shared) = crate::limiter::coordination(limiter) {
            shared.report_hold(&host, signal.cause(), signal.hold());
        }
        let hold_ms = u64::try_from(signal.hold().as_millis()).unwrap_or(u64::MAX);
        match signal {
            ServerSignal::Recovering(_) => {
                tracing::debug!(host = %host, hold_ms, "recovering: backing off less");
            }
            _ => {
                tracing::info!(host = %host, cause = signal.cause(), hold_ms, "upstream asked to back off");
            }
        }
        Some(signal)
    }

    /// What `status` and `headers` state themselves: `Retry-After` on a
    /// `429`/`503`, then the rate limit budget.
    fn stated(&self, status: StatusCode, headers: &HeaderMap) -> Option<ServerSignal> {
        let now = SystemTime::now();
        if matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) && let Some(delay) = retry_after(headers, now)
        {
            return Some(ServerSignal::RetryAfter(delay));
        }
        if self.rate_limit_headers == RateLimitHeaders::Ignore {
            return None;
        }
        match rate_limit_budget(headers, now)? {
            Budget::Spent(hold) => Some(ServerSignal::BudgetSpent(hold)),
            Budget::Low(hold) => Some(ServerSignal::BudgetLow(hold)),
        }
    }

    /// How long a response asks its host to be left alone: see
    /// [`penalty`](super::penalty), with this default, reading the rate
    /// limit headers unless switched off.
    pub fn penalty(&self, status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
        penalty_from(
            status,
            headers,
            self.default_penalty,
            self.rate_limit_headers == RateLimitHeaders::Honor,
        )
    }
}

/// What a response (or a failed request) asked of its host, computed by
/// [`PaceOptions::react`]; [`PaceOptions::apply`] carries it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaction {
    kind: Option<Kind>,
    /// A cap on requests in flight the host stated, and for how long.
    cap: Option<(u32, Duration)>,
}

/// A reaction of `kind` alone.
fn reaction(kind: Kind) -> Reaction {
    Reaction {
        kind: Some(kind),
        cap: None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A hold the response states, or the default penalty.
    Hold(ServerSignal),
    /// Widen the backoff gap, holding the host no less than `floor` (the
    /// default penalty, or a low budget's spread).
    Widen { floor: Option<ServerSignal> },
    /// Narrow the backoff gap, holding the host no less than `floor`.
    Narrow { floor: Option<ServerSignal> },
}

/// Of two optional holds, the longer.
fn longer(a: Option<ServerSignal>, b: Option<ServerSignal>) -> Option<ServerSignal> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.hold() > a.hold() { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// What a host asked for and the hold it got: what a pacing middleware
/// applied after a response, also put in the response's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerSignal {
    /// A `Retry-After` on a `429` or `503`: held for its delay.
    RetryAfter(Duration),
    /// Rate limit headers saying the budget is spent: held until the reset.
    BudgetSpent(Duration),
    /// Rate limit headers saying little budget is left: held for the gap
    /// that spreads the rest up to the reset.
    BudgetLow(Duration),
    /// A `429` or `503` without a stated delay: held for the configured
    /// default penalty (longer than the backoff gap, or backoff off).
    DefaultPenalty(Duration),
    /// An overload signal without a stated delay (a bare `429`/`503`,
    /// another `5xx`, a transport failure): held for the widened backoff
    /// gap.
    Backoff(Duration),
    /// A success while backing off: held for the narrowed gap.
    Recovering(Duration),
}

impl ServerSignal {
    /// How long the host was held for.
    pub fn hold(self) -> Duration {
        match self {
            Self::RetryAfter(d)
            | Self::BudgetSpent(d)
            | Self::BudgetLow(d)
            | Self::DefaultPenalty(d)
            | Self::Backoff(d)
            | Self::Recovering(d) => d,
        }
    }

    /// A short name of the cause, for logs and reports: `retry-after`,
    /// `budget-spent`, `budget-low`, `default-penalty`, `backoff` or
    /// `recovering`.
    pub fn cause(self) -> &'static str {
        match self {
            Self::RetryAfter(_) => "retry-after",
            Self::BudgetSpent(_) => "budget-spent",
            Self::BudgetLow(_) => "budget-low",
            Self::DefaultPenalty(_) => "default-penalty",
            Self::Backoff(_) => "backoff",
            Self::Recovering(_) => "recovering",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_budget_is_the_shorter_of_the_request_timeout_and_the_maximum_wait() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let plain = Extensions::new();
        let none = PaceOptions::default();
        assert_eq!(none.deadline(&plain, None), None);
        assert_eq!(none.deadline(&plain, Some(s(3))), Some(now + s(3)));
        let capped = PaceOptions::default().with_max_wait(s(2));
        assert_eq!(capped.deadline(&plain, None), Some(now + s(2)));
        assert_eq!(capped.deadline(&plain, Some(s(3))), Some(now + s(2)));
        assert_eq!(capped.deadline(&plain, Some(s(1))), Some(now + s(1)));
        // A request's own MaxWait replaces the middleware's, either way;
        // its timeout still bounds it.
        let mut own = Extensions::new();
        own.insert(MaxWait(s(5)));
        assert_eq!(capped.deadline(&own, None), Some(now + s(5)));
        assert_eq!(capped.deadline(&own, Some(s(4))), Some(now + s(4)));
        own.insert(MaxWait(s(1)));
        assert_eq!(capped.deadline(&own, None), Some(now + s(1)));
        assert_eq!(none.deadline(&own, None), Some(now + s(1)));
        // A huge budget is far away, not a panic.
        own.insert(MaxWait(Duration::MAX));
        assert!(
            none.deadline(&own, None)
                .is_some_and(|d| d > now + s(86_400))
        );
    }

    #[test]
    fn a_request_can_name_its_own_engine() {
        let options = PaceOptions::default().with_engine("crawler");
        let mut extensions = Extensions::new();
        assert_eq!(options.engine(&extensions).as_str(), "crawler");
        extensions.insert(Engine::new("search"));
        assert_eq!(options.engine(&extensions).as_str(), "search");
    }

    /// Reacts to `status` (no headers) and applies it through `limiter`.
    async fn answer(
        options: &PaceOptions,
        limiter: &crate::DomainLimiter,
        host: &HostKey,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Option<ServerSignal> {
        let reaction = options.react(host, status, headers)?;
        options.apply(limiter, host.clone(), reaction).await
    }

    #[tokio::test(start_paused = true)]
    async fn overload_without_a_stated_delay_backs_off_and_success_narrows() {
        let limiter = crate::DomainLimiter::new(crate::Pacing::default());
        let host = HostKey::parse("http://a.test/").unwrap();
        let options = PaceOptions::default().with_default_penalty(Duration::from_millis(1500));
        let none = HeaderMap::new();
        let s = Duration::from_secs;
        let answer = |status: u16, headers: &HeaderMap, options: &PaceOptions, host: &HostKey| {
            let status = StatusCode::from_u16(status).unwrap();
            let (options, host, headers) = (options.clone(), host.clone(), headers.clone());
            let limiter = &limiter;
            async move { answer(&options, limiter, &host, status, &headers).await }
        };
        // A 500 widens from 1 s; a 503 to 2 s; a 429 to 4 s. A 503 below
        // the default penalty gets the penalty.
        assert_eq!(
            answer(500, &none, &options, &host).await,
            Some(ServerSignal::Backoff(s(1)))
        );
        let fresh = HostKey::parse("http://c.test/").unwrap();
        assert_eq!(
            answer(503, &none, &options, &fresh).await,
            Some(ServerSignal::DefaultPenalty(Duration::from_millis(1500)))
        );
        assert_eq!(
            answer(503, &none, &options, &host).await,
            Some(ServerSignal::Backoff(s(2)))
        );
        assert_eq!(
            answer(429, &none, &options, &host).await,
            Some(ServerSignal::Backoff(s(4)))
        );
        // The limiter holds the host for it.
        let start = Instant::now();
        limiter
            .acquire_host("t", host.clone(), None)
            .await
            .unwrap()
            .release();
        assert_eq!(start.elapsed(), s(4));
        // A stated delay wins and leaves the gap alone.
        let mut stated = HeaderMap::new();
        stated.insert(http::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(
            answer(429, &stated, &options, &host).await,
            Some(ServerSignal::RetryAfter(s(7)))
        );
        // Successes narrow it by a quarter each, down to the host's pacing.
        assert_eq!(
            answer(200, &none, &options, &host).await,
            Some(ServerSignal::Recovering(s(3)))
        );
        assert_eq!(
            answer(404, &none, &options, &host).await,
            Some(ServerSignal::Recovering(Duration::from_millis(2250)))
        );
        // A host that is not backing off costs nothing on success.
        let other = HostKey::parse("http://b.test/").unwrap();
        assert_eq!(options.react(&other, StatusCode::OK, &none), None);
        // Without backoff: only the default penalty, and only for 429/503.
        let off = options.clone().with_backoff(None);
        assert_eq!(
            off.react(&other, StatusCode::INTERNAL_SERVER_ERROR, &none),
            None
        );
        assert_eq!(
            answer(503, &none, &off, &other).await,
            Some(ServerSignal::DefaultPenalty(Duration::from_millis(1500)))
        );
        assert_eq!(off.react(&other, StatusCode::OK, &none), None);
        // A transport failure widens; another error does not.
        let reaction = options.react_to_failure(true).unwrap();
        assert_eq!(
            options.apply(&limiter, other.clone(), reaction).await,
            Some(ServerSignal::Backoff(s(1)))
        );
        assert_eq!(options.react_to_failure(false), None);
        assert_eq!(off.react_to_failure(true), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stated_concurrency_caps_the_host_for_its_window() {
        use crate::{DomainLimiter, Pacing};
        let host = HostKey::parse("http://a.test/").unwrap();
        let options = PaceOptions::default();
        let mut headers = HeaderMap::new();
        headers.insert(
            "ratelimit-policy",
            r#""conc";q=1;qu="concurrent-requests";w=10"#.parse().unwrap(),
        );
        let reaction = options.react(&host, StatusCode::OK, &headers).unwrap();
        assert_eq!(
            reaction,
            Reaction {
                kind: None,
                cap: Some((1, Duration::from_secs(10)))
            }
        );
        let pacing = Pacing::builder().max_concurrent(3).build().unwrap();
        let limiter = DomainLimiter::new(pacing);
        let first = limiter.acquire_host("t", host.clone(), None).await.unwrap();
        // Nothing to hold: no signal, but the cap is applied.
        assert_eq!(options.apply(&limiter, host.clone(), reaction).await, None);
        let second = limiter.acquire_host("t", host.clone(), None);
        let waited = tokio::time::timeout(Duration::from_secs(1), second).await;
        assert!(waited.is_err(), "a second request beside the first");
        drop(first);
        drop(limiter.acquire_host("t", host.clone(), None).await.unwrap());
        // Once the window is over, the configured cap of 3 again.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            let permit = limiter.acquire_host("t", host.clone(), None);
            held.push(tokio::time::timeout(Duration::ZERO, permit).await.unwrap());
        }
        assert_eq!(held.len(), 3);
        // Ignored headers state no cap either.
        let off = options.with_rate_limit_headers(RateLimitHeaders::Ignore);
        assert_eq!(off.react(&host, StatusCode::OK, &headers), None);
    }

    #[test]
    fn a_low_budget_is_spread_and_a_spent_one_held_until_the_reset() {
        let host = HostKey::parse("http://a.test/").unwrap();
        let options = PaceOptions::default();
        let mut headers = HeaderMap::new();
        headers.insert("ratelimit", r#""api";r=4;t=20"#.parse().unwrap());
        headers.insert("ratelimit-policy", r#""api";q=100;w=60"#.parse().unwrap());
        assert_eq!(
            options.react(&host, StatusCode::OK, &headers),
            Some(reaction(Kind::Hold(ServerSignal::BudgetLow(
                Duration::from_secs(5)
            ))))
        );
        headers.insert("ratelimit", r#""api";r=0;t=20"#.parse().unwrap());
        assert_eq!(
            options.react(&host, StatusCode::OK, &headers),
            Some(reaction(Kind::Hold(ServerSignal::BudgetSpent(
                Duration::from_secs(20)
            ))))
        );
        // A low budget on an overload is a floor under the backoff, not
        // instead of it; on a success while backing off, under the narrowing.
        headers.insert("ratelimit", r#""api";r=4;t=20"#.parse().unwrap());
        assert_eq!(
            options.react(&host, StatusCode::SERVICE_UNAVAILABLE, &headers),
            Some(reaction(Kind::Widen {
                floor: Some(ServerSignal::BudgetLow(Duration::from_secs(5)))
            }))
        );
        options.backoff.as_ref().unwrap().widen(&host);
        assert_eq!(
            options.react(&host, StatusCode::OK, &headers),
            Some(reaction(Kind::Narrow {
                floor: Some(ServerSignal::BudgetLow(Duration::from_secs(5)))
            }))
        );
        // Switched off: a 200 asks nothing (but the narrowing).
        let off = options.with_rate_limit_headers(RateLimitHeaders::Ignore);
        assert_eq!(
            off.react(&host, StatusCode::OK, &headers),
            Some(reaction(Kind::Narrow { floor: None }))
        );
        let fresh = HostKey::parse("http://fresh.test/").unwrap();
        assert_eq!(off.react(&fresh, StatusCode::OK, &headers), None);
    }

    #[test]
    fn the_default_penalty_applies_only_without_retry_after() {
        let options = PaceOptions::default().with_default_penalty(Duration::from_secs(5));
        let mut headers = HeaderMap::new();
        assert_eq!(
            options.penalty(StatusCode::TOO_MANY_REQUESTS, &headers),
            Some(Duration::from_secs(5))
        );
        headers.insert(http::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(
            options.penalty(StatusCode::TOO_MANY_REQUESTS, &headers),
            Some(Duration::from_secs(2))
        );
        assert_eq!(options.penalty(StatusCode::OK, &headers), None);
    }
}

//! `PaceOptions`: what an HTTP middleware decides per request besides the
//! limiter itself, shared by the reqwest and tower integrations.

use std::borrow::Cow;
use std::time::Duration;

use http::{Extensions, HeaderMap, StatusCode};
use tokio::time::Instant;

use super::retry_after::penalty_from;
use super::{Engine, MaxWait};

/// The per-request choices of a pacing middleware: which engine label a
/// request waits under, how long it may wait, and what a `429`/`503`
/// without a usable `Retry-After` costs its host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaceOptions {
    engine: Engine,
    max_wait: Option<Duration>,
    default_penalty: Option<Duration>,
    rate_limit_headers: bool,
}

impl Default for PaceOptions {
    /// Engine `default`, no maximum wait, no default penalty, rate limit
    /// headers read.
    fn default() -> Self {
        Self {
            engine: Engine::new("default"),
            max_wait: None,
            default_penalty: None,
            rate_limit_headers: true,
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
    /// hold a host whose budget they say is spent (on by default; see
    /// [`rate_limit_hold`](super::rate_limit_hold)). `Retry-After` is read
    /// either way.
    pub fn with_rate_limit_headers(mut self, read: bool) -> Self {
        self.rate_limit_headers = read;
        self
    }

    /// How long a response asks its host to be left alone: see
    /// [`penalty`](super::penalty), with this default, reading the rate
    /// limit headers unless switched off.
    pub fn penalty(&self, status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
        penalty_from(
            status,
            headers,
            self.default_penalty,
            self.rate_limit_headers,
        )
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

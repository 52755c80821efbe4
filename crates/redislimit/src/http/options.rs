//! `PaceOptions`: what an HTTP middleware decides per request besides the
//! limiter itself, shared by the reqwest and tower integrations.

use std::borrow::Cow;
use std::time::Duration;

use http::{Extensions, HeaderMap, StatusCode};
use tokio::time::Instant;

use super::backoff::Backoff;
use super::retry_after::penalty_from;
use super::{Engine, MaxWait};
use crate::HostKey;

/// The per-request choices of a pacing middleware: which engine label a
/// request waits under, how long it may wait, and what a `429`/`503`
/// without a usable `Retry-After` costs its host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaceOptions {
    engine: Engine,
    max_wait: Option<Duration>,
    default_penalty: Option<Duration>,
    rate_limit_headers: bool,
    backoff: Option<Backoff>,
}

impl Default for PaceOptions {
    /// Engine `default`, no maximum wait, no default penalty, rate limit
    /// headers read, [`Backoff::default`] on.
    fn default() -> Self {
        Self {
            engine: Engine::new("default"),
            max_wait: None,
            default_penalty: None,
            rate_limit_headers: true,
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

    /// Widens a host's gap on overload signals that carry no delay, and
    /// narrows it back on success (see [`Backoff`]); `None` switches it
    /// off. On by default, from 1 s up to 10 minutes.
    pub fn with_backoff(mut self, backoff: Option<Backoff>) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long to hold `host` after it answered `status` with `headers`:
    /// what the response asks for ([`penalty`](Self::penalty)); else, for
    /// a `429`, `503` or other `5xx`, the backoff's widened gap (no less
    /// than the default penalty); else, while the host is backing off, the
    /// narrowed gap. `None` when the host may go on at its pacing.
    pub fn after_response(
        &self,
        host: &HostKey,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Option<Duration> {
        // What the server said: Retry-After, or a spent rate limit.
        let stated = penalty_from(status, headers, None, self.rate_limit_headers);
        if stated.is_some() {
            return stated;
        }
        let backoff = self.backoff.as_ref();
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            let widened = backoff.map(|b| b.widen(host));
            let default = matches!(
                status,
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
            )
            .then_some(self.default_penalty)
            .flatten();
            return widened.max(default);
        }
        backoff.and_then(|b| b.narrow(host))
    }

    /// How long to hold `host` after a request to it failed without a
    /// response: for a `transport` failure (a timeout, a refused or reset
    /// connection; see [`is_transport_failure`](super::is_transport_failure)),
    /// the backoff's widened gap.
    pub fn after_failure(&self, host: &HostKey, transport: bool) -> Option<Duration> {
        let backoff = self.backoff.as_ref()?;
        transport.then(|| backoff.widen(host))
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
    fn overload_without_a_stated_delay_backs_off_and_success_narrows() {
        let host = HostKey::parse("http://a.test/").unwrap();
        let options = PaceOptions::default().with_default_penalty(Duration::from_millis(1500));
        let none = HeaderMap::new();
        let s = Duration::from_secs;
        // A 500 widens from 1 s; a 503 widens to 2 s; a 429 to 4 s.
        assert_eq!(
            options.after_response(&host, StatusCode::INTERNAL_SERVER_ERROR, &none),
            Some(s(1))
        );
        assert_eq!(
            options.after_response(&host, StatusCode::SERVICE_UNAVAILABLE, &none),
            Some(s(2))
        );
        assert_eq!(
            options.after_response(&host, StatusCode::TOO_MANY_REQUESTS, &none),
            Some(s(4))
        );
        // A stated delay wins and leaves the gap alone.
        let mut stated = HeaderMap::new();
        stated.insert(http::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(
            options.after_response(&host, StatusCode::TOO_MANY_REQUESTS, &stated),
            Some(s(7))
        );
        // Successes narrow it by a quarter each, down to the host's pacing.
        assert_eq!(
            options.after_response(&host, StatusCode::OK, &none),
            Some(s(3))
        );
        assert_eq!(
            options.after_response(&host, StatusCode::NOT_FOUND, &none),
            Some(Duration::from_millis(2250))
        );
        // Without backoff: only the default penalty, and only for 429/503.
        let off = options.clone().with_backoff(None);
        let other = HostKey::parse("http://b.test/").unwrap();
        assert_eq!(
            off.after_response(&other, StatusCode::INTERNAL_SERVER_ERROR, &none),
            None
        );
        assert_eq!(
            off.after_response(&other, StatusCode::SERVICE_UNAVAILABLE, &none),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(off.after_response(&other, StatusCode::OK, &none), None);
        // A transport failure widens; another error does not.
        assert_eq!(options.after_failure(&other, true), Some(s(1)));
        assert_eq!(options.after_failure(&other, false), None);
        assert_eq!(off.after_failure(&other, true), None);
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

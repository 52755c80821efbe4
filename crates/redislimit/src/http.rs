//! HTTP helpers shared by the middleware crates (feature `http`): the body
//! that holds a permit until the response is read, what a response asks
//! for (`Retry-After`, the `RateLimit` field and vendor `X-RateLimit-*`
//! headers), and the per-request engine label and wait budget.

mod backoff;
mod body;
mod options;
mod rate_limit;
mod retry_after;

use std::borrow::Cow;

pub use self::backoff::{Backoff, is_transport_failure};
pub use self::body::PermitBody;
pub use self::options::{PaceOptions, RateLimitHeaders, Reaction, ServerSignal};
pub use self::rate_limit::{Budget, rate_limit_budget, rate_limit_concurrency, rate_limit_hold};
pub use self::retry_after::{penalty, retry_after};

/// A request extension naming the engine (the caller label in hooks and
/// metrics) for this request, overriding the middleware's default.
///
/// ```
/// use redislimit::http::Engine;
///
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Engine::new("search"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Engine(Cow<'static, str>);

impl Engine {
    /// An engine label.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self(name.into())
    }

    /// The label.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A request extension bounding how long this request may wait for its
/// host's turn, in place of the middleware's maximum wait (the request's
/// own timeout still applies). A longer wait fails at once with
/// [`Error::WaitBudget`](crate::Error::WaitBudget), which says how long the
/// wait would have been: a scheduler can come back then instead of
/// holding a connection slot meanwhile.
///
/// ```
/// use std::time::Duration;
/// use redislimit::http::MaxWait;
///
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(MaxWait(Duration::from_millis(500)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MaxWait(pub std::time::Duration);

//! How a limiter's error travels inside `reqwest_middleware::Error`.

use redislimit::{Error, HostKey};
use reqwest::Url;

/// Why [`PacingMiddleware`](crate::PacingMiddleware) stopped following
/// redirects; inside [`reqwest_middleware::Error::Middleware`] (take it
/// out with `anyhow::Error::downcast_ref`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RedirectError {
    /// More redirects than allowed
    /// ([`with_max_redirects`](crate::PacingMiddleware::with_max_redirects)).
    #[error("more than {max} redirects; the next was to {url}")]
    TooMany {
        /// The most allowed.
        max: usize,
        /// Where the one too many pointed.
        url: Url,
    },
    /// A redirect back to a URL this request already visited.
    #[error("redirect loop back to {url}")]
    Loop {
        /// The URL visited twice.
        url: Url,
    },
}

/// What a middleware placed after (inside) [`PacingMiddleware`](crate::PacingMiddleware)
/// returns, inside [`reqwest_middleware::Error::Middleware`], when it
/// decides not to send a request that was admitted (a connection budget
/// of its own is spent, say): the permit is then taken back as never used
/// ([`Permit::abandon`](redislimit::Permit::abandon): no gap, no quota
/// entry) instead of released as a request that went out.
///
/// ```
/// use redislimit_reqwest::NotSent;
///
/// let refused = reqwest_middleware::Error::Middleware(NotSent::new("no free slot").into());
/// # let _ = refused;
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not sent: {reason}")]
pub struct NotSent {
    reason: String,
}

impl NotSent {
    /// Not sent, for `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }

    /// Why it was not sent.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Whether `err` is a [`NotSent`].
    pub fn is(err: &reqwest_middleware::Error) -> bool {
        matches!(err, reqwest_middleware::Error::Middleware(e) if e.downcast_ref::<Self>().is_some())
    }
}

/// Wraps a redirect failure for the middleware chain.
pub(crate) fn redirect_error(err: RedirectError) -> reqwest_middleware::Error {
    reqwest_middleware::Error::Middleware(anyhow::Error::new(err))
}

/// Wraps a limiter error for the middleware chain, with a message that
/// names the host. [`pacing_error`] takes it out again.
pub(crate) fn to_middleware(err: Error, host: Option<&HostKey>) -> reqwest_middleware::Error {
    let message = match host {
        Some(host) => format!("request to {host} not sent: {err}"),
        None => format!("request not sent: {err}"),
    };
    reqwest_middleware::Error::Middleware(anyhow::Error::new(err).context(message))
}

/// The limiter's error inside `err`, when pacing is what failed the request.
///
/// ```
/// # async fn run(client: reqwest_middleware::ClientWithMiddleware) {
/// use redislimit::Error;
/// use redislimit_reqwest::pacing_error;
///
/// match client.get("https://example.com/").send().await {
///     Err(err) => match pacing_error(&err) {
///         Some(Error::WaitBudget { wait, .. }) => eprintln!("would have waited {wait:?}"),
///         Some(other) => eprintln!("pacing failed: {other}"),
///         None => eprintln!("the request failed: {err}"),
///     },
///     Ok(response) => println!("{}", response.status()),
/// }
/// # }
/// ```
pub fn pacing_error(err: &reqwest_middleware::Error) -> Option<&Error> {
    match err {
        reqwest_middleware::Error::Middleware(err) => err.downcast_ref::<Error>(),
        _ => None,
    }
}

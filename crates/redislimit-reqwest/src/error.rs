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

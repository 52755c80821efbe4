//! `PacingMiddleware`: acquire before sending, release when the body is done.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Extensions;
use redislimit::http::{PaceOptions, PermitBody};
use redislimit::{HostKey, Limiter, Permit};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next, Result};

use crate::error::to_middleware;

/// A [`reqwest_middleware::Middleware`] that paces every request per host
/// through a [`Limiter`].
///
/// For each request it:
/// 1. takes the host key of the URL (a URL without a host fails);
/// 2. waits for a permit under the engine label set here, or the one the
///    request carries as an [`Engine`](crate::Engine) extension
///    (`RequestBuilder::with_extension(Engine::new("search"))`), within a
///    budget: the request's own timeout or [`with_max_wait`](Self::with_max_wait),
///    whichever is shorter; a wait that cannot fit fails at once;
/// 3. sends it, and on `429` or `503` penalizes the host for its
///    `Retry-After` (both forms, capped by the limiter's maximum penalty), or
///    for [`with_default_penalty`](Self::with_default_penalty) without one;
/// 4. returns the response with its body wrapped so the permit is held
///    until the body is read to the end or dropped. URL, status, headers and
///    extensions are kept.
///
/// Put it after (inside) a retry middleware so that every attempt is paced.
/// Cloning shares the limiter.
#[derive(Clone)]
pub struct PacingMiddleware {
    limiter: Arc<dyn Limiter>,
    options: PaceOptions,
}

impl PacingMiddleware {
    /// Paces through `limiter`, with the engine label `default`.
    pub fn new(limiter: impl Limiter + 'static) -> Self {
        Self::from_arc(Arc::new(limiter))
    }

    /// Paces through a shared limiter.
    pub fn from_arc(limiter: Arc<dyn Limiter>) -> Self {
        Self {
            limiter,
            options: PaceOptions::default(),
        }
    }

    /// The engine label reported to hooks for requests that carry none.
    pub fn with_engine(mut self, engine: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        self.options = self.options.with_engine(engine);
        self
    }

    /// The longest any request may wait for its turn; a longer wait fails at
    /// once with [`redislimit::Error::WaitBudget`].
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.options = self.options.with_max_wait(max_wait);
        self
    }

    /// The penalty for a `429` or `503` that carries no usable `Retry-After`.
    pub fn with_default_penalty(mut self, penalty: Duration) -> Self {
        self.options = self.options.with_default_penalty(penalty);
        self
    }

    /// The limiter this middleware paces through.
    pub fn limiter(&self) -> &Arc<dyn Limiter> {
        &self.limiter
    }
}

impl fmt::Debug for PacingMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacingMiddleware")
            .field("limiter", &self.limiter)
            .field("options", &self.options)
            .finish()
    }
}

#[async_trait::async_trait]
impl Middleware for PacingMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let host = HostKey::from_url(req.url()).map_err(|e| to_middleware(e, None))?;
        let engine = self.options.engine(extensions).clone();
        let deadline = self.options.deadline(req.timeout().copied());
        let permit = self
            .limiter
            .acquire_host(engine.as_str(), host.clone(), deadline)
            .await
            .map_err(|e| to_middleware(e, Some(&host)))?;
        // A failed send drops the permit here: the request is over.
        let response = next.run(req, extensions).await?;
        if let Some(hold) = self.options.penalty(response.status(), response.headers()) {
            tracing::info!(host = %host, status = %response.status(), hold_ms = hold.as_millis() as u64, "upstream asked to back off");
            // Failures are reported by the limiter's hooks; the response
            // itself is still good.
            let _ = self.limiter.penalize_host(host, hold).await;
        }
        Ok(hold_until_read(response, permit))
    }
}

/// `response` with its body wrapped so `permit` lives until the body ends
/// or is dropped.
fn hold_until_read(response: Response, permit: Permit) -> Response {
    let url = response.url().clone();
    let response: http::Response<reqwest::Body> = response.into();
    let (mut parts, body) = response.into_parts();
    // reqwest keeps the final URL in an extension of its own, set through
    // `ResponseBuilderExt::url`; carry it over so `Response::url()` is kept.
    use reqwest::ResponseBuilderExt;
    if let Ok(with_url) = http::Response::builder().url(url).body(()) {
        parts.extensions.extend(with_url.into_parts().0.extensions);
    }
    let body = reqwest::Body::wrap(PermitBody::new(body, permit));
    Response::from(http::Response::from_parts(parts, body))
}

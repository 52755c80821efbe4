//! `PacingMiddleware`: acquire before sending, release when the body is done.

use std::fmt;
use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};

use http::header::{
    AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, LOCATION,
    PROXY_AUTHORIZATION, TRANSFER_ENCODING, WWW_AUTHENTICATE,
};
use http::{Extensions, Method, StatusCode};
use redislimit::http::{PaceOptions, PermitBody, is_transport_failure};
use redislimit::{HostKey, Limiter, Permit};
use reqwest::{Request, Response, Url};
use reqwest_middleware::{Middleware, Next, Result};

use crate::error::{NotSent, RedirectError, redirect_error, to_middleware};

/// A [`reqwest_middleware::Middleware`] that paces every request per host
/// through a [`Limiter`].
///
/// For each request it:
/// 1. takes the host key of the URL (a URL without a host fails);
/// 2. waits for a permit under the engine label set here, or the one the
///    request carries as an [`Engine`](crate::Engine) extension, at the
///    priority of its [`RequestPacing`](redislimit::RequestPacing)
///    extension (`with_extension(RequestPacing::new().with_priority(200))`)
///    (`RequestBuilder::with_extension(Engine::new("search"))`), within a
///    budget: the request's own timeout or the options' maximum wait
///    ([`PaceOptions::with_max_wait`]), whichever is shorter; a wait that
///    cannot fit fails at once;
/// 3. sends it, and on `429` or `503` penalizes the host for its
///    `Retry-After` (both forms, capped by the limiter's maximum penalty), or
///    for the options' default penalty without one;
///    whatever the status, a `RateLimit` field or `X-RateLimit-*` headers
///    saying the budget is spent hold the host until their reset, and a
///    low budget is spread up to it
///    ([`PaceOptions::with_rate_limit_headers`]); an
///    overload that says nothing (a bare `429`/`503`, another `5xx`, a
///    timeout, a refused or reset connection) widens the host's gap, and
///    successes narrow it back ([`PaceOptions::with_backoff`]),
///    through Redis for every replica when the limiter keeps it there.
///    What was applied is put in the response's extensions as a
///    [`ServerSignal`](redislimit::http::ServerSignal);
/// 4. follows a redirect (`301`, `302`, `303`, `307`, `308` with a
///    `Location`) as a new request to its own host, from step 1: every hop
///    is paced, and penalized, where it goes;
/// 5. returns the last response with its body wrapped so the permit is held
///    until the body is read to the end or dropped. URL, status, headers and
///    extensions are kept.
///
/// Redirects follow reqwest's default policy: at most
/// [`with_max_redirects`](Self::with_max_redirects) (10) hops, then
/// [`RedirectError::TooMany`](crate::RedirectError::TooMany); a URL seen
/// twice is [`RedirectError::Loop`](crate::RedirectError::Loop); `301`,
/// `302` and `303` become a `GET` without a body (a `HEAD` stays one),
/// `307` and `308` keep the method and the body, or end with the redirect
/// response when the body is a stream that cannot be sent again;
/// `Authorization`, `Cookie` and `Proxy-Authorization` are dropped when the
/// scheme, host or port changes. No `Referer` is added. The URLs redirected
/// from are put in the request's extensions as [`Redirects`].
///
/// **Build the client with `redirect::Policy::none()`**: a reqwest client
/// that follows redirects itself sends every hop after the first unpaced,
/// inside this middleware's one step. When that is seen (the response's
/// URL has another host), a penalty goes to the host that answered and a
/// warning is logged once.
///
/// Put it after (inside) a retry middleware so that every attempt is paced.
/// Cloning shares the limiter.
#[derive(Clone)]
pub struct PacingMiddleware {
    limiter: Arc<dyn Limiter>,
    options: PaceOptions,
    max_redirects: usize,
    /// Whether the warning about a client following redirects was logged.
    warned_client_redirects: Arc<AtomicBool>,
}

/// The URLs a request was redirected from, in order (the final one is the
/// response's [`url`](Response::url)); put in the request's extensions by
/// [`PacingMiddleware`] when it followed at least one redirect, so
/// `ClientWithMiddleware::execute_with_extensions` callers can read them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redirects(pub Vec<Url>);

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
            max_redirects: Self::DEFAULT_MAX_REDIRECTS,
            warned_client_redirects: Arc::default(),
        }
    }

    /// How many redirects a request follows by default, as reqwest.
    pub const DEFAULT_MAX_REDIRECTS: usize = 10;

    /// Follows at most `max` redirects per request (default
    /// [`DEFAULT_MAX_REDIRECTS`](Self::DEFAULT_MAX_REDIRECTS)); one more
    /// fails with [`RedirectError::TooMany`]. `0` follows none: a `3xx`
    /// response is returned as it is.
    pub fn with_max_redirects(mut self, max: usize) -> Self {
        self.max_redirects = max;
        self
    }

    /// The per-request choices: the default engine label, the longest
    /// wait, the penalty for a bare `429`/`503`, whether rate limit headers
    /// are honored, the adaptive backoff (see [`PaceOptions`]; its default
    /// until set).
    pub fn with_options(mut self, options: PaceOptions) -> Self {
        self.options = options;
        self
    }

    /// The per-request choices in force (see
    /// [`with_options`](Self::with_options)).
    pub fn options(&self) -> &PaceOptions {
        &self.options
    }

    /// The limiter this middleware paces through: call its
    /// [`close`](Limiter::close) before the program ends, so the last
    /// releases reach Redis.
    pub fn limiter(&self) -> &Arc<dyn Limiter> {
        &self.limiter
    }
}

impl fmt::Debug for PacingMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacingMiddleware")
            .field("limiter", &self.limiter)
            .field("options", &self.options)
            .field("max_redirects", &self.max_redirects)
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
        let mut req = req;
        let mut followed: Vec<Url> = Vec::new();
        loop {
            // Kept to build the next hop from; `None` when the body is a
            // stream that cannot be sent twice.
            let retained = (self.max_redirects > 0).then(|| Retained::of(&req));
            let url = req.url().clone();
            let (response, permit) = self.send_one(req, extensions, next.clone()).await?;
            let Some(location) = self.redirect_target(&response, &url) else {
                if !followed.is_empty() {
                    extensions.insert(Redirects(followed));
                }
                return Ok(hold_until_read(response, permit, &self.limiter));
            };
            let status = response.status();
            let Some(next_req) = retained.and_then(|r| next_hop(r, status, &url, &location)) else {
                // A 307/308 whose body cannot be sent again ends here, as
                // with reqwest's own policy: the caller gets the redirect.
                if !followed.is_empty() {
                    extensions.insert(Redirects(followed));
                }
                return Ok(hold_until_read(response, permit, &self.limiter));
            };
            // The hop is over: its permit goes back as its body is dropped.
            drop(response);
            drop(permit);
            followed.push(url);
            if followed.len() > self.max_redirects {
                return Err(redirect_error(RedirectError::TooMany {
                    max: self.max_redirects,
                    url: location,
                }));
            }
            if followed.contains(&location) {
                return Err(redirect_error(RedirectError::Loop { url: location }));
            }
            req = next_req;
        }
    }
}

impl PacingMiddleware {
    /// One hop: waits for its host's turn, sends it, penalizes the host
    /// that answered if it asked to back off.
    async fn send_one(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<(Response, Permit)> {
        let host = HostKey::from_url(req.url()).map_err(|e| to_middleware(e, None))?;
        let engine = self.options.engine(extensions).clone();
        let deadline = self.options.deadline(extensions, req.timeout().copied());
        let pacing = self.options.request_pacing(extensions);
        let permit = self
            .limiter
            .acquire_with(engine.as_str(), host.clone(), deadline, pacing)
            .await
            .map_err(|e| to_middleware(e, Some(&host)))?;
        let response = match next.run(req, extensions).await {
            Ok(response) => response,
            // An inner middleware chose not to send: nothing went out.
            Err(err) if NotSent::is(&err) => {
                permit.abandon();
                return Err(err);
            }
            // A failed send drops the permit here: the request is over.
            Err(err) => {
                drop(permit);
                // Timeouts, refused and reset connections (not an inner
                // middleware's own error).
                let transport = match &err {
                    reqwest_middleware::Error::Reqwest(e) => {
                        e.is_timeout() || e.is_connect() || is_transport_failure(e)
                    }
                    reqwest_middleware::Error::Middleware(_) => false,
                };
                if let Some(reaction) = self.options.react_to_failure(transport) {
                    tracing::debug!(host = %host, error = %err, "request failed: backing off");
                    self.options.apply(&*self.limiter, host, reaction).await;
                }
                return Err(err);
            }
        };
        // A client that follows redirects itself hands back the last hop's
        // response: a penalty it asks for is that host's, not this one's.
        let answered = match HostKey::from_url(response.url()) {
            Ok(last) if last != host || last.port() != host.port() => {
                if !self.warned_client_redirects.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        from = %host,
                        to = %last,
                        "the client followed a redirect itself: only the first hop was paced; \
                         build it with redirect::Policy::none()"
                    );
                }
                last
            }
            _ => host,
        };
        let mut response = response;
        if let Some(reaction) = self
            .options
            .react(&answered, response.status(), response.headers())
            && let Some(signal) = self.options.apply(&*self.limiter, answered, reaction).await
        {
            response.extensions_mut().insert(signal);
        }
        Ok((response, permit))
    }

    /// Where `response` (to `url`) redirects, when it is a redirect this
    /// middleware follows.
    fn redirect_target(&self, response: &Response, url: &Url) -> Option<Url> {
        if self.max_redirects == 0 || !is_redirect(response.status()) {
            return None;
        }
        let location = response.headers().get(LOCATION)?.to_str().ok()?;
        let target = url.join(location).ok()?;
        matches!(target.scheme(), "http" | "https").then_some(target)
    }
}

/// What is kept of a request to build its next hop from.
enum Retained {
    /// All of it.
    Whole(Request),
    /// All but a body that cannot be sent twice (a stream).
    Head {
        method: Method,
        headers: http::HeaderMap,
        version: http::Version,
        timeout: Option<std::time::Duration>,
    },
}

impl Retained {
    fn of(req: &Request) -> Self {
        match req.try_clone() {
            Some(whole) => Self::Whole(whole),
            None => Self::Head {
                method: req.method().clone(),
                headers: req.headers().clone(),
                version: req.version(),
                timeout: req.timeout().copied(),
            },
        }
    }
}

/// The statuses followed, as by reqwest's default policy.
fn is_redirect(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    )
}

/// The request for the hop after `status` from `from` to `to`, built from
/// the one sent (`retained`): 301/302/303 become a `GET` without a body
/// (`HEAD` stays), 307/308 keep method and body; credentials and cookies
/// are dropped when the origin changes. `None` when a 307/308 body could
/// not be kept.
fn next_hop(retained: Retained, status: StatusCode, from: &Url, to: &Url) -> Option<Request> {
    let mut req = match retained {
        Retained::Whole(req) => req,
        // Without its body, only a hop that drops the body can be made.
        Retained::Head {
            method,
            headers,
            version,
            timeout,
        } if matches!(
            status,
            StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND | StatusCode::SEE_OTHER
        ) =>
        {
            let mut req = Request::new(method, to.clone());
            *req.headers_mut() = headers;
            *req.version_mut() = version;
            *req.timeout_mut() = timeout;
            req
        }
        Retained::Head { .. } => return None,
    };
    *req.url_mut() = to.clone();
    if matches!(
        status,
        StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND | StatusCode::SEE_OTHER
    ) {
        if req.method() != Method::HEAD {
            *req.method_mut() = Method::GET;
        }
        *req.body_mut() = None;
        for name in [
            TRANSFER_ENCODING,
            CONTENT_ENCODING,
            CONTENT_TYPE,
            CONTENT_LENGTH,
        ] {
            req.headers_mut().remove(name);
        }
    }
    let cross_origin = to.host_str() != from.host_str()
        || to.port_or_known_default() != from.port_or_known_default()
        || to.scheme() != from.scheme();
    if cross_origin {
        for name in [AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION, WWW_AUTHENTICATE] {
            req.headers_mut().remove(name);
        }
        req.headers_mut().remove("cookie2");
    }
    Some(req)
}

/// `response` with its body wrapped so `permit` lives until the body ends
/// or is dropped (and its bytes are counted, where `limiter` counts them).
fn hold_until_read(response: Response, permit: Permit, limiter: &Arc<dyn Limiter>) -> Response {
    let url = response.url().clone();
    let response: http::Response<reqwest::Body> = response.into();
    let (mut parts, body) = response.into_parts();
    // reqwest keeps the final URL in an extension of its own, set through
    // `ResponseBuilderExt::url`; carry it over so `Response::url()` is kept.
    use reqwest::ResponseBuilderExt;
    if let Ok(with_url) = http::Response::builder().url(url).body(()) {
        parts.extensions.extend(with_url.into_parts().0.extensions);
    }
    let body = reqwest::Body::wrap(PermitBody::counting(body, permit, limiter));
    Response::from(http::Response::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(url: &str) -> Request {
        let mut req = Request::new(Method::POST, url.parse().unwrap());
        *req.body_mut() = Some("form".into());
        let headers = req.headers_mut();
        headers.insert(CONTENT_TYPE, "text/plain".parse().unwrap());
        headers.insert(AUTHORIZATION, "Bearer x".parse().unwrap());
        headers.insert(COOKIE, "a=b".parse().unwrap());
        headers.insert("x-kept", "1".parse().unwrap());
        req
    }

    fn hop(status: u16, from: &str, to: &str) -> Request {
        let (from, to): (Url, Url) = (from.parse().unwrap(), to.parse().unwrap());
        let sent = post(from.as_str());
        next_hop(
            Retained::of(&sent),
            StatusCode::from_u16(status).unwrap(),
            &from,
            &to,
        )
        .unwrap()
    }

    #[test]
    fn see_other_and_found_become_a_get_without_a_body() {
        for status in [301, 302, 303] {
            let req = hop(status, "http://a.test/form", "http://a.test/done");
            assert_eq!(req.method(), Method::GET, "{status}");
            assert!(req.body().is_none());
            assert!(req.headers().get(CONTENT_TYPE).is_none());
            assert_eq!(req.url().as_str(), "http://a.test/done");
            // Same origin: the credentials stay.
            assert!(req.headers().get(AUTHORIZATION).is_some());
        }
    }

    #[test]
    fn temporary_and_permanent_redirects_keep_method_and_body() {
        for status in [307, 308] {
            let req = hop(status, "http://a.test/form", "http://a.test/again");
            assert_eq!(req.method(), Method::POST, "{status}");
            let body = req.body().and_then(|b| b.as_bytes());
            assert_eq!(body, Some(&b"form"[..]));
            assert!(req.headers().get(CONTENT_TYPE).is_some());
        }
    }

    #[test]
    fn credentials_are_dropped_when_the_origin_changes() {
        for to in ["http://b.test/", "https://a.test/", "http://a.test:8080/"] {
            let req = hop(302, "http://a.test/", to);
            assert!(req.headers().get(AUTHORIZATION).is_none(), "{to}");
            assert!(req.headers().get(COOKIE).is_none(), "{to}");
            assert!(req.headers().get("x-kept").is_some(), "{to}");
        }
    }

    #[test]
    fn a_body_that_cannot_be_sent_again_ends_a_307_but_not_a_303() {
        let (from, to): (Url, Url) = (
            "http://a.test/".parse().unwrap(),
            "http://a.test/b".parse().unwrap(),
        );
        let streamed = || {
            let mut req = post(from.as_str());
            // A body of its own type: reqwest cannot send it twice.
            *req.body_mut() = Some(reqwest::Body::wrap(String::from("form")));
            assert!(req.try_clone().is_none());
            Retained::of(&req)
        };
        assert!(next_hop(streamed(), StatusCode::TEMPORARY_REDIRECT, &from, &to).is_none());
        let req = next_hop(streamed(), StatusCode::SEE_OTHER, &from, &to).unwrap();
        assert_eq!(req.method(), Method::GET);
        assert!(req.body().is_none());
        assert!(req.headers().get("x-kept").is_some());
    }
}

//! `Pace<S>`: the service that waits for a permit before calling `S`.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use redislimit::HostKey;
use redislimit::http::PermitBody;
use tower::{BoxError, Service};

use super::future::ResponseFuture;
use super::settings::Settings;

/// Paces requests per host before they reach `S`.
///
/// `poll_ready` is the inner service's; the wait for the host happens in
/// the response future, because the host is known only once the request is
/// in hand. The response's body is a [`PermitBody`] that holds the permit
/// until it is read to the end or dropped. Errors are boxed: the inner
/// service's as they are, the limiter's as [`redislimit::Error`].
///
/// Cloning shares the limiter (see [`PaceLayer`](super::PaceLayer)).
#[derive(Clone)]
pub struct Pace<S> {
    pub(crate) inner: S,
    pub(crate) settings: Arc<Settings>,
}

impl<S> Pace<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for Pace<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pace")
            .field("inner", &self.inner)
            .field("limiter", &self.settings.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, B, ResBody> Service<Request<B>> for Pace<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    ResBody: http_body::Body,
{
    type Response = Response<PermitBody<ResBody>>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The ready service goes with this request; a clone takes its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let host = match HostKey::from_uri(request.uri()) {
            Ok(host) => host,
            Err(err) => return ResponseFuture::failed(err),
        };
        let settings = Arc::clone(&self.settings);
        let engine = settings.options.engine(request.extensions()).clone();
        // Tower requests carry no timeout of their own; the layer's maximum
        // wait is the budget.
        let deadline = settings.options.deadline(request.extensions(), None);
        let pacing = settings.options.request_pacing(request.extensions());
        ResponseFuture::new(settings, inner, request, host, (engine, deadline, pacing))
    }
}

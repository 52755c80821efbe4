//! [`ResponseFuture`]: wait for the host, call the service, apply a penalty.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use redislimit::http::{Engine, PermitBody};
use redislimit::{BoxFuture, Error, HostKey, Permit};
use tokio::time::Instant;
use tower::{BoxError, Service};

use super::layer::Settings;

pin_project_lite::pin_project! {
    /// The response future of [`Pace`](super::Pace).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        // The request could not be paced (no host).
        Failed { error: Option<Error> },
        // Waiting for the host's permit.
        Acquiring {
            acquire: BoxFuture<'static, Result<Permit, Error>>,
            call: Option<(S, Request<B>)>,
            settings: Arc<Settings>,
            host: HostKey,
        },
        // The request is on its way.
        Calling {
            #[pin]
            response: S::Future,
            permit: Option<Permit>,
            settings: Arc<Settings>,
            host: HostKey,
        },
        // The upstream asked to back off; the penalty is recorded before
        // the response is handed on, so a retry is paced by it.
        Penalizing {
            penalize: BoxFuture<'static, ()>,
            done: Option<(S::Response, Permit)>,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn new(
        settings: Arc<Settings>,
        service: S,
        request: Request<B>,
        host: HostKey,
        engine: Engine,
        deadline: Option<Instant>,
    ) -> Self {
        let limiter = Arc::clone(&settings.limiter);
        let key = host.clone();
        let acquire: BoxFuture<'static, _> =
            Box::pin(async move { limiter.acquire_host(engine.as_str(), key, deadline).await });
        Self {
            state: State::Acquiring {
                acquire,
                call: Some((service, request)),
                settings,
                host,
            },
        }
    }

    pub(crate) fn failed(error: Error) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: http_body::Body,
{
    type Output = Result<Response<PermitBody<ResBody>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Failed { error } => {
                    let error = error.take().expect("polled after completion");
                    return Poll::Ready(Err(error.into()));
                }
                StateProj::Acquiring {
                    acquire,
                    call,
                    settings,
                    host,
                } => {
                    let permit = ready!(acquire.as_mut().poll(cx))?;
                    let (mut service, request) = call.take().expect("polled after completion");
                    let next = State::Calling {
                        response: service.call(request),
                        permit: Some(permit),
                        settings: Arc::clone(settings),
                        host: host.clone(),
                    };
                    state.set(next);
                }
                StateProj::Calling {
                    response,
                    permit,
                    settings,
                    host,
                } => {
                    // An error drops the permit with this future: the request is over.
                    let response = ready!(response.poll(cx)).map_err(Into::into)?;
                    let permit = permit.take().expect("polled after completion");
                    let Some(hold) = settings.options.after_response(
                        host,
                        response.status(),
                        response.headers(),
                    ) else {
                        return Poll::Ready(Ok(response.map(|body| PermitBody::new(body, permit))));
                    };
                    tracing::info!(host = %host, status = %response.status(), hold_ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX), "upstream asked to back off");
                    let limiter = Arc::clone(&settings.limiter);
                    let key = host.clone();
                    let penalize: BoxFuture<'static, ()> = Box::pin(async move {
                        // Failures are reported by the limiter's hooks.
                        let _ = limiter.penalize_host(key, hold).await;
                    });
                    state.set(State::Penalizing {
                        penalize,
                        done: Some((response, permit)),
                    });
                }
                StateProj::Penalizing { penalize, done } => {
                    ready!(penalize.as_mut().poll(cx));
                    let (response, permit) = done.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(|body| PermitBody::new(body, permit))));
                }
            }
        }
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Failed { .. } => "failed",
            State::Acquiring { .. } => "acquiring",
            State::Calling { .. } => "calling",
            State::Penalizing { .. } => "penalizing",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

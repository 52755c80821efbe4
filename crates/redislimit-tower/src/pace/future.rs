//! [`ResponseFuture`]: wait for the host, call the service, apply a penalty.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use redislimit::http::{Engine, PermitBody, ServerSignal, is_transport_failure};
use redislimit::{BoxFuture, Error, HostKey, Limiter, Permit, RequestPacing};
use tokio::time::Instant;
use tower::{BoxError, Service};

use super::settings::Settings;

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
        // The upstream asked to back off, or the request failed on the way;
        // the hold is recorded before the outcome is handed on, so a retry
        // is paced by it.
        Penalizing {
            penalize: BoxFuture<'static, Option<ServerSignal>>,
            done: Option<Result<(S::Response, Permit), BoxError>>,
            // Counts the body's bytes, where it counts them.
            limiter: Arc<dyn Limiter>,
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
        (engine, deadline, pacing): (Engine, Option<Instant>, RequestPacing),
    ) -> Self {
        let limiter = Arc::clone(&settings.limiter);
        let key = host.clone();
        let acquire: BoxFuture<'static, _> = Box::pin(async move {
            limiter
                .acquire_with(engine.as_str(), key, deadline, pacing)
                .await
        });
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
                    let (reaction, done) = match ready!(response.poll(cx)) {
                        Ok(response) => {
                            let permit = permit.take().expect("polled after completion");
                            let reaction =
                                settings
                                    .options
                                    .react(host, response.status(), response.headers());
                            let Some(reaction) = reaction else {
                                return Poll::Ready(Ok(response.map(|body| {
                                    PermitBody::counting(body, permit, &settings.limiter)
                                })));
                            };
                            (reaction, Ok((response, permit)))
                        }
                        Err(error) => {
                            // The request is over: its permit goes back now.
                            drop(permit.take());
                            let error: BoxError = error.into();
                            let transport = is_transport_failure(&*error) || is_timeout(&*error);
                            let Some(reaction) = settings.options.react_to_failure(transport)
                            else {
                                return Poll::Ready(Err(error));
                            };
                            (reaction, Err(error))
                        }
                    };
                    let settings = Arc::clone(settings);
                    let limiter = Arc::clone(&settings.limiter);
                    let key = host.clone();
                    let penalize: BoxFuture<'static, Option<ServerSignal>> = Box::pin(async move {
                        settings
                            .options
                            .apply(&*settings.limiter, key, reaction)
                            .await
                    });
                    state.set(State::Penalizing {
                        penalize,
                        done: Some(done),
                        limiter,
                    });
                }
                StateProj::Penalizing {
                    penalize,
                    done,
                    limiter,
                } => {
                    let signal = ready!(penalize.as_mut().poll(cx));
                    let (mut response, permit) = done.take().expect("polled after completion")?;
                    if let Some(signal) = signal {
                        response.extensions_mut().insert(signal);
                    }
                    return Poll::Ready(Ok(
                        response.map(|body| PermitBody::counting(body, permit, limiter))
                    ));
                }
            }
        }
    }
}

/// Whether `error`, or one of its causes, is tower's own timeout.
fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<tower::timeout::error::Elapsed>() {
            return true;
        }
        next = e.source();
    }
    false
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

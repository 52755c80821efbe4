//! Per-host pacing for any tower [`Service`](tower::Service) over
//! `http::Request`, such as the hyper-util client, through any
//! [`redislimit::Limiter`].
//!
//! [`PaceLayer`] wraps a service in [`Pace`]: each request waits for a
//! permit for its URI's host, the permit lives until the response body is
//! read to the end or dropped, and what the upstream asks for holds the
//! host: `Retry-After` on a `429`/`503`, a spent or low budget in rate
//! limit headers, and the adaptive backoff for overload that states no
//! delay (bare `429`/`503`, other `5xx`, transport failures). What was
//! applied is in the response's extensions as a
//! [`ServerSignal`](redislimit::http::ServerSignal).
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use redislimit::{DomainLimiter, Pacing};
//! use redislimit_tower::{PaceLayer, PaceOptions};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let limiter = DomainLimiter::new(Pacing::builder().min_delay(Duration::from_millis(10)).build()?);
//! // Any `Service<http::Request<B>, Response = http::Response<R>>` will do;
//! // in production, a `hyper_util::client::legacy::Client`.
//! let upstream = tower::service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, Infallible>(http::Response::new(String::from("hello")))
//! });
//! let mut client = ServiceBuilder::new()
//!     .layer(PaceLayer::new(limiter).with_options(PaceOptions::default().with_engine("crawler")))
//!     .service(upstream);
//!
//! let request = http::Request::get("http://example.com/").body(String::new())?;
//! let response = client.ready().await?.call(request).await?;
//! assert_eq!(response.status(), 200);
//! # Ok(()) }
//! ```
//!
//! # Redirects
//!
//! Put `tower_http::follow_redirect::FollowRedirectLayer` *outside*
//! `PaceLayer`. Every hop then passes through [`Pace`] on its own: it is a
//! request to its own host, paced there and, on a `429`/`503` with
//! `Retry-After`, penalized there. A hop's response is dropped before the
//! next hop is sent, which releases its permit. Inside `PaceLayer`, the
//! layer would see only the first URL: every hop would be charged to the
//! first host, and a `Retry-After` from the target would hold the wrong host.
//!
//! `FollowRedirect` builds each hop anew, without the request's extensions,
//! so an [`Engine`] extension labels only the first hop; the later ones get
//! the layer's engine ([`PaceOptions::with_engine`]).
//!
//! ```
//! use std::convert::Infallible;
//! use redislimit::{DomainLimiter, Pacing};
//! use redislimit_tower::{PaceLayer, PaceOptions};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_http::follow_redirect::{FollowRedirectLayer, RequestUri};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // old.example moved to new.example.
//! let upstream = tower::service_fn(|req: http::Request<String>| async move {
//!     let response = match req.uri().host() {
//!         Some("old.example") => http::Response::builder()
//!             .status(301)
//!             .header("location", "http://new.example/")
//!             .body(String::new()),
//!         _ => http::Response::builder().body(String::from("hello")),
//!     };
//!     Ok::<_, Infallible>(response.unwrap())
//! });
//! let mut client = ServiceBuilder::new()
//!     .layer(FollowRedirectLayer::new()) // outside: sees every hop ...
//!     .layer(PaceLayer::new(DomainLimiter::new(Pacing::default()))) // ... paced here
//!     .service(upstream);
//!
//! let request = http::Request::get("http://old.example/").body(String::new())?;
//! let response = client.ready().await?.call(request).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(response.extensions().get::<RequestUri>().unwrap().0, "http://new.example/");
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod pace;

pub use self::pace::{Pace, PaceLayer, future};
pub use redislimit;
pub use redislimit::http::{Backoff, Engine, MaxWait, PaceOptions, PermitBody, RateLimitHeaders};

/// This crate's README, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! Per-host pacing for any tower [`Service`](tower::Service) over
//! `http::Request`, such as the hyper-util client, through any
//! [`redislimit::Limiter`].
//!
//! [`PaceLayer`] wraps a service in [`Pace`]: each request waits for a
//! permit for its URI's host, the permit lives until the response body is
//! read to the end or dropped, and a `429`/`503` with `Retry-After`
//! penalizes the host.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use redislimit::{DomainLimiter, Pacing};
//! use redislimit_tower::PaceLayer;
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
//!     .layer(PaceLayer::new(limiter).with_engine("crawler"))
//!     .service(upstream);
//!
//! let request = http::Request::get("http://example.com/").body(String::new())?;
//! let response = client.ready().await?.call(request).await?;
//! assert_eq!(response.status(), 200);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod pace;

pub use self::pace::{Pace, PaceLayer, future};
pub use redislimit;
pub use redislimit::http::{Engine, PermitBody};

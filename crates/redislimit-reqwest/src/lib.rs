//! Per-host pacing for reqwest clients, as a [`reqwest_middleware`]
//! middleware over any [`redislimit::Limiter`].
//!
//! [`PacingMiddleware`] waits for a permit before each request is sent,
//! holds it until the response body has been read to the end or dropped,
//! and turns a `429`/`503` with `Retry-After` into a penalty for the host on
//! every limiter sharing the state. It decides nothing itself: the limiter
//! (in-process, Redis-backed, or both with a fallback) does.
//!
//! ```
//! use std::time::Duration;
//! use redislimit::{DomainLimiter, Pacing};
//! use redislimit_reqwest::{PaceOptions, PacingMiddleware};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = DomainLimiter::new(
//!     Pacing::builder()
//!         .max_concurrent(2)
//!         .min_delay(Duration::from_millis(250))
//!         .build()?,
//! );
//! // Redirects are followed by the middleware, one paced hop at a time.
//! let http = reqwest::Client::builder()
//!     .redirect(reqwest::redirect::Policy::none())
//!     .build()?;
//! let client = reqwest_middleware::ClientBuilder::new(http)
//!     .with(PacingMiddleware::new(limiter).with_options(PaceOptions::default().with_engine("crawler")))
//!     .build();
//! // client.get("https://example.com/").send().await? is now paced per host.
//! # let _ = client; Ok(()) }
//! ```
//!
//! A wait longer than the request's own timeout (`RequestBuilder::timeout`)
//! or the configured [`PaceOptions::with_max_wait`]
//! fails at once; the limiter's error comes back as a
//! [`reqwest_middleware::Error::Middleware`] from which [`pacing_error`]
//! recovers it.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod error;
mod middleware;

pub use self::error::{NotSent, RedirectError, pacing_error};
pub use self::middleware::{PacingMiddleware, Redirects};
pub use redislimit;
pub use redislimit::http::{Backoff, Engine, MaxWait, PaceOptions, RateLimitHeaders};
pub use reqwest_middleware;

/// This crate's README, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

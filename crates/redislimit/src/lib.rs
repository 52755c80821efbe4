//! Per-host pacing of outbound HTTP requests.
//!
//! A crawler or an API client sends requests to many hosts and must pace
//! each host politely: a few requests in flight, a gap between sends, a
//! quota per window, and a pause when the host answers `Retry-After`.
//! `redislimit` decides *when* a request to a host may go out; the
//! `redislimit-reqwest` and `redislimit-tower` crates apply it to HTTP
//! clients.
//!
//! - [`Pacing`] holds the per-host controls, validated at construction.
//! - [`Limiter`] is the trait every backend implements: `acquire` waits for
//!   a [`Permit`], `penalize` holds a host back.
//! - [`DomainLimiter`] paces within one process.
//! - [`RedisLimiter`] (feature `redis`, on by default) holds the pacing state
//!   in Redis, so every replica of a crawler counts against one limit per
//!   host; its documentation explains the serialized and lease modes, when
//!   to pick which, and how to size `lease_ttl`.
//! - [`FallbackLimiter`] keeps retrieval going on in-process pacing while
//!   Redis is unavailable; with [`RedisLimiter::with_fallback`] the
//!   replicas together keep each host's limits meanwhile, as the
//!   [`FallbackPolicy`] says (a registry of replicas tells each how many
//!   share them), and requests sent during the outage count in Redis once
//!   it is back.
//! - Replicas of one scope must agree on the settings that decide
//!   admission ([`RedisLimiter::check_config`], [`Error::ConfigMismatch`]);
//!   policies published to the scope ([`RedisLimiter::publish_policies`])
//!   are followed by every [`LiveLimiter`] while it runs, each host's
//!   state kept.
//! - Redis over TLS (feature `tls-rustls`, rustls with ring): `rediss://`
//!   URLs trust the system's certificates; `RedisTls` and
//!   `RedisPool::standalone_tls` / `cluster_tls` trust your own CA
//!   instead (see [`RedisPool`]).
//!
//! - [`Limiter::close`] ends a limiter's use: new acquires fail with
//!   [`Error::Closed`], and it returns once every release is in Redis. A
//!   program calls it before its runtime ends.
//!
//! Every failure is one [`Error`]; hooks ([`Hooks`]) and `tracing` events
//! report each decision once.
//!
//! ```
//! use std::time::Duration;
//! use redislimit::{DomainLimiter, Limiter, Pacing};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let pacing = Pacing::builder()
//!         .max_concurrent(2)
//!         .min_delay(Duration::from_millis(20))
//!         .build()?;
//!     let limiter = DomainLimiter::new(pacing);
//!
//!     for path in ["/", "/about", "/contact"] {
//!         let url = format!("https://example.com{path}").parse()?;
//!         let permit = limiter.acquire("crawler", &url, None).await?;
//!         println!("{url} may go now (waited {:?})", permit.waited());
//!         // Send the request and read its body while holding the permit;
//!         // dropping it marks the request complete.
//!         drop(permit);
//!     }
//!     Ok(())
//! }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
// docs.rs builds every feature and labels each item with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without `redis` the overview still names the Redis items; their links resolve
// in the default build and on docs.rs.
#![cfg_attr(not(feature = "redis"), allow(rustdoc::broken_intra_doc_links))]

mod address;
pub mod error;
mod fallback;
pub mod hooks;
#[cfg(feature = "http")]
pub mod http;
mod key;
mod limiter;
mod local;
#[cfg(feature = "metrics")]
mod metrics;
pub mod pacing;
mod permit;
mod policy;
#[cfg(feature = "redis")]
pub mod redis;
pub mod snapshot;

#[cfg(feature = "redis")]
pub use self::fallback::FallbackPolicy;
#[cfg(feature = "metrics")]
pub use self::metrics::MetricsHooks;
#[cfg(feature = "tls-rustls")]
pub use self::redis::RedisTls;
#[cfg(feature = "redis")]
pub use self::redis::{LiveLimiter, RedisLimiter, RedisPool, RedisTimeouts, Tuning};
pub use self::{
    address::{AddressResolver, DEFAULT_ADDRESS_TTL, Resolved, SystemResolver},
    error::{ConfigError, Error, Misconfiguration, Op},
    fallback::FallbackLimiter,
    hooks::{Hooks, WaitOutcome},
    key::HostKey,
    limiter::{BoxFuture, Limiter, RequestPacing},
    local::DomainLimiter,
    pacing::Pacing,
    permit::Permit,
    policy::{KeyBy, Policies, Rule},
    snapshot::Snapshot,
};
#[cfg(feature = "redis")]
pub use deadpool_redis;

#[cfg(feature = "redis")]
pub(crate) use self::error::BoxError;
pub(crate) use self::hooks::NoHooks;
pub(crate) use self::limiter::BackoffStep;
#[cfg(feature = "redis")]
pub(crate) use self::pacing::MAX_MICROS;
pub(crate) use self::pacing::Spacing;

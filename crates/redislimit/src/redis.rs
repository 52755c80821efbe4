//! The Redis-backed limiter: pacing state shared by every replica.

mod agreement;
mod circuit;
mod clock;
mod keys;
mod lateness;
mod limiter;
mod pool;
mod precise;
mod registry;
mod renew;
mod script;
#[cfg(feature = "tls-rustls")]
mod tls;

pub use self::keys::RedisKeys;
pub use self::limiter::{RedisLimiter, RedisLimiterBuilder};
pub use self::pool::{ClusterManager, ClusterPool, RedisPool, RedisTimeouts};
pub use self::registry::FallbackPolicy;
#[cfg(feature = "tls-rustls")]
pub use self::tls::RedisTls;

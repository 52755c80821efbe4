//! The Redis-backed limiter: pacing state shared by every replica
//! ([`RedisLimiter`]), its builder, its pool and its tuning.
//!
//! Its layers, each importing only those below it (see `docs/DESIGN.md`):
//! the handle and its builder (`limiter.rs`, `builder.rs`); the acquire
//! (`acquire.rs`, with its pure pause in `pause.rs` and lateness verdict in
//! `lateness.rs`) and the other operations (`ops.rs`); the slots a permit
//! holds (`slots.rs`); the limiter's parts (`core.rs`): its agreement,
//! registry, renewals and lifecycle; the backend that talks to Redis
//! (`backend.rs`), through the scripts (`scripts.rs`) and the connection
//! (`pool.rs`); and the settings, keys and clock they all read.

mod acquire;
mod agreement;
mod backend;
mod builder;
mod circuit;
mod clock;
mod core;
mod gathered;
mod keys;
mod lateness;
mod lifecycle;
mod limiter;
mod live;
mod misconfig;
mod ops;
mod pause;
mod pool;
mod precise;
mod published;
mod queue;
mod registry;
mod renew;
mod roster;
mod scripts;
mod settings;
mod shared;
mod slots;
#[cfg(feature = "tls-rustls")]
mod tls;
mod tuning;

pub use self::builder::RedisLimiterBuilder;
pub use self::limiter::RedisLimiter;
pub use self::live::LiveLimiter;
pub use self::pool::{RedisPool, RedisTimeouts};
pub use self::queue::{QueueItem, SharedQueue};
pub use self::shared::{Cached, Fresh, SharedCache};
#[cfg(feature = "tls-rustls")]
pub use self::tls::RedisTls;
pub use self::tuning::Tuning;

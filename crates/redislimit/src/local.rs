//! The in-process limiter: per-host pacing for one process, and the fallback
//! when the shared backend is unreachable.

mod acquire;
mod host;
mod limiter;
mod shards;
pub(crate) mod sweep;

pub use self::limiter::DomainLimiter;
pub(crate) use self::shards::LocalAdmission;

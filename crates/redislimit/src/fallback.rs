//! `FallbackLimiter`: a shared limiter on top of in-process pacing that
//! carries on alone while the shared one is unavailable; its outage plan,
//! its shares and turns, and the requests it sent alone, to be counted in
//! the shared limiter once it answers.

mod acquire;
mod adoption;
mod limiter;
mod plan;
mod shares;
mod turn;

pub use self::limiter::FallbackLimiter;
#[cfg(feature = "redis")]
pub use self::plan::FallbackPolicy;
#[cfg_attr(not(feature = "redis"), allow(unused_imports))]
pub(crate) use self::plan::{OutagePlan, Plan};

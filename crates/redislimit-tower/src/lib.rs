//! Pacing for tower services over http::Request (in progress).
//!
//! This crate re-exports [`redislimit`]; the middleware itself lands in a
//! later release.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub use redislimit;

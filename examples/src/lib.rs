//! Runnable examples of redislimit; see `examples/examples/` and run one
//! with `cargo run -p examples --example NAME`.
#![forbid(unsafe_code)]

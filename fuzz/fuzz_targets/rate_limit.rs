//! Fuzz target `rate_limit`: the `RateLimit` field and vendor `X-RateLimit-*` headers.
//!
//! The body, with the invariants it checks, is
//! `examples::fuzzing::rate_limit_headers`, which the `fuzz_seeds` test also runs over
//! `fuzz/seeds/rate_limit/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| examples::fuzzing::rate_limit_headers(data));

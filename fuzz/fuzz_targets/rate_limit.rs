//! Fuzz target `rate_limit`: the `RateLimit` field and vendor `X-RateLimit-*` headers.
//!
//! The body, with the invariants it checks, is `redislimit_fuzz::rate_limit_headers`
//! (`fuzz/src/lib.rs`), which the `fuzz_seeds` test of `redislimit-crawl` also
//! runs over `fuzz/seeds/rate_limit/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| redislimit_fuzz::rate_limit_headers(data));

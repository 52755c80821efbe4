//! Fuzz target `retry_after`: `Retry-After` values and `Date` headers.
//!
//! The body, with the invariants it checks, is `redislimit_fuzz::retry_after_header`
//! (`fuzz/src/lib.rs`), which the `fuzz_seeds` test of `redislimit-crawl` also
//! runs over `fuzz/seeds/retry_after/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| redislimit_fuzz::retry_after_header(data));

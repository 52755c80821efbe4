//! Fuzz target `retry_after`: `Retry-After` values and `Date` headers.
//!
//! The body, with the invariants it checks, is
//! `examples::fuzzing::retry_after_header`, which the `fuzz_seeds` test also runs over
//! `fuzz/seeds/retry_after/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| examples::fuzzing::retry_after_header(data));

//! Fuzz target `host_key`: host keys (`HostKey`, `KeyBy`) of arbitrary URLs.
//!
//! The body, with the invariants it checks, is `redislimit_fuzz::host_key`
//! (`fuzz/src/lib.rs`), which the `fuzz_seeds` test of `redislimit-crawl` also
//! runs over `fuzz/seeds/host_key/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| redislimit_fuzz::host_key(data));

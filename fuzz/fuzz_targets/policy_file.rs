//! Fuzz target `policy_file`: the crawl's `--policy` file.
//!
//! The body, with the invariants it checks, is `redislimit_fuzz::policy_file`
//! (`fuzz/src/lib.rs`), which the `fuzz_seeds` test of `redislimit-crawl` also
//! runs over `fuzz/seeds/policy_file/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| redislimit_fuzz::policy_file(data));

//! Fuzz target `policy_file`: the crawl's `--policy` file.
//!
//! The body, with the invariants it checks, is
//! `examples::fuzzing::policy_file`, which the `fuzz_seeds` test also runs over
//! `fuzz/seeds/policy_file/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| examples::fuzzing::policy_file(data));

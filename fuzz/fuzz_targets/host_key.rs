//! Fuzz target `host_key`: host keys (`HostKey`, `KeyBy`) of arbitrary URLs.
//!
//! The body, with the invariants it checks, is
//! `examples::fuzzing::host_key`, which the `fuzz_seeds` test also runs over
//! `fuzz/seeds/host_key/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| examples::fuzzing::host_key(data));

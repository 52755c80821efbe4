//! Fuzz target `url_lines`: the lines of the crawl's `--urls` file.
//!
//! The body, with the invariants it checks, is
//! `examples::fuzzing::url_lines`, which the `fuzz_seeds` test also runs over
//! `fuzz/seeds/url_lines/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| examples::fuzzing::url_lines(data));

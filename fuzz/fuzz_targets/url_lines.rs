//! Fuzz target `url_lines`: the lines of the crawl's `--urls` file.
//!
//! The body, with the invariants it checks, is `redislimit_fuzz::url_lines`
//! (`fuzz/src/lib.rs`), which the `fuzz_seeds` test of `redislimit-crawl` also
//! runs over `fuzz/seeds/url_lines/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| redislimit_fuzz::url_lines(data));

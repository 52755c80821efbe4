//! `crawl`: one replica of a polite crawler, built on the reqwest middleware.
//!
//! Run it with `cargo install --path crates/redislimit-crawl` and `crawl --help`.
//! Alone it paces in-process; give every replica the same `--redis URL`
//! (or `--redis-cluster URL ...`) and they share one pace per host:
//!
//! ```text
//! crawl --redis redis://127.0.0.1:6379/ --min-delay 500ms --urls urls.txt --report report.jsonl
//! ```
//!
//! For Redis over TLS give a `rediss://` URL; add `--redis-ca ca.pem` when
//! the server's certificate was issued by your own CA rather than one the
//! system trusts.
//!
//! Look at the per-host summary at the end (requests, errors, mean wait,
//! achieved rate, statuses) and at the report: one JSON object per URL with
//! its status or error, when it was sent and when its body was read.

fn main() -> std::process::ExitCode {
    redislimit_crawl::main()
}

/// mimalloc rather than glibc's allocator: a replica allocates and frees
/// small objects on several threads at a high rate (every request's
/// futures, its Redis calls and their replies), where glibc's arenas
/// spend their time consolidating (see `docs/PERFORMANCE.md`).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

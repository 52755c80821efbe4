//! `crawl`: one replica of a polite crawler, built on the reqwest middleware.
//!
//! The command line is [`Args`]; [`main`] is what `cargo run -p examples
//! --example crawl -- ...` runs. The pieces are public so the demonstration
//! can run several replicas in one process: [`Crawler`] fetches a list of
//! URLs through a shared [`Limiter`](redislimit::Limiter) and returns one
//! [`Fetched`] per URL.

mod args;
mod crawler;
mod input;
mod summary;

use std::process::ExitCode;

use clap::Parser;

pub use self::args::{Args, Fallback, parse_duration};
pub use self::crawler::{Crawler, Fetched};
pub use self::input::{Input, read_urls};
pub use self::summary::{HostSummary, summarize};

/// Runs the command line: parses the arguments, crawls, prints the summary.
/// Exit code 0 when the crawl ran to the end (whatever the statuses), 2 on
/// bad input or a Redis that is unreachable at start.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("crawl: cannot start the runtime: {err}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(args.run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("crawl: {err:#}");
            ExitCode::from(2)
        }
    }
}

//! `crawl`: one replica of a polite crawler, built on the reqwest middleware
//! of [`redislimit`]. Install it with
//! `cargo install --path crates/redislimit-crawl` and run `crawl --help`.
//!
//! The command line is [`Args`]; [`main`] is what the `crawl` binary runs.
//! The pieces are public so a program can run several replicas in one
//! process (the demonstration does): [`Crawler`] fetches a list of URLs
//! through a shared [`Limiter`](redislimit::Limiter) and returns one
//! [`Fetched`] per URL.
#![forbid(unsafe_code)]

mod args;
mod crawler;
mod frontier;
pub mod input;
pub mod policy_file;
mod queue;
mod resolve;
mod robots;
mod run;
#[cfg(feature = "redis")]
mod shared;
mod stop;
mod summary;

use std::process::ExitCode;

use clap::Parser;

pub use self::args::{Args, Fallback, KeyByArg, RedisTarget};
pub use self::crawler::{Crawler, Fetched, ModeProbe, redact};
pub use self::frontier::Frontier;
pub use self::input::{Input, read_urls, read_urls_into, resume_from};
pub use self::policy_file::{Settings, load as load_policy_file, parse_duration};
pub use self::queue::{Command, PolicyCommand};
pub use self::run::{Ended, Pacer};
pub use self::stop::{Stop, StopLevel};
pub use self::summary::{HostSummary, Tally, summarize};

/// Runs the command line: parses the arguments, crawls, prints the summary.
/// Exit code 0 when the crawl ran to the end and every URL got an HTTP
/// response (whatever its status) or was skipped by robots.txt, 4 when it
/// ran to the end but some got none, 2 on bad input, a report that cannot
/// be written or a Redis that is unreachable at start, 130 or 143 when
/// SIGINT or SIGTERM stopped it (see [`Ended::exit_code`]).
pub fn main() -> ExitCode {
    let args = Args::parse();
    init_logs();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!("cannot start the runtime: {err}");
            return ExitCode::from(2);
        }
    };
    if let Some(command) = args.command {
        return match runtime.block_on(command.run()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                tracing::error!("{}", redislimit::error::Causes(err.as_ref()));
                ExitCode::from(2)
            }
        };
    }
    match runtime.block_on(args.run()) {
        Ok(ended) => ExitCode::from(ended.exit_code()),
        Err(err) => {
            tracing::error!("{}", redislimit::error::Causes(err.as_ref()));
            ExitCode::from(2)
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

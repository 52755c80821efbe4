//! `cargo xtask bench`: the criterion micro-benchmarks and the system
//! benchmarks, merged into one table and `target/bench/summary.json`.

use std::path::Path;

use serde_json::{Value, json};

use crate::{Failure, cargo, header, step, target_dir};

/// What the in-process figures are measured against.
const GOVERNOR: &str = "governor keyed check + tokio Semaphore acquire/release";

/// When a criterion figure meets its goal.
#[derive(Clone, Copy)]
enum Goal {
    /// At most this ratio to its baseline.
    Ratio(f64),
    /// At most this many ns per operation.
    AtMostNs(f64),
}

/// The pacing of most criterion figures.
const UNCONTENDED: &str = "one in flight per host, nothing else; uncontended";

/// The criterion benchmarks read back, as (figure, ours, baseline, what
/// the baseline is, the goal, the pacing measured, operations per
/// criterion iteration).
const MICRO: [(&str, &str, &str, &str, Goal, &str, f64); 5] = [
    (
        "in_process_one_host",
        "ours_one_host",
        "baseline_one_host",
        GOVERNOR,
        Goal::Ratio(1.5),
        UNCONTENDED,
        1.0,
    ),
    (
        "in_process_10k_hosts",
        "ours_10k_hosts",
        "baseline_10k_hosts",
        GOVERNOR,
        Goal::Ratio(1.5),
        UNCONTENDED,
        1.0,
    ),
    (
        "in_process_10k_hosts_1000_rules",
        "ours_10k_hosts_1000_rules",
        "ours_10k_hosts",
        "the same without rules",
        Goal::Ratio(1.10),
        UNCONTENDED,
        1.0,
    ),
    (
        "snapshot_100k_hosts",
        "snapshot_100k_hosts",
        "snapshot_100k_hosts",
        "itself (the goal is absolute: under 1 ms)",
        Goal::AtMostNs(1_000_000.0),
        UNCONTENDED,
        1.0,
    ),
    (
        "hosts_1m_throughput",
        "ours_1m_hosts",
        "baseline_1m_hosts",
        "governor keyed check, a fresh keyed limiter per iteration",
        Goal::Ratio(1.0),
        "a 10 ms gap; a million hosts, each touched once, on a fresh limiter per iteration",
        // `MILLION` in crates/redislimit/benches/overhead.rs.
        1_000_000.0,
    ),
];

/// The mean of a criterion benchmark of the `in_process` group, in ns
/// (criterion writes under cargo's target directory, `target`).
fn criterion_mean(target: &Path, bench: &str) -> Result<f64, Failure> {
    let path = target
        .join("criterion/in_process")
        .join(bench)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Failure::new("bench", format!("cannot read {}: {e}", path.display())))?;
    let estimates: Value = serde_json::from_str(&text)
        .map_err(|e| Failure::new("bench", format!("{} is not JSON: {e}", path.display())))?;
    estimates["mean"]["point_estimate"]
        .as_f64()
        .ok_or_else(|| Failure::new("bench", format!("no mean in {}", path.display())))
}

/// Builds the `crawl` binary (release) into `target/release/`, where the fleet
/// figure and the soak look for it beside their own binaries.
pub(crate) fn build_crawl() -> Result<(), Failure> {
    step(
        "build crawl",
        cargo().args([
            "build",
            "--release",
            "-p",
            "redislimit-crawl",
            "--bin",
            "crawl",
        ]),
    )
}

pub(crate) fn run() -> Result<(), Failure> {
    let target = target_dir()?;
    header("servers: redis-server, redis-cli, redis-sentinel, nginx and faketime");
    crate::redis::ensure_installed().map_err(|detail| Failure::new("bench", detail))?;
    step(
        "bench",
        cargo().args(["bench", "-p", "redislimit", "--bench", "overhead"]),
    )?;
    let system = target.join("bench/system.json");
    build_crawl()?;
    step(
        "bench",
        cargo()
            .args([
                "run",
                "--release",
                "--quiet",
                "-p",
                "redislimit-tests",
                "--bin",
                "bench",
                "--",
                "--out",
            ])
            .arg(&system),
    )?;

    let mut figures = Vec::new();
    for (name, ours, baseline, baseline_is, goal, pacing, per) in MICRO {
        let (ours, baseline) = (
            criterion_mean(&target, ours)? / per,
            criterion_mean(&target, baseline)? / per,
        );
        let mut figure = json!({
            "name": name,
            "ours": ours,
            "baseline": baseline,
            "baseline_is": baseline_is,
            "ratio": ours / baseline,
            "units": "ns/op",
            "params": { "pacing": pacing, "tool": "criterion" },
        });
        match goal {
            Goal::Ratio(most) => {
                figure["goal"] = json!(format!("ratio <= {most}"));
                figure["met"] = json!(ours / baseline <= most);
            }
            Goal::AtMostNs(most) => {
                figure["goal"] = json!(format!("ours <= {most} ns"));
                figure["met"] = json!(ours <= most);
            }
        }
        figures.push(figure);
    }
    let text = std::fs::read_to_string(&system)
        .map_err(|e| Failure::new("bench", format!("cannot read {}: {e}", system.display())))?;
    let Value::Array(system) = serde_json::from_str(&text)
        .map_err(|e| Failure::new("bench", format!("{} is not JSON: {e}", system.display())))?
    else {
        return Err(Failure::new("bench", "the system figures are not a list"));
    };
    figures.extend(system);

    println!(
        "\n{:<46} {:>12} {:>12} {:>8}  {:<4} {:<14} goal",
        "figure", "ours", "baseline", "ratio", "met", "units"
    );
    for f in &figures {
        let met = match f["met"].as_bool() {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        println!(
            "{:<46} {:>12.2} {:>12.2} {:>8.3}  {:<4} {:<14} {}",
            f["name"].as_str().unwrap_or("?"),
            f["ours"].as_f64().unwrap_or(f64::NAN),
            f["baseline"].as_f64().unwrap_or(f64::NAN),
            f["ratio"].as_f64().unwrap_or(f64::NAN),
            met,
            f["units"].as_str().unwrap_or(""),
            f["goal"].as_str().unwrap_or("none stated"),
        );
    }
    let unmet: Vec<&str> = figures
        .iter()
        .filter(|f| f["met"].as_bool() == Some(false))
        .filter_map(|f| f["name"].as_str())
        .collect();
    let stated = figures.iter().filter(|f| f["met"].is_boolean()).count();
    println!(
        "\ngoals met: {} of {stated}{}",
        stated - unmet.len(),
        if unmet.is_empty() {
            String::new()
        } else {
            format!(" (not met: {}; see docs/PERFORMANCE.md)", unmet.join(", "))
        }
    );
    let summary = target.join("bench/summary.json");
    let text =
        serde_json::to_string_pretty(&figures).map_err(|e| Failure::new("bench", e.to_string()))?;
    std::fs::write(&summary, text)
        .map_err(|e| Failure::new("bench", format!("cannot write {}: {e}", summary.display())))?;
    println!("\nwrote {}", summary.display());
    Ok(())
}

//! `bench`: the system benchmarks `cargo xtask bench` runs next to the
//! criterion micro-benchmarks. Each figure is measured side by side with a
//! baseline in the same run and written as one JSON object (name, ours,
//! baseline, ratio, units, parameters) to the file given with `--out`.
//!
//! Real parts only: Redis servers and the HTTP upstream are started on
//! loopback by this package's harness.

mod admissions;
mod client_cost;
mod contention;
mod crawl_memory;
mod fairness;
mod fleet;
mod middleware;
mod redis_cost;
mod saturation;
mod scale;
mod scaling;
mod shared_hosts;

use std::alloc::System;
use std::path::PathBuf;

use serde::Serialize;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

/// Counts the heap, for the memory figures.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes live on the heap now. (`stats_alloc` counts a reallocation's
/// growth in `bytes_allocated` and its shrinking in `bytes_deallocated`
/// already; its `bytes_reallocated` is the same change again.)
pub(crate) fn live_bytes() -> i64 {
    let s = GLOBAL.stats();
    s.bytes_allocated as i64 - s.bytes_deallocated as i64
}

/// Heap allocations and reallocations this process has made so far,
/// every thread (a `Vec` growing reallocates).
pub(crate) fn allocations() -> usize {
    let stats = GLOBAL.stats();
    stats.allocations + stats.reallocations
}

/// CPU time (s) from `/proc/self/stat`: the sum of its fields `user` and
/// `system` (counted from the first after the command name, which is in
/// parentheses), in the kernel's fixed 100 ticks a second; 0 where there
/// is no `/proc`.
pub(crate) fn stat_cpu_secs(user: usize, system: usize) -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    match (ticks(user), ticks(system)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => 0.0,
    }
}

/// One measured figure and its baseline, with the goal it is held to
/// (stated as a bound on the ratio) and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Figure {
    pub(crate) name: String,
    pub(crate) ours: f64,
    pub(crate) baseline: f64,
    pub(crate) baseline_is: String,
    pub(crate) ratio: f64,
    pub(crate) units: String,
    pub(crate) params: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) goal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) met: Option<bool>,
}

impl Figure {
    pub(crate) fn new(
        name: &str,
        ours: f64,
        baseline: f64,
        baseline_is: &str,
        units: &str,
        params: serde_json::Value,
    ) -> Self {
        let ratio = if baseline == 0.0 {
            f64::NAN
        } else {
            ours / baseline
        };
        println!(
            "{name:<40} {ours:>14.2} {baseline:>14.2} {ratio:>8.3}  {units} (baseline: {baseline_is})"
        );
        Self {
            name: name.to_owned(),
            ours,
            baseline,
            baseline_is: baseline_is.to_owned(),
            ratio,
            units: units.to_owned(),
            params,
            goal: None,
            met: None,
        }
    }

    /// Held to a ratio of at least `least`.
    pub(crate) fn at_least(mut self, least: f64) -> Self {
        self.goal = Some(format!("ratio >= {least}"));
        self.met = Some(self.ratio >= least);
        self
    }

    /// Held to a ratio of at most `most`.
    pub(crate) fn at_most(mut self, most: f64) -> Self {
        self.goal = Some(format!("ratio <= {most}"));
        self.met = Some(self.ratio <= most);
        self
    }

    /// Held to no goal: it is there to read another figure by.
    pub(crate) fn informative(mut self, why: &str) -> Self {
        self.goal = Some(format!("none: {why}"));
        self
    }

    /// Held to `goal`, met or not as measured otherwise (`met`).
    pub(crate) fn held_to(mut self, goal: &str, met: bool) -> Self {
        self.goal = Some(goal.to_owned());
        self.met = Some(met);
        self
    }
}

fn main() {
    let mut out = PathBuf::from("target/bench/system.json");
    let mut only: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--out" => out = args.next().map(PathBuf::from).expect("--out needs a path"),
            "--bench" => {}
            other => only.push(other.to_owned()),
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| name.contains(o.as_str()));
    println!(
        "{:<40} {:>14} {:>14} {:>8}",
        "figure", "ours", "baseline", "ratio"
    );
    let mut figures = Vec::new();
    runtime.block_on(async {
        if wanted("scale") {
            figures.extend(scale::run().await);
        }
        if wanted("redis") {
            figures.extend(redis_cost::run().await);
        }
        if wanted("saturation") {
            figures.extend(saturation::run().await);
        }
        if wanted("scaling") {
            figures.extend(scaling::run().await);
        }
        if wanted("fairness") {
            figures.extend(fairness::run().await);
        }
        if wanted("middleware") {
            figures.extend(middleware::run().await);
        }
        if wanted("admissions") {
            figures.extend(admissions::run().await);
        }
        if wanted("client_cost") {
            figures.extend(client_cost::run().await);
        }
        if wanted("shared_hosts") {
            figures.extend(shared_hosts::run().await);
        }
        if wanted("contention") {
            figures.extend(contention::run().await);
        }
        if wanted("fleet") {
            figures.extend(fleet::run_figures().await);
        }
        if wanted("crawl_memory") {
            figures.extend(crawl_memory::run().await);
        }
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).expect("create the output directory");
    }
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&figures).expect("serialize"),
    )
    .expect("write the figures");
    println!("wrote {}", out.display());
}

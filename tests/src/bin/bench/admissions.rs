//! Admissions a second through one Redis with many free hosts: four
//! limiters (replicas) in this process, 64 callers each, each acquiring on
//! a host nobody asked for before and releasing at once (lease mode), for
//! `RUN`. The baseline is `redis-benchmark` running the GCRA function on
//! the same server in the same run, over as many keys (50 clients, one
//! call each in flight).
//!
//! An admission here is two script calls (the acquire and the release),
//! where a GCRA check is one; the goal (at least 0.4 of GCRA's rate) is
//! what the acquire at its own goal (1.5 times GCRA's server time) and a
//! release as cheap as GCRA would give with Redis the bottleneck.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redislimit::{HostKey, Limiter, Pacing, RedisLimiter, RedisPool, RedisTimeouts};
use redislimit_tests::RedisServer;
use serde_json::json;

use crate::Figure;

const REPLICAS: usize = 4;
const CALLERS: usize = 64;
const RUN: Duration = Duration::from_secs(3);
/// GCRA checks `redis-benchmark` makes, over this many random keys.
const GCRA_CALLS: &str = "200000";
const GCRA_KEYS: &str = "1000000";

/// The GCRA function `redis_cost` measures against, under the same name.
fn gcra_library() -> String {
    crate::redis_cost::gcra_library()
}

/// `redis-benchmark`'s requests a second for the GCRA function (from its
/// CSV output), or why there are none.
fn gcra_rate(server: &RedisServer) -> Result<f64, String> {
    server.command(&["FUNCTION", "LOAD", "REPLACE", &gcra_library()]);
    let output = Command::new("redis-benchmark")
        .args([
            "-p",
            &server.port().to_string(),
            "-c",
            "50",
            "-n",
            GCRA_CALLS,
        ])
        .args(["-r", GCRA_KEYS, "--csv"])
        .args([
            "FCALL",
            "bench_gcra",
            "1",
            "bench:gcra:__rand_int__",
            "1000",
        ])
        .output()
        .map_err(|e| format!("cannot run redis-benchmark: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "test","rps",... then "FCALL ...","12345.67",...
    text.lines()
        .nth(1)
        .and_then(|line| line.split("\",\"").nth(1))
        .and_then(|rps| rps.trim_matches('"').parse().ok())
        .ok_or_else(|| format!("no rate in redis-benchmark's output: {text}"))
}

/// Admissions a second: `REPLICAS` limiters, `CALLERS` callers each, each
/// on fresh hosts, for `RUN`.
async fn our_rate(server: &RedisServer) -> f64 {
    let admitted = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let next_host = Arc::new(AtomicUsize::new(0));
    let mut limiters = Vec::new();
    for _ in 0..REPLICAS {
        let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
        let limiter = RedisLimiter::builder(pool, "admissions")
            .pacing(Pacing::builder().max_concurrent(4).build().unwrap())
            .cluster_concurrency(4)
            .build()
            .unwrap();
        // Connected, agreed and registered before the count starts.
        drop(
            limiter
                .acquire_host("bench", host(usize::MAX), None)
                .await
                .unwrap(),
        );
        limiters.push(Arc::new(limiter));
    }
    let start = Instant::now();
    let mut callers = Vec::new();
    for limiter in &limiters {
        for _ in 0..CALLERS {
            let (limiter, admitted, stop, next_host) = (
                Arc::clone(limiter),
                Arc::clone(&admitted),
                Arc::clone(&stop),
                Arc::clone(&next_host),
            );
            callers.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let i = next_host.fetch_add(1, Ordering::Relaxed);
                    if let Ok(permit) = limiter.acquire_host("bench", host(i), None).await {
                        drop(permit);
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        let _ = caller.await;
    }
    let rate = admitted.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    for limiter in &limiters {
        let _ = limiter.close(None).await;
    }
    rate
}

fn host(i: usize) -> HostKey {
    HostKey::parse(&format!("http://h{i}.admissions.test/")).unwrap()
}

pub(crate) async fn run() -> Vec<Figure> {
    let server = RedisServer::start();
    let ours = our_rate(&server).await;
    let (baseline, note) = match gcra_rate(&server) {
        Ok(rate) => (rate, None),
        Err(why) => {
            eprintln!("admissions: {why}");
            (0.0, Some(why))
        }
    };
    let figure = Figure::new(
        "redis_admissions_per_sec_free_hosts",
        ours,
        baseline,
        "redis-benchmark running the GCRA function on the same server",
        "admissions/s",
        json!({
            "replicas": REPLICAS,
            "callers_per_replica": CALLERS,
            "mode": "lease, cap 4; each permit dropped at once (an acquire and a release)",
            "run_s": RUN.as_secs(),
            "baseline": format!("redis-benchmark -c 50 -n {GCRA_CALLS} -r {GCRA_KEYS} FCALL bench_gcra"),
            "baseline_error": note,
        }),
    );
    let met = baseline > 0.0 && figure.ratio >= 0.4;
    vec![figure.held_to("ratio >= 0.4", met)]
}

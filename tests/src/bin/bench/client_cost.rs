//! What an admission costs the replica that asks for it: this process's
//! CPU time (user and system, every thread) for an acquire and the release
//! of its permit, through Redis with the limiter the crawl builds
//! (`RedisLimiter`, with its fallback, live), against the same on an
//! in-process `DomainLimiter`. Each caller asks for a host nobody asked for
//! before, so nothing waits: what is measured is the work of the path, not
//! pacing. redis-server's CPU for the same admissions is reported beside it,
//! and the heap allocations and reallocations an admission makes on each
//! side (counted by the bench's allocator, every thread: unlike the CPU
//! time, the same from run to run).
//!
//! The fleet's figure (`fleet.rs`) is what the Redis path costs a crawl,
//! replicas, nginx and Redis sharing two cores; this one splits that cost
//! between the replica and redis-server, without HTTP. It has no goal of
//! its own: it tells whether a change to the acquire path made a
//! replica's work smaller. Like every figure on a shared machine it moves
//! between runs (28-34 µs in three on one build), the in-process baseline
//! with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redislimit::{
    DomainLimiter, HostKey, Limiter, LiveLimiter, Pacing, RedisLimiter, RedisPool, RedisTimeouts,
};
use redislimit_tests::RedisServer;
use serde_json::json;

use crate::Figure;

/// Callers in flight at once, as in `admissions.rs`.
const CALLERS: usize = 64;
/// Admissions through Redis, and in-process (more: each is ~15x cheaper,
/// and the process's CPU time is read in 10 ms ticks).
const THROUGH_REDIS: usize = 300_000;
const IN_PROCESS: usize = 1_000_000;

/// The fleet's pacing (`fleet.rs`): a gap, a lease cap of 2.
pub(crate) fn pacing() -> Pacing {
    Pacing::builder()
        .min_delay(Duration::from_millis(230))
        .max_concurrent(2)
        .build()
        .expect("valid pacing")
}

/// This process's CPU time so far (s), user and system, every thread
/// (`utime` and `stime`).
fn own_cpu_secs() -> f64 {
    crate::stat_cpu_secs(11, 12)
}

/// redis-server's CPU time so far (s).
pub(crate) fn server_cpu_secs(server: &RedisServer) -> f64 {
    let info = server.command(&["INFO", "cpu"]);
    ["used_cpu_user", "used_cpu_sys"]
        .iter()
        .filter_map(|name| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .sum()
}

fn host(tag: &str, i: usize) -> HostKey {
    HostKey::parse(&format!("http://h{i}.{tag}.client-cost.test/")).expect("a valid host")
}

/// What an admission cost this process: CPU µs, and heap allocations and
/// reallocations.
pub(crate) struct Cost {
    pub(crate) cpu_us: f64,
    pub(crate) allocations: f64,
}

/// What this process spends an admission: `n` acquires, each on a fresh
/// host and released at once, `CALLERS` at a time. The hosts are made
/// before the clock starts.
async fn cost_per_admission(limiter: Arc<dyn Limiter>, tag: &str, n: usize) -> Cost {
    let hosts: Arc<Vec<HostKey>> = Arc::new((0..n).map(|i| host(tag, i)).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let allocations = crate::allocations();
    let before = own_cpu_secs();
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        let (limiter, hosts, next) = (Arc::clone(&limiter), Arc::clone(&hosts), Arc::clone(&next));
        callers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(host) = hosts.get(i) else { break };
                let permit = limiter
                    .acquire_host("bench", host.clone(), None)
                    .await
                    .expect("a fresh host admits at once");
                drop(permit);
            }
        }));
    }
    for caller in callers {
        caller.await.expect("a caller panicked");
    }
    Cost {
        cpu_us: (own_cpu_secs() - before) * 1e6 / n as f64,
        allocations: (crate::allocations() - allocations) as f64 / n as f64,
    }
}

/// A limiter through `server` in `scope` as the crawl builds it, at the
/// fleet's pacing, on a pool of its own.
pub(crate) fn crawl_limiter(server: &RedisServer, scope: &str) -> LiveLimiter {
    let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
    RedisLimiter::builder(pool, scope)
        .pacing(pacing())
        .cluster_concurrency(2)
        .lease_ttl(Duration::from_secs(10))
        .build()
        .unwrap()
        .with_fallback()
        .live()
}

pub(crate) async fn run() -> Vec<Figure> {
    let server = RedisServer::start();
    let redis = Arc::new(crawl_limiter(&server, "client-cost"));
    // Connected, agreed and registered before the count starts.
    let warm = redis.acquire_host("bench", host("warm", 0), None).await;
    drop(warm.expect("Redis admits"));
    let server_before = server_cpu_secs(&server);
    let ours = cost_per_admission(
        Arc::clone(&redis) as Arc<dyn Limiter>,
        "redis",
        THROUGH_REDIS,
    )
    .await;
    let server_us = (server_cpu_secs(&server) - server_before) * 1e6 / THROUGH_REDIS as f64;
    let _ = redis.close(None).await;
    let local: Arc<dyn Limiter> = Arc::new(DomainLimiter::new(pacing()));
    let baseline = cost_per_admission(local, "local", IN_PROCESS).await;
    let figure = Figure::new(
        "client_cpu_per_admission_redis_vs_in_process",
        ours.cpu_us,
        baseline.cpu_us,
        "the same admissions on an in-process DomainLimiter",
        "µs of CPU in the replica",
        json!({
            "callers": CALLERS,
            "admissions_through_redis": THROUGH_REDIS,
            "admissions_in_process": IN_PROCESS,
            "limiter": "RedisLimiter::with_fallback().live(), as the crawl builds it",
            "mode": "lease, cap 2, min_delay 230 ms; each host fresh, each permit dropped at once",
            "redis_server_cpu_us_per_admission": server_us,
            "allocations_per_admission": ours.allocations,
            "allocations_per_admission_in_process": baseline.allocations,
        }),
    );
    println!(
        "  redis-server: {server_us:.1} µs of CPU an admission; heap allocations and reallocations an admission: {:.1} through Redis, {:.1} in-process",
        ours.allocations, baseline.allocations
    );
    vec![figure.informative(
        "the replica's side of the Redis path, steadier than the fleet's ratio it explains",
    )]
}

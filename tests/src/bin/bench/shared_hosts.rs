//! What an admission costs a replica when its hosts are shared and asked
//! for together: six limiters in this process (as six replicas, each with
//! its own pool and registration, built as the crawl builds them) each
//! acquire once for each of 2,000 hosts, every acquire started at once, at
//! the fleet's pacing (230 ms gap, lease cap 2). Through Redis each host's
//! six admissions are spread 230 ms apart, so most acquires meet a booked
//! host: they are booked ahead, or told to wait and ask again. That is a
//! start-up crowd, harsher than the fleet's steady state (`fleet.rs`),
//! whose replicas reach a host at different times and ask again less. The
//! baseline is six in-process `DomainLimiter`s, each pacing only its own
//! acquire a host, which never waits (as the fleet's in-process baseline).
//!
//! `client_cost.rs` measures an admission on a fresh host; this one adds
//! the waits and the calls asked again. Informative, no goal: this
//! process's CPU time an admission, with its heap allocations and
//! reallocations, redis-server's CPU and the Redis calls an admission
//! beside it.

use std::sync::Arc;

use redislimit::{DomainLimiter, HostKey, Limiter};
use redislimit_tests::RedisServer;
use serde_json::json;

use crate::Figure;
use crate::client_cost::{Cost, crawl_limiter, pacing, server_cpu_secs};

const REPLICAS: usize = 6;
const HOSTS: usize = 2_000;

fn host(tag: &str, i: usize) -> HostKey {
    HostKey::parse(&format!("http://h{i}.{tag}.shared-hosts.test/")).expect("a valid host")
}

/// Every limiter acquires once for each host, all at once, each permit
/// dropped as it is granted.
async fn cost_per_admission(limiters: &[Arc<dyn Limiter>], tag: &str) -> Cost {
    let hosts: Vec<HostKey> = (0..HOSTS).map(|i| host(tag, i)).collect();
    let allocations = crate::allocations();
    let before = crate::stat_cpu_secs(11, 12);
    let mut acquires = Vec::new();
    for limiter in limiters {
        for host in &hosts {
            let (limiter, host) = (Arc::clone(limiter), host.clone());
            acquires.push(tokio::spawn(async move {
                let permit = limiter
                    .acquire_host("bench", host, None)
                    .await
                    .expect("every acquire is admitted in time");
                drop(permit);
            }));
        }
    }
    for acquire in acquires {
        acquire.await.expect("an acquire panicked");
    }
    let n = (limiters.len() * HOSTS) as f64;
    Cost {
        cpu_us: (crate::stat_cpu_secs(11, 12) - before) * 1e6 / n,
        allocations: (crate::allocations() - allocations) as f64 / n,
    }
}

/// redis-server's CPU time so far (s), and the commands its clients sent
/// (not those the scripts ran).
fn server_work(server: &RedisServer) -> (f64, f64) {
    let sent = crate::contention::sent(server) as f64;
    (server_cpu_secs(server), sent)
}

pub(crate) async fn run() -> Vec<Figure> {
    let server = RedisServer::start();
    let mut shared: Vec<Arc<dyn Limiter>> = Vec::new();
    for _ in 0..REPLICAS {
        shared.push(Arc::new(crawl_limiter(&server, "shared-hosts")));
    }
    // Connected, agreed and registered before the count starts.
    for (i, limiter) in shared.iter().enumerate() {
        let warm = limiter.acquire_host("bench", host("warm", i), None).await;
        drop(warm.expect("Redis admits"));
    }
    let (server_cpu, commands) = server_work(&server);
    let ours = cost_per_admission(&shared, "redis").await;
    let (server_cpu_after, commands_after) = server_work(&server);
    let n = (REPLICAS * HOSTS) as f64;
    let server_us = (server_cpu_after - server_cpu) * 1e6 / n;
    let calls = (commands_after - commands) / n;
    for limiter in &shared {
        let _ = limiter.close(None).await;
    }
    let local: Vec<Arc<dyn Limiter>> = (0..REPLICAS)
        .map(|_| Arc::new(DomainLimiter::new(pacing())) as Arc<dyn Limiter>)
        .collect();
    let baseline = cost_per_admission(&local, "local").await;
    println!(
        "  redis-server: {server_us:.1} µs of CPU and {calls:.2} calls an admission; heap allocations and reallocations an admission: {:.1} through Redis, {:.1} in-process",
        ours.allocations, baseline.allocations
    );
    let figure = Figure::new(
        "client_cpu_per_admission_shared_hosts_redis_vs_in_process",
        ours.cpu_us,
        baseline.cpu_us,
        "six in-process DomainLimiters, each pacing its own acquire a host",
        "µs of CPU in the replicas' process",
        json!({
            "replicas": REPLICAS,
            "hosts": HOSTS,
            "limiter": "RedisLimiter::with_fallback().live() each, as the crawl builds it",
            "mode": "lease, cap 2, min_delay 230 ms; every acquire started at once, each permit dropped when granted",
            "redis_server_cpu_us_per_admission": server_us,
            "redis_commands_per_admission": calls,
            "allocations_per_admission": ours.allocations,
            "allocations_per_admission_in_process": baseline.allocations,
        }),
    );
    vec![figure.informative(
        "what an admission costs on hosts a crowd of replicas asks for together, beside client_cost's fresh host",
    )]
}

//! Redis calls per request with four replicas contending for one host
//! (lease mode, cap 2, a 10 ms pace: 100 a second), counted by Redis in
//! `INFO commandstats`: every command a client sent (script calls, a
//! lease's release by `ZREM`, function loads, pings, connection set-up),
//! not the commands the scripts ran (but for the `ZREM`s of the rare
//! abandoned acquires and voided tokens, which Redis counts with the
//! releases'). The baseline is the same count for one replica alone on
//! the host, at the same pace.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redislimit::{Pacing, RedisLimiter, RedisPool, RedisTimeouts};
use redislimit_reqwest::PacingMiddleware;
use redislimit_tests::{RedisServer, Upstream};
use serde_json::json;

use crate::Figure;

const HOST: &str = "contended.test";
const GAP: Duration = Duration::from_millis(10);
const CAP: u32 = 2;
const WORKERS: usize = 4;
const RUN: Duration = Duration::from_secs(3);

/// Commands clients send; the rest in `INFO commandstats` are the ones the
/// scripts ran.
const SENT: [&str; 12] = [
    "fcall",
    "zrem",
    "evalsha",
    "eval",
    "function|load",
    "script|load",
    "ping",
    "hello",
    "auth",
    "select",
    "client|setinfo",
    "client|setname",
];

/// Commands clients sent since the last `CONFIG RESETSTAT`.
pub(crate) fn sent(server: &RedisServer) -> u64 {
    server
        .command(&["INFO", "commandstats"])
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            if !SENT.contains(&name) {
                return None;
            }
            rest.strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// `replicas` limiters, `WORKERS` workers each, sending to the one host
/// for `RUN` (after one request each, uncounted): Redis calls per request
/// the upstream saw, and requests a second.
async fn calls_per_request(replicas: usize) -> (f64, f64) {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let url = upstream.url(HOST, "/slow?chunks=1&every=2");
    let mut clients = Vec::new();
    for _ in 0..replicas {
        let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
        let limiter = RedisLimiter::builder(pool, "contention")
            .pacing(Pacing::builder().min_delay(GAP).build().unwrap())
            .cluster_concurrency(CAP)
            .build()
            .unwrap();
        let http = reqwest::Client::builder()
            .resolve(HOST, upstream.addr())
            .build()
            .unwrap();
        let client = reqwest_middleware::ClientBuilder::new(http)
            .with(PacingMiddleware::new(limiter))
            .build();
        // Connected, agreed and registered before the count starts.
        if let Ok(response) = client.get(&url).send().await {
            let _ = response.bytes().await;
        }
        clients.push(client);
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // the releases land
    server.command(&["CONFIG", "RESETSTAT"]);
    let before = upstream.arrivals();
    let stop = Arc::new(AtomicBool::new(false));
    let start = std::time::Instant::now();
    let mut workers = Vec::new();
    for client in &clients {
        for _ in 0..WORKERS {
            let (client, url, stop) = (client.clone(), url.clone(), Arc::clone(&stop));
            workers.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(response) = client.get(&url).send().await {
                        let _ = response.bytes().await;
                    }
                }
            }));
        }
    }
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(200)).await; // the last releases land
    let requests = (upstream.arrivals() - before) as f64;
    (sent(&server) as f64 / requests.max(1.0), requests / elapsed)
}

pub(crate) async fn run() -> Vec<Figure> {
    let (alone, alone_rate) = calls_per_request(1).await;
    let (four, four_rate) = calls_per_request(4).await;
    vec![
        Figure::new(
            "redis_calls_per_request_4_replicas_one_host",
            four,
            alone,
            "one replica alone on the host",
            "calls/request",
            json!({
                "replicas": 4,
                "workers_per_replica": WORKERS,
                "mode": "lease, cap 2",
                "min_delay_ms": GAP.as_millis() as u64,
                "requests_per_sec": four_rate,
                "alone_requests_per_sec": alone_rate,
                "counted": "commands clients sent, from INFO commandstats",
            }),
        )
        .held_to("ours <= 2.2 calls a request", four <= 2.2),
    ]
}

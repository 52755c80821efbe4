//! Lease mode with `cluster_concurrency = 8` and an upstream that takes
//! 50 ms per request: throughput with 1, 2, 4 and 8 replicas, each one
//! worker sending requests one after another through the reqwest
//! middleware. Baseline: `n` times one replica's throughput (linear).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redislimit::{RedisLimiter, RedisPool, RedisTimeouts};
use redislimit_reqwest::PacingMiddleware;
use redislimit_tests::{RedisServer, Upstream};
use serde_json::json;

use crate::Figure;

const RUN: Duration = Duration::from_secs(2);

async fn throughput(server: &RedisServer, upstream: &Upstream, replicas: usize) -> f64 {
    let done = Arc::new(AtomicUsize::new(0));
    let url = upstream.url("scale.test", "/slow?chunks=1&every=50");
    let end = Instant::now() + RUN;
    let mut workers = Vec::new();
    for _ in 0..replicas {
        let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
        let limiter = RedisLimiter::builder(pool, "scaling")
            .cluster_concurrency(8)
            .build()
            .unwrap();
        let http = reqwest::Client::builder()
            .resolve("scale.test", upstream.addr())
            .build()
            .unwrap();
        let client = reqwest_middleware::ClientBuilder::new(http)
            .with(PacingMiddleware::new(limiter.with_fallback()))
            .build();
        let (done, url) = (Arc::clone(&done), url.clone());
        workers.push(tokio::spawn(async move {
            while Instant::now() < end {
                if let Ok(response) = client.get(&url).send().await
                    && response.bytes().await.is_ok()
                {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let start = Instant::now();
    for worker in workers {
        let _ = worker.await;
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

pub(crate) async fn run() -> Vec<Figure> {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let one = throughput(&server, &upstream, 1).await;
    let mut figures = Vec::new();
    for n in [1, 2, 4, 8] {
        let ours = if n == 1 {
            one
        } else {
            throughput(&server, &upstream, n).await
        };
        figures.push(Figure::new(
            &format!("scaling_lease_{n}_replicas"),
            ours,
            one * n as f64,
            "linear: n x one replica",
            "requests/s",
            json!({ "replicas": n, "cluster_concurrency": 8, "upstream_ms": 50, "workers_per_replica": 1 }),
        ).at_least(0.95));
    }
    figures
}

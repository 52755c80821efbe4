//! Middleware overhead: sequential requests through the reqwest middleware
//! with pacing that never waits, against bare reqwest to the same loopback
//! server; p50 and p99 latency, in-process and with Redis.

use std::time::Instant;

use redislimit::{DomainLimiter, Limiter, Pacing, RedisLimiter, RedisPool, RedisTimeouts};
use redislimit_reqwest::PacingMiddleware;
use redislimit_tests::{RedisServer, Upstream};
use reqwest_middleware::ClientWithMiddleware;
use serde_json::json;

use crate::Figure;

const REQUESTS: usize = 2000;
const WARMUP: usize = 200;
const ROUNDS: usize = 5;

fn client(upstream: &Upstream, limiter: Option<Box<dyn Limiter>>) -> ClientWithMiddleware {
    let http = reqwest::Client::builder()
        .resolve("mw.test", upstream.addr())
        .build()
        .unwrap();
    let builder = reqwest_middleware::ClientBuilder::new(http);
    match limiter {
        Some(limiter) => builder
            .with(PacingMiddleware::from_arc(limiter.into()))
            .build(),
        None => builder.build(),
    }
}

/// Latencies (µs) of `n` sequential GETs.
async fn latencies(client: &ClientWithMiddleware, url: &str, n: usize) -> Vec<f64> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let response = client.get(url).send().await.unwrap();
        response.bytes().await.unwrap();
        all.push(start.elapsed().as_secs_f64() * 1e6);
    }
    all
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub(crate) async fn run() -> Vec<Figure> {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let url = upstream.url("mw.test", "/");
    let never_waits = || Pacing::builder().max_concurrent(1000).build().unwrap();
    let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
    let redis = RedisLimiter::builder(pool, "middleware")
        .pacing(never_waits())
        .cluster_concurrency(1000)
        .build()
        .unwrap();
    // The same pool's round trip (a PING), measured beside the requests.
    let probe = redis.clone();
    let bare_acquire = redis.clone();
    let redis = redis.with_fallback();
    let clients = [
        client(&upstream, None),
        client(&upstream, Some(Box::new(DomainLimiter::new(never_waits())))),
        client(&upstream, Some(Box::new(redis))),
    ];
    // Warm every client up, then interleave rounds so that drift in the
    // machine's load falls on all three alike.
    for c in &clients {
        latencies(c, &url, WARMUP).await;
    }
    let mut samples = [Vec::new(), Vec::new(), Vec::new()];
    let mut round_trips = Vec::new();
    // The acquire alone (the limiter without the middleware), each followed
    // by a bare request while its release goes out, as in the middleware.
    let mut acquires = Vec::new();
    let host = redislimit::HostKey::parse(&url).unwrap();
    for _ in 0..ROUNDS {
        for (c, s) in clients.iter().zip(samples.iter_mut()) {
            s.extend(latencies(c, &url, REQUESTS / ROUNDS).await);
        }
        for _ in 0..REQUESTS / ROUNDS {
            let start = Instant::now();
            probe.ping().await.expect("Redis answers");
            round_trips.push(start.elapsed().as_secs_f64() * 1e6);
        }
        for _ in 0..REQUESTS / ROUNDS {
            let start = Instant::now();
            let permit = bare_acquire
                .acquire_host("bench", host.clone(), None)
                .await
                .expect("admitted");
            acquires.push(start.elapsed().as_secs_f64() * 1e6);
            let response = clients[0].get(&url).send().await.unwrap();
            response.bytes().await.unwrap();
            drop(permit);
        }
    }
    acquires.sort_by(f64::total_cmp);
    round_trips.sort_by(f64::total_cmp);
    for s in &mut samples {
        s.sort_by(f64::total_cmp);
    }
    let [bare, local, shared] = samples;

    let params = json!({ "requests": REQUESTS, "upstream": "loopback, empty 200" });
    let mut figures = Vec::new();
    for (label, sorted) in [("in_process", &local), ("redis", &shared)] {
        for (p, name) in [(0.5, "p50"), (0.99, "p99")] {
            let figure = Figure::new(
                &format!("middleware_{label}_{name}_latency"),
                pct(sorted, p),
                pct(&bare, p),
                "bare reqwest",
                "µs",
                params.clone(),
            );
            figures.push(match (label, name) {
                ("in_process", "p50") => figure.at_most(1.1),
                ("in_process", _) => figure.at_most(1.25),
                _ => figure.informative("read with middleware_redis_p50_added"),
            });
        }
    }
    let rtt = pct(&round_trips, 0.5);
    figures.push(
        Figure::new(
            "middleware_redis_acquire_p50",
            pct(&acquires, 0.5),
            rtt,
            "one Redis round trip (PING, p50, same run)",
            "µs",
            json!({ "requests": REQUESTS, "what": "RedisLimiter::acquire_host alone, between bare requests" }),
        )
        .informative("where middleware_redis_p50_added goes"),
    );
    figures.push(
        Figure::new(
            "middleware_redis_p50_added",
            pct(&shared, 0.5) - pct(&bare, 0.5),
            rtt + 20.0,
            "one Redis round trip (PING, p50, same run) + 20 µs",
            "µs",
            json!({ "requests": REQUESTS, "redis_round_trip_p50_us": rtt }),
        )
        .at_most(1.0),
    );
    figures
}

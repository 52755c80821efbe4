//! The adaptive backoff through Redis: one gap per host for every replica,
//! judged from when the upstream saw the requests.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redislimit::http::Backoff;
use redislimit::{Limiter, RedisLimiter};
use redislimit_reqwest::PacingMiddleware;
use redislimit_tests::keys::HostKeys;
use redislimit_tests::{RedisServer, Upstream};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

use crate::{MS, bounded, host, limiter, standalone};

/// A replica: its own pool and limiter on the shared scope.
fn replica(server: &RedisServer) -> Arc<RedisLimiter> {
    Arc::new(limiter(
        standalone(&server.url()),
        |p| p.min_delay(10 * MS),
        |b| b.lease_ttl(Duration::from_secs(2)),
    ))
}

fn client(limiter: Arc<RedisLimiter>, upstream: &Upstream) -> ClientWithMiddleware {
    let http = reqwest::Client::builder()
        .resolve("a.test", upstream.addr())
        .build()
        .unwrap();
    ClientBuilder::new(http)
        .with(PacingMiddleware::from_arc(limiter))
        .build()
}

async fn get(client: &ClientWithMiddleware, url: &str) -> reqwest::StatusCode {
    let response = bounded(20, client.get(url).send()).await.unwrap();
    let status = response.status();
    response.bytes().await.unwrap();
    status
}

/// Regression: the gap was kept per process, so with two replicas taking
/// turns each bare 503 widened only its own replica's gap (1 s, 1 s, 2 s,
/// 2 s ...): R replicas let R times as many requests reach a failing host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_503_widens_one_gap_for_every_replica() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let far = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(60);
    let url = upstream.url("a.test", &format!("/outage?until={}", far.as_millis()));
    let (a, b) = (replica(&server), replica(&server));
    let (ca, cb) = (client(Arc::clone(&a), &upstream), client(b, &upstream));
    // A, B, A in turn: each sees the outage.
    for c in [&ca, &cb, &ca] {
        assert_eq!(get(c, &url).await, 503);
    }
    let seen = upstream.recorder().host("a.test");
    assert_eq!(seen.len(), 3);
    let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].send - w[0].send).collect();
    // 1 s after A's 503; 2 s after B's, which widened the gap A's made.
    let slack = 15 * MS;
    assert!(gaps[0] + slack >= Duration::from_secs(1), "{gaps:?}");
    assert!(gaps[1] + slack >= Duration::from_secs(2), "{gaps:?}");
    // The gap in Redis is A's to move too: a widen by A's own (fresh)
    // backoff doubles it (kept in this process alone, it would be 1 s).
    let widened = Backoff::default().widen_through(&*a, &host("a.test")).await;
    assert_eq!(widened, Some(Duration::from_secs(8)));
}

/// Narrowing on success, by any replica that saw the failures, brings the
/// gap back below its start and the host back to its own pacing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successes_narrow_the_shared_gap_away() {
    let server = RedisServer::start();
    let l = replica(&server);
    let h = host("n.test");
    let s = Duration::from_secs;
    let backoff = Backoff::new(s(1), s(3));
    let gate = HostKeys::of("test", h.as_str()).gate;
    let mut gaps = Vec::new();
    for widen in [true, true, true, true, false, false, false, false] {
        let gap = if widen {
            backoff.widen_through(&*l, &h).await
        } else {
            backoff.narrow_through(&*l, &h).await
        };
        // The gap is the one in Redis, where every replica reads it.
        let shared = server.query(&["HGET", &gate, "backoff"]);
        let micros = gap.map(|gap| gap.as_micros().to_string());
        assert_eq!(shared.as_str(), micros.as_deref(), "{gap:?}");
        gaps.push(gap);
    }
    let us = |n| Some(Duration::from_micros(n));
    let expected = [
        us(1_000_000),
        us(2_000_000),
        us(3_000_000),
        us(3_000_000),
        us(2_250_000),
        us(1_687_500),
        us(1_265_625),
        None,
    ];
    assert_eq!(gaps, expected);
    // Garbage where the gap is kept: healed, the host still held.
    server.command(&["HSET", &gate, "backoff", "soon"]);
    let healed = Backoff::new(s(1), s(3)).widen_through(&*l, &h).await;
    assert_eq!(healed, Some(s(1)));
    let start = std::time::Instant::now();
    l.acquire_host("t", h, None).await.unwrap().release();
    assert!(start.elapsed() + 15 * MS >= s(1), "{:?}", start.elapsed());
}

/// Redis killed: the gap is kept in process (the fallback holds the host),
/// and still widens on each bare 503, as the upstream sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_dead_the_gap_widens_in_process() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let far = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(60);
    let url = upstream.url("a.test", &format!("/outage?until={}", far.as_millis()));
    let limiter = Arc::new(
        limiter(
            standalone(&server.url()),
            |p| p.min_delay(10 * MS),
            |b| b.lease_ttl(Duration::from_secs(2)),
        )
        .with_fallback(),
    );
    // Sharing first, so the fallback takes over from a live limiter.
    drop(
        limiter
            .acquire_host("t", host("warm.test"), None)
            .await
            .unwrap(),
    );
    server.kill();
    let http = reqwest::Client::builder()
        .resolve("a.test", upstream.addr())
        .build()
        .unwrap();
    let client = ClientBuilder::new(http)
        .with(PacingMiddleware::from_arc(limiter))
        .build();
    for _ in 0..3 {
        assert_eq!(get(&client, &url).await, 503);
    }
    let seen = upstream.recorder().host("a.test");
    assert_eq!(seen.len(), 3);
    let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].send - w[0].send).collect();
    let slack = 15 * MS;
    assert!(gaps[0] + slack >= Duration::from_secs(1), "{gaps:?}");
    assert!(gaps[1] + slack >= Duration::from_secs(2), "{gaps:?}");
}

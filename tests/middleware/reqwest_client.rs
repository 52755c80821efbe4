//! `PacingMiddleware` on a reqwest client.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redislimit::{Error, Hooks, Limiter, RedisLimiter, RedisPool, RedisTimeouts, WaitOutcome};
use redislimit_reqwest::{Engine, PaceOptions, PacingMiddleware, pacing_error};
use redislimit_tests::record::{assert_serialized, max_in_flight};
use redislimit_tests::{RedisServer, Upstream};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::{RetryTransientMiddleware, policies::ExponentialBackoff};

use crate::{HOSTS, MS, bounded, domain_limiter};

fn reqwest_client(upstream: &Upstream) -> reqwest::Client {
    let mut builder = reqwest::Client::builder();
    for host in HOSTS {
        builder = builder.resolve(host, upstream.addr());
    }
    builder.build().unwrap()
}

fn client(upstream: &Upstream, middleware: PacingMiddleware) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest_client(upstream))
        .with(middleware)
        .build()
}

/// GETs `url` and reads the whole body.
async fn fetch(client: &ClientWithMiddleware, url: &str) -> reqwest::StatusCode {
    let response = client.get(url).send().await.unwrap();
    let status = response.status();
    response.bytes().await.unwrap();
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pacing_is_observed_at_the_server_for_several_hosts() {
    let upstream = Upstream::start().await;
    let gap = 40 * MS;
    let client = client(
        &upstream,
        PacingMiddleware::new(domain_limiter(|p| p.max_concurrent(1).min_delay(gap))),
    );
    let mut tasks = Vec::new();
    for host in HOSTS {
        for _ in 0..3 {
            let (client, url) = (
                client.clone(),
                upstream.url(host, "/slow?chunks=2&every=10"),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..2 {
                    fetch(&client, &url).await;
                }
            }));
        }
    }
    for t in tasks {
        bounded(30, t).await.unwrap();
    }
    let all = upstream.recorder().all();
    for host in HOSTS {
        let seen = upstream.recorder().host(host);
        assert_eq!(seen.len(), 6, "{host}");
        assert_serialized(&seen, gap);
    }
    // Hosts are paced independently: their requests interleave.
    assert!(
        max_in_flight(&all) >= 2,
        "hosts were serialized against each other"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_streamed_body_keeps_the_permit_until_it_ends() {
    let upstream = Upstream::start().await;
    let gap = 30 * MS;
    let client = client(
        &upstream,
        PacingMiddleware::new(domain_limiter(|p| p.max_concurrent(1).min_delay(gap))),
    );
    let slow = {
        let (client, url) = (
            client.clone(),
            upstream.url("a.test", "/slow?chunks=5&every=60"),
        );
        tokio::spawn(async move { fetch(&client, &url).await })
    };
    tokio::time::sleep(50 * MS).await; // the slow body is streaming now
    assert_eq!(fetch(&client, &upstream.url("a.test", "/")).await, 200);
    slow.await.unwrap();
    let seen = upstream.recorder().host("a.test");
    assert_eq!(seen.len(), 2);
    // The second request reached the server only after the slow body ended.
    assert_serialized(&seen, gap);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_response_unread_releases_the_permit() {
    let upstream = Upstream::start().await;
    let client = client(
        &upstream,
        PacingMiddleware::new(domain_limiter(|p| p.max_concurrent(1)))
            .with_options(PaceOptions::default().with_max_wait(Duration::from_secs(2))),
    );
    let response = client
        .get(upstream.url("a.test", "/slow?chunks=50&every=100"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    drop(response); // 5 s of body never read
    // A leaked permit would make this wait past its 2 s budget and fail.
    let status = bounded(10, fetch(&client, &upstream.url("a.test", "/"))).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_response_keeps_its_url_status_headers_and_extensions() {
    let upstream = Upstream::start().await;
    let client = client(&upstream, PacingMiddleware::new(domain_limiter(|p| p)));
    let url = upstream.url("b.test", "/status?code=404");
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.url().as_str(), url);
    assert_eq!(response.status(), 404);
    assert!(response.headers().contains_key("date"));
    assert_eq!(response.remote_addr(), Some(upstream.addr()));
    assert_eq!(response.text().await.unwrap(), "ok\n");
}

/// Sends a 429 through `first`, then a plain request through `second`;
/// returns how long after the 429 ended the second request arrived.
async fn gap_after_429(
    upstream: &Upstream,
    first: &ClientWithMiddleware,
    second: &ClientWithMiddleware,
    query: &str,
) -> Duration {
    let status = fetch(
        first,
        &upstream.url("a.test", &format!("/status?code=429&{query}")),
    )
    .await;
    assert_eq!(status, 429);
    assert_eq!(
        bounded(20, fetch(second, &upstream.url("a.test", "/"))).await,
        200
    );
    let seen = upstream.recorder().host("a.test");
    seen[1].send - seen[0].end
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_penalizes_the_host_on_every_client_sharing_the_limiter() {
    for (query, hold) in [
        ("retry_after=2", 2),
        ("retry_in=2", 2),
        // The server's clock is an hour behind; its Date header says so.
        ("retry_in=2&date_skew=3600", 2),
    ] {
        let upstream = Upstream::start().await;
        let shared: Arc<dyn Limiter> = Arc::new(domain_limiter(|p| p.max_concurrent(4)));
        let a = client(&upstream, PacingMiddleware::from_arc(Arc::clone(&shared)));
        let b = client(&upstream, PacingMiddleware::from_arc(shared));
        let gap = gap_after_429(&upstream, &a, &b, query).await;
        assert!(
            gap >= Duration::from_secs(hold),
            "{query}: the next request came {gap:?} after the 429"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_reaches_every_replica_through_redis() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let replica = || {
        let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
        let limiter = RedisLimiter::builder(pool, "domain")
            .cluster_concurrency(4)
            .build()
            .unwrap();
        client(&upstream, PacingMiddleware::new(limiter.with_fallback()))
    };
    let gap = gap_after_429(&upstream, &replica(), &replica(), "retry_after=2").await;
    assert!(
        gap >= Duration::from_secs(2),
        "the other replica sent {gap:?} after the 429"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_huge_retry_after_values_are_bounded() {
    // Garbage: read as no delay at all, so a short budget is enough
    // (without the adaptive backoff, which a bare 429/503 would start).
    let upstream = Upstream::start().await;
    let limiter: Arc<dyn Limiter> = Arc::new(domain_limiter(|p| {
        p.max_concurrent(2).max_penalty(Duration::from_secs(1))
    }));
    let c = client(
        &upstream,
        PacingMiddleware::from_arc(Arc::clone(&limiter)).with_options(
            PaceOptions::default()
                .with_max_wait(500 * MS)
                .with_backoff(None),
        ),
    );
    for (code, value) in [(429, "soon"), (503, "-5")] {
        let status = fetch(
            &c,
            &upstream.url(
                "a.test",
                &format!("/status?code={code}&retry_after={value}"),
            ),
        )
        .await;
        assert_eq!(status, code);
        assert_eq!(
            fetch(&c, &upstream.url("a.test", "/")).await,
            200,
            "Retry-After: {value} held the host"
        );
    }

    // Huge: held for max_penalty (1 s), not for three centuries.
    let upstream = Upstream::start().await;
    let c = client(
        &upstream,
        PacingMiddleware::from_arc(limiter)
            .with_options(PaceOptions::default().with_max_wait(Duration::from_secs(3))),
    );
    let gap = gap_after_429(&upstream, &c, &c, "retry_after=9999999999999").await;
    assert!(gap >= Duration::from_secs(1), "{gap:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_penalty_applies_without_retry_after() {
    let upstream = Upstream::start().await;
    let c = client(
        &upstream,
        PacingMiddleware::new(domain_limiter(|p| p.max_concurrent(2)))
            .with_options(PaceOptions::default().with_default_penalty(Duration::from_millis(700))),
    );
    let gap = gap_after_429(&upstream, &c, &c, "x=1").await;
    assert!(gap >= 700 * MS, "{gap:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_timeout_shorter_than_the_wait_fails_fast() {
    let upstream = Upstream::start().await;
    let c = client(
        &upstream,
        PacingMiddleware::new(domain_limiter(|p| p.min_delay(Duration::from_secs(5)))),
    );
    assert_eq!(fetch(&c, &upstream.url("a.test", "/")).await, 200);
    let start = Instant::now();
    let err = c
        .get(upstream.url("a.test", "/"))
        .timeout(300 * MS)
        .send()
        .await
        .unwrap_err();
    assert!(start.elapsed() < 300 * MS, "the wait was slept out");
    match pacing_error(&err) {
        Some(Error::WaitBudget { host, wait, .. }) => {
            assert_eq!(host, "a.test");
            assert!(*wait > 300 * MS);
        }
        other => panic!("expected WaitBudget, got {other:?} from {err}"),
    }
    assert!(
        err.to_string().contains("a.test"),
        "the message should name the host: {err}"
    );
    assert_eq!(
        upstream.recorder().host("a.test").len(),
        1,
        "the refused request reached the server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_retry_through_reqwest_retry_is_paced() {
    let upstream = Upstream::start().await;
    let gap = 100 * MS;
    let policy = ExponentialBackoff::builder()
        .retry_bounds(MS, 2 * MS)
        .build_with_max_retries(3);
    // Retry outermost, pacing inside it: each attempt goes through pacing.
    let c = ClientBuilder::new(reqwest_client(&upstream))
        .with(RetryTransientMiddleware::new_with_policy(policy))
        .with(PacingMiddleware::new(domain_limiter(|p| p.min_delay(gap))))
        .build();
    assert_eq!(
        fetch(&c, &upstream.url("a.test", "/status?code=503")).await,
        503
    );
    let seen = upstream.recorder().host("a.test");
    assert_eq!(seen.len(), 4, "one request and three retries");
    assert_serialized(&seen, gap);
}

#[derive(Debug, Default)]
struct Engines(Mutex<Vec<String>>);

impl Hooks for Engines {
    fn on_wait(&self, engine: &str, _: WaitOutcome, _: Duration) {
        self.0.lock().unwrap().push(engine.to_owned());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_label_can_be_overridden_per_request() {
    let upstream = Upstream::start().await;
    let hooks = Arc::new(Engines::default());
    let limiter =
        redislimit::DomainLimiter::with_hooks(redislimit::Pacing::default(), hooks.clone());
    let c = client(
        &upstream,
        PacingMiddleware::new(limiter).with_options(PaceOptions::default().with_engine("crawler")),
    );
    c.get(upstream.url("a.test", "/"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    c.get(upstream.url("a.test", "/"))
        .with_extension(Engine::new("search"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(*hooks.0.lock().unwrap(), ["crawler", "search"]);
}

//! Request weights across two replicas sharing one Redis, through the
//! reqwest middleware, judged from what the upstream saw: a weight-2
//! request takes 2 of a cross-replica cap of 3, and a weight-1 request goes
//! while a weight-3 one that does not fit waits.

use std::sync::Arc;
use std::time::Duration;

use redislimit::{FallbackLimiter, Limiter, RedisLimiter, RedisPool, RedisTimeouts, RequestPacing};
use redislimit_reqwest::PacingMiddleware;
use redislimit_tests::record::Request;
use redislimit_tests::{RedisServer, Upstream};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

use crate::{MS, bounded};

/// A replica's limiter: Redis in lease mode with a cap of 3 across
/// replicas, with its in-process fallback, as deployed.
type Replica = Arc<FallbackLimiter<RedisLimiter>>;

/// One replica over `server`, and a client pacing through it.
fn replica(server: &RedisServer, upstream: &Upstream) -> (Replica, ClientWithMiddleware) {
    let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
    let limiter = Arc::new(
        RedisLimiter::builder(pool, "weights")
            .pacing(
                redislimit::Pacing::builder()
                    .max_concurrent(3)
                    .build()
                    .unwrap(),
            )
            .cluster_concurrency(3)
            .lease_ttl(Duration::from_secs(2))
            .tuning(redislimit::Tuning::default().with_concurrency_retry(10 * MS))
            .build()
            .unwrap()
            .with_fallback(),
    );
    let http = reqwest::Client::builder()
        .resolve("w.test", upstream.addr())
        .build()
        .unwrap();
    let client = ClientBuilder::new(http)
        .with(PacingMiddleware::from_arc(
            Arc::clone(&limiter) as Arc<dyn Limiter>
        ))
        .build();
    (limiter, client)
}

/// Sends `path` (which names its weight as `w=`) with `weight` and reads
/// the response to its end.
fn send(
    client: &ClientWithMiddleware,
    upstream: &Upstream,
    path: &str,
    weight: u32,
) -> tokio::task::JoinHandle<()> {
    let (client, url) = (client.clone(), upstream.url("w.test", path));
    tokio::spawn(async move {
        let response = client
            .get(&url)
            .with_extension(RequestPacing::new().with_weight(weight))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
        response.bytes().await.unwrap();
    })
}

/// The weight a recorded request named in its path.
fn weight_of(request: &Request) -> usize {
    request
        .path
        .split(['?', '&'])
        .find_map(|kv| kv.strip_prefix("w="))
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no weight in {}", request.path))
}

/// The most weight in flight at once, as the upstream saw it.
fn max_weight_in_flight(requests: &[Request]) -> usize {
    requests
        .iter()
        .map(|r| {
            requests
                .iter()
                .filter(|o| o.send <= r.send && o.end > r.send)
                .map(weight_of)
                .sum::<usize>()
        })
        .max()
        .unwrap_or(0)
}

/// Waits until `n` requests have arrived at the upstream (the record
/// keeps each once its response has ended).
async fn arrived(upstream: &Upstream, n: usize) {
    bounded(10, async {
        while upstream.arrivals() < n {
            tokio::time::sleep(MS).await;
        }
    })
    .await;
}

fn find<'a>(requests: &'a [Request], name: &str) -> &'a Request {
    requests
        .iter()
        .find(|r| r.path.contains(name))
        .unwrap_or_else(|| panic!("{name} never arrived: {requests:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_of_two_takes_two_of_a_cap_of_three_across_two_replicas() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let (_a, a) = replica(&server, &upstream);
    let (_b, b) = replica(&server, &upstream);
    let heavy = send(&a, &upstream, "/slow?chunks=8&every=100&w=2&name=heavy", 2);
    arrived(&upstream, 1).await;
    // Three light ones from the other replica: one fits beside the heavy
    // one; the others follow one at a time while it is in flight.
    let lights: Vec<_> = (0..3)
        .map(|i| {
            let path = format!("/slow?chunks=3&every=100&w=1&name=light{i}");
            send(&b, &upstream, &path, 1)
        })
        .collect();
    for task in std::iter::once(heavy).chain(lights) {
        bounded(20, task).await.unwrap();
    }
    let seen = upstream.recorder().host("w.test");
    assert_eq!(seen.len(), 4);
    assert_eq!(max_weight_in_flight(&seen), 3, "{seen:?}");
    let heavy = find(&seen, "name=heavy");
    let beside: Vec<_> = seen
        .iter()
        .filter(|r| r.path.contains("light") && r.send < heavy.end && r.end > heavy.send)
        .collect();
    assert!(!beside.is_empty(), "the cap left room for one: {seen:?}");
    assert!(
        beside.iter().all(|r| beside
            .iter()
            .all(|o| o.send >= r.end || o.end <= r.send || o.path == r.path)),
        "two light ones beside the heavy one: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_request_goes_while_a_heavy_one_that_does_not_fit_waits() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let (_a, a) = replica(&server, &upstream);
    let (b_limiter, b) = replica(&server, &upstream);
    // Replica A holds one of the three slots.
    let first = send(&a, &upstream, "/slow?chunks=8&every=100&w=1&name=first", 1);
    arrived(&upstream, 1).await;
    // Replica B queues a weight-3 request (1 + 3 > 3), then a light one.
    let heavy = send(&b, &upstream, "/slow?chunks=1&every=10&w=3&name=heavy", 3);
    bounded(10, async {
        // Asking Redis, which refuses it for want of room.
        while b_limiter.snapshot(0).queued < 1 {
            tokio::time::sleep(MS).await;
        }
    })
    .await;
    let light = send(&b, &upstream, "/slow?chunks=2&every=100&w=1&name=light", 1);
    for task in [first, heavy, light] {
        bounded(20, task).await.unwrap();
    }
    let seen = upstream.recorder().host("w.test");
    let (first, heavy, light) = (
        find(&seen, "name=first"),
        find(&seen, "name=heavy"),
        find(&seen, "name=light"),
    );
    assert!(
        light.send < first.end,
        "the light one went beside the first, while the heavy one waited: {seen:?}"
    );
    assert!(
        heavy.send >= first.end && heavy.send >= light.end,
        "the heavy one went once the whole cap was free: {seen:?}"
    );
    assert!(max_weight_in_flight(&seen) <= 3, "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_above_the_cross_replica_cap_is_refused_and_sends_nothing() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let (_limiter, client) = replica(&server, &upstream);
    let refused = client
        .get(upstream.url("w.test", "/?w=4"))
        .with_extension(RequestPacing::new().with_weight(4))
        .send()
        .await
        .unwrap_err();
    let err = redislimit_reqwest::pacing_error(&refused)
        .unwrap_or_else(|| panic!("not a pacing error: {refused:?}"));
    assert!(
        matches!(
            err,
            redislimit::Error::InvalidWeight {
                weight: 4,
                limit: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(upstream.recorder().host("w.test").is_empty());
}

/// Redis killed: the in-process fallback counts the weights itself (a
/// weight of 2 takes 2 of the cap of 3 there too), judged at the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_dead_the_fallback_counts_the_weights() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let (limiter, client) = replica(&server, &upstream);
    send(&client, &upstream, "/?w=1&name=warm", 1)
        .await
        .unwrap();
    server.kill();
    let heavy = send(
        &client,
        &upstream,
        "/slow?chunks=6&every=100&w=2&name=heavy",
        2,
    );
    arrived(&upstream, 2).await;
    assert!(limiter.is_degraded(), "paced in process");
    let lights: Vec<_> = (0..2)
        .map(|i| {
            let path = format!("/slow?chunks=2&every=100&w=1&name=light{i}");
            send(&client, &upstream, &path, 1)
        })
        .collect();
    for task in std::iter::once(heavy).chain(lights) {
        bounded(20, task).await.unwrap();
    }
    let seen = upstream.recorder().host("w.test");
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(max_weight_in_flight(&seen), 3, "{seen:?}");
}

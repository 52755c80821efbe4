//! `RequestPacing` priorities through the reqwest middleware and the tower
//! layer: with the host busy, a high-priority request queued after ten
//! low ones is the next the upstream sees, and equal ones keep their
//! order; in-process and through Redis.

use std::sync::Arc;
use std::time::Duration;

use redislimit::{Limiter, RedisLimiter, RedisPool, RedisTimeouts, RequestPacing};
use redislimit_reqwest::PacingMiddleware;
use redislimit_tests::{RedisServer, Upstream};
use reqwest_middleware::ClientBuilder;

use crate::{MS, bounded, domain_limiter};

/// A request to `t.test` at a path and priority, sent through the client
/// under test and read to its end.
type Sender = Arc<dyn Fn(String, u8) -> tokio::task::JoinHandle<()> + Send + Sync>;

/// The paths `upstream` saw for `t.test`, in order, after a slow first
/// request, ten low-priority ones and one high-priority one were sent with
/// `send`, each queued in `limiter` before the next left.
async fn order_of(upstream: &Upstream, limiter: &dyn Limiter, send: Sender) -> Vec<String> {
    let mut tasks = vec![send("/slow?chunks=10&every=100".into(), 128)];
    queued(limiter, 0).await;
    for i in 0..10 {
        tasks.push(send(format!("/?low={i}"), 10));
        queued(limiter, i + 1).await;
    }
    tasks.push(send("/?high".into(), 250));
    for task in tasks {
        bounded(20, task).await.unwrap();
    }
    upstream
        .recorder()
        .host("t.test")
        .into_iter()
        .map(|r| r.path)
        .collect()
}

/// [`order_of`] through the reqwest middleware over `limiter`.
async fn order_through(limiter: Arc<dyn Limiter>) -> Vec<String> {
    let upstream = Upstream::start().await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .resolve("t.test", upstream.addr())
        .build()
        .unwrap();
    let client = ClientBuilder::new(http)
        .with(PacingMiddleware::from_arc(Arc::clone(&limiter)))
        .build();
    let base = upstream.url("t.test", "");
    let send: Sender = Arc::new(move |path, priority| {
        let (client, url) = (client.clone(), format!("{base}{path}"));
        tokio::spawn(async move {
            let response = client
                .get(&url)
                .with_extension(RequestPacing::new().with_priority(priority))
                .send()
                .await
                .unwrap();
            response.bytes().await.unwrap();
        })
    });
    order_of(&upstream, &*limiter, send).await
}

/// Waits until `n` acquires wait in `limiter` (each one queued before the
/// next is sent, so arrival order is certain) and, for `n = 0`, until the
/// first request holds the host.
async fn queued(limiter: &dyn Limiter, n: usize) {
    bounded(10, async {
        loop {
            let now = limiter.snapshot(0);
            if now.queued == n && now.in_flight == 1 {
                return;
            }
            tokio::time::sleep(MS).await;
        }
    })
    .await;
}

fn expected() -> Vec<String> {
    let mut order = vec!["/slow?chunks=10&every=100".to_owned(), "/?high".to_owned()];
    order.extend((0..10).map(|i| format!("/?low={i}")));
    order
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_request_overtakes_ten_low_ones_in_process() {
    let limiter = Arc::new(domain_limiter(|p| p.min_delay(5 * MS)));
    assert_eq!(order_through(limiter).await, expected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_request_overtakes_ten_low_ones_through_redis() {
    let server = RedisServer::start();
    let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
    let limiter = RedisLimiter::builder(pool, "priorities")
        .pacing(
            redislimit::Pacing::builder()
                .min_delay(5 * MS)
                .build()
                .unwrap(),
        )
        .lease_ttl(Duration::from_secs(2))
        .build()
        .unwrap()
        .with_fallback();
    assert_eq!(order_through(Arc::new(limiter)).await, expected());
}

/// The same through the tower layer in front of the hyper-util client: the
/// priority is read from the `http::Request` extensions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_request_overtakes_ten_low_ones_through_tower() {
    use http_body_util::{BodyExt, Empty};
    use tower::{Service, ServiceBuilder, ServiceExt};

    let upstream = Upstream::start().await;
    let limiter: Arc<dyn Limiter> = Arc::new(domain_limiter(|p| p.min_delay(5 * MS)));
    let layer = redislimit_tower::PaceLayer::from_arc(Arc::clone(&limiter));
    let client = ServiceBuilder::new()
        .layer(layer)
        .service(crate::tower_client::hyper_client(&upstream));
    let base = upstream.url("t.test", "");
    let send: Sender = Arc::new(move |path, priority| {
        let (mut client, url) = (client.clone(), format!("{base}{path}"));
        tokio::spawn(async move {
            let mut request = http::Request::get(url)
                .body(Empty::<bytes::Bytes>::new())
                .unwrap();
            request
                .extensions_mut()
                .insert(RequestPacing::new().with_priority(priority));
            let response = client.ready().await.unwrap().call(request).await.unwrap();
            response.into_body().collect().await.unwrap();
        })
    });
    let order = order_of(&upstream, &*limiter, send).await;
    assert_eq!(order, expected());
}

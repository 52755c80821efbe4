//! An admission that reaches its replica later than the room it asked
//! for is handed back, not sent late: judged from when the upstream saw
//! the requests. (The room itself, kept after a late replica's slots, is
//! judged at the upstream by the crawl tests: a slow Redis, a crowd.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redislimit::hooks::NoHooks;
use redislimit::{Hooks, Limiter, RedisLimiter, Tuning};
use redislimit_reqwest::PacingMiddleware;
use redislimit_tests::record::Request;
use redislimit_tests::{RedisServer, StallProxy, Upstream};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

use crate::modes::SLACK;
use crate::{MS, bounded, host, limiter, standalone};

const SPACING: Duration = Duration::from_millis(60);

/// What `Hooks::on_late_admission` was told: (late, handed back).
#[derive(Debug, Default)]
struct Late(Mutex<Vec<(Duration, bool)>>);

impl Hooks for Late {
    fn on_late_admission(&self, _key: &str, late: Duration, handed_back: bool) {
        self.0.lock().unwrap().push((late, handed_back));
    }
}

/// Replicas `a` and `b` each agree on the configuration, load the scripts
/// and see how quick their path to Redis is, and their releases land,
/// before anything is held.
async fn warm_up(a: &RedisLimiter, b: &RedisLimiter) {
    for (l, name) in [(a, "a"), (b, "b")] {
        for i in 0..3 {
            let warm = host(&format!("{name}{i}.warm.test"));
            drop(bounded(10, l.acquire_host("t", warm, None)).await.unwrap());
        }
    }
    tokio::time::sleep(50 * MS).await;
}

/// A client through `limiter` whose requests say they come from `replica`.
fn client(limiter: RedisLimiter, replica: usize, upstream: &Upstream) -> ClientWithMiddleware {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-replica", replica.into());
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .resolve("a.test", upstream.addr())
        .build()
        .unwrap();
    ClientBuilder::new(http)
        .with(PacingMiddleware::new(limiter))
        .build()
}

/// Replica A reaches Redis through a proxy that holds Redis's replies for
/// 40 ms while A's request to `a.test` is admitted; replica B asks 20 ms
/// after A, directly, and is told to wait out A's gap. What the upstream
/// saw of the two (and of A's retry, if it was handed back).
async fn late_admission(a_lateness: Duration, a_hooks: Arc<dyn Hooks>) -> Vec<Request> {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let proxy = StallProxy::start(server.addr()).await;
    let replica = |url: &str, lateness, hooks| {
        limiter(
            standalone(url),
            |p| p.min_delay(SPACING),
            |b| {
                b.cluster_concurrency(4)
                    .tuning(redislimit::Tuning::default().with_max_lateness(lateness))
                    .hooks(hooks)
            },
        )
    };
    let a = replica(&proxy.url(), a_lateness, a_hooks);
    // B is the one on time: never handed back, should its own answer come
    // late on a loaded machine (it would then go behind A).
    let b = replica(&server.url(), Duration::MAX, Arc::new(NoHooks));
    warm_up(&a, &b).await;
    let url = upstream.url("a.test", "/");
    let (ca, cb) = (client(a, 0, &upstream), client(b, 1, &upstream));
    let get = |c: ClientWithMiddleware, url: String| {
        tokio::spawn(async move {
            let response = bounded(20, c.get(&url).send()).await.unwrap();
            assert!(response.status().is_success());
            response.bytes().await.unwrap();
        })
    };
    proxy.stall_replies();
    let sent_a = get(ca, url.clone());
    tokio::time::sleep(20 * MS).await;
    let sent_b = get(cb, url);
    tokio::time::sleep(20 * MS).await;
    proxy.resume();
    sent_a.await.unwrap();
    sent_b.await.unwrap();
    upstream.recorder().host("a.test")
}

fn closest(seen: &[Request]) -> Duration {
    seen.windows(2)
        .map(|w| w[1].send - w[0].send)
        .min()
        .unwrap_or(Duration::MAX)
}

/// Without the guard, the scenario really sends A late: 20 ms before B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_sent_however_late_comes_too_close_to_the_next() {
    let seen = late_admission(Duration::MAX, Arc::new(NoHooks)).await;
    assert_eq!(seen.len(), 2, "{seen:?}");
    let gap = closest(&seen);
    assert!(gap + SLACK < SPACING, "sends {gap:?} apart: A was not late");
}

/// With it (the default), A's late admission (40 ms, with no room kept for
/// lateness: its process was on time until then) is handed back and A asks
/// again behind B, with room for twice that lateness: the upstream sees
/// every gap kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_that_arrives_late_is_handed_back_and_asked_again() {
    let hooks = Arc::new(Late::default());
    let seen = late_admission(Tuning::DEFAULT_MAX_LATENESS, hooks.clone()).await;
    assert_eq!(seen.len(), 2, "{seen:?}");
    let gap = closest(&seen);
    assert!(gap + SLACK >= SPACING, "sends {gap:?} apart");
    // B, on time, went first; A asked again behind it.
    assert_eq!(
        seen.iter().map(|r| r.replica).collect::<Vec<_>>(),
        [1, 0],
        "{seen:?}"
    );
    // And A's hooks heard of it, some 40 ms late. (They may hear of others:
    // the warm-up's first call loads the script, and under the whole
    // suite's load an admission after the stall may be late too; what the
    // upstream saw is what this test is about.)
    let told = hooks.0.lock().unwrap().clone();
    assert!(
        told.iter().any(|&(late, back)| back && late > 20 * MS),
        "{told:?}"
    );
}

/// A late admission whose hand-back is lost with its connection: the
/// acquire fails (nothing is sent), and the hand-back is retried off its
/// path until it lands, so the host's only slot is free for the next
/// replica at once rather than after A's lease of a minute. With one
/// attempt only, the slot stays booked and B's five seconds run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_back_lost_with_its_connection_is_sent_again() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let proxy = StallProxy::start(server.addr()).await;
    let replica = |url: &str, lateness| {
        limiter(
            standalone(url),
            |p| p.min_delay(SPACING),
            |b| {
                b.cluster_concurrency(1)
                    .lease_ttl(Duration::from_secs(60))
                    .tuning(redislimit::Tuning::default().with_max_lateness(lateness))
            },
        )
    };
    let (a, b) = (
        replica(&proxy.url(), Tuning::DEFAULT_MAX_LATENESS),
        replica(&server.url(), Duration::MAX),
    );
    warm_up(&a, &b).await;
    let url = upstream.url("a.test", "/");
    let (ca, cb) = (client(a, 0, &upstream), client(b, 1, &upstream));
    // A is admitted and its answer held; then the answer goes through and
    // the hand-back it sets off is held, and lost with the connection.
    proxy.stall_replies();
    let sent_a = tokio::spawn({
        let url = url.clone();
        async move { bounded(20, ca.get(&url).send()).await }
    });
    tokio::time::sleep(40 * MS).await;
    proxy.stall_requests();
    tokio::time::sleep(40 * MS).await;
    proxy.cut();
    proxy.resume();
    let failed = sent_a.await.unwrap();
    assert!(failed.is_err(), "A sent late: {failed:?}");
    // B may wait a moment, never the minute A's lease would hold the host
    // for had its hand-back been given up.
    let response = bounded(20, cb.get(&url).timeout(Duration::from_secs(5)).send())
        .await
        .unwrap();
    assert!(response.status().is_success(), "{response:?}");
    let seen = upstream.recorder().host("a.test");
    assert_eq!(
        seen.iter().map(|r| r.replica).collect::<Vec<_>>(),
        [1],
        "{seen:?}"
    );
}

//! `SharedCache`: a value fetched by one replica for the fleet, the others
//! waiting for it; fetched again when no longer fresh; fetched alone (and
//! said so) when Redis cannot be asked or a fetcher dies; garbage in its
//! key replaced.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redislimit::redis::{Cached, Fresh, SharedCache};
use redislimit_tests::RedisServer;
use redislimit_tests::resp::Reply;

use crate::{MS, bounded, limiter, standalone};

const DAY: Duration = Duration::from_secs(24 * 3600);

/// A fetch that takes `took`, counts itself in `count` and gives `value`.
async fn fetch(count: Arc<AtomicUsize>, took: Duration, value: &str) -> Fresh {
    count.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(took).await;
    Fresh {
        value: value.as_bytes().to_vec(),
        keep: DAY,
    }
}

/// `name`'s value from `cache`, any value taken as fresh, else `value`
/// fetched at once (counted in `fetches`).
async fn get(
    cache: &SharedCache,
    name: &str,
    wait: Duration,
    fetches: &Arc<AtomicUsize>,
    value: &str,
) -> Cached {
    let fetches = Arc::clone(fetches);
    cache
        .get_or_fetch(name, wait, |_| true, |_| fetch(fetches, MS, value))
        .await
}

fn cache(server: &RedisServer) -> SharedCache {
    limiter(standalone(&server.url()), |p| p, |b| b).shared_cache("robots")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_fetches_and_the_others_wait_for_it() {
    let server = RedisServer::start();
    let fetches = Arc::new(AtomicUsize::new(0));
    // Three replicas (limiters of one scope) ask at once.
    let asks = (0..3).map(|_| {
        let (cache, fetches) = (cache(&server), Arc::clone(&fetches));
        tokio::spawn(async move {
            cache
                .get_or_fetch(
                    "http://a.test:80",
                    5000 * MS,
                    |_| true,
                    |_| fetch(fetches, 300 * MS, "rules"),
                )
                .await
        })
    });
    let mut got = Vec::new();
    for ask in asks.collect::<Vec<_>>() {
        got.push(bounded(10, ask).await.unwrap());
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "{got:?}");
    assert!(got.iter().all(|c| c.value() == b"rules"), "{got:?}");
    let fetched = got
        .iter()
        .filter(|c| matches!(c, Cached::Fetched(_)))
        .count();
    let found = got.iter().filter(|c| matches!(c, Cached::Found(_))).count();
    assert_eq!((fetched, found), (1, 2), "{got:?}");
    // Kept in Redis for the day, and the claim gone.
    let (value, claim) = redislimit_tests::keys::shared("test", "robots", "http://a.test:80");
    assert_eq!(server.query(&["GET", &value]).as_str(), Some("rules"));
    let ttl = server.query(&["PTTL", &value]);
    assert!(
        matches!(ttl, Reply::Integer(ms) if ms > DAY.as_millis() as i64 - 60_000),
        "{ttl:?}"
    );
    assert_eq!(server.query(&["EXISTS", &claim]), Reply::Integer(0));
    // Another origin is another value.
    let other = get(
        &cache(&server),
        "https://a.test:443",
        DAY,
        &fetches,
        "other",
    )
    .await;
    assert!(matches!(other, Cached::Fetched(v) if v == b"other"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_no_longer_fresh_is_fetched_again_seeing_the_old_one() {
    let server = RedisServer::start();
    let cache = cache(&server);
    let fetches = Arc::new(AtomicUsize::new(0));
    let first = get(&cache, "n", DAY, &fetches, "old").await;
    assert!(matches!(first, Cached::Fetched(_)));
    let seen = Arc::new(std::sync::Mutex::new(None));
    let again = cache
        .get_or_fetch(
            "n",
            DAY,
            |v| v != b"old",
            |stale| {
                *seen.lock().unwrap() = stale;
                fetch(Arc::clone(&fetches), MS, "new")
            },
        )
        .await;
    assert!(matches!(again, Cached::Fetched(v) if v == b"new"));
    assert_eq!(seen.lock().unwrap().as_deref(), Some(&b"old"[..]));
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_fetcher_holds_the_others_up_no_longer_than_the_wait() {
    let server = RedisServer::start();
    let fetches = Arc::new(AtomicUsize::new(0));
    let wait = 600 * MS;
    // A replica claims the fetch and dies in it (its future dropped).
    let dying = cache(&server);
    let claimed = tokio::time::timeout(
        200 * MS,
        dying.get_or_fetch(
            "n",
            wait,
            |_| true,
            |_| fetch(Arc::clone(&fetches), DAY, "never"),
        ),
    )
    .await;
    assert!(claimed.is_err(), "still fetching");
    let (_, claim) = redislimit_tests::keys::shared("test", "robots", "n");
    assert_eq!(
        server.query(&["EXISTS", &claim]),
        Reply::Integer(1),
        "the claim is left"
    );
    // Another waits for the claim to lapse, then fetches.
    let got = bounded(5, get(&cache(&server), "n", wait, &fetches, "value")).await;
    assert!(matches!(got, Cached::Fetched(v) if v == b"value"));
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_the_key_is_replaced_and_a_dead_redis_fetches_alone() {
    let server = RedisServer::start();
    let (value, _) = redislimit_tests::keys::shared("test", "robots", "n");
    server.command(&["HSET", &value, "not", "a string"]);
    let cache = cache(&server);
    let fetches = Arc::new(AtomicUsize::new(0));
    let got = get(&cache, "n", DAY, &fetches, "value").await;
    assert!(matches!(got, Cached::Fetched(v) if v == b"value"));
    assert_eq!(server.query(&["GET", &value]).as_str(), Some("value"));
    server.kill();
    let got = bounded(10, get(&cache, "m", DAY, &fetches, "alone")).await;
    match got {
        Cached::Alone(v, err) => {
            assert_eq!(v, b"alone");
            assert!(err.is_unavailable(), "{err:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
}

/// A replica that read the old value just before another fetched the new
/// one and ended its claim takes the claim that is free again, and finds
/// the new value there: it does not fetch a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_taken_just_after_another_replica_kept_the_value_finds_it() {
    let server = RedisServer::start();
    let fetches = Arc::new(AtomicUsize::new(0));
    let old = get(&cache(&server), "n", DAY, &fetches, "old").await;
    assert!(matches!(old, Cached::Fetched(_)));
    // Between this replica's read of "old" and its claim, another replica
    // fetches "new", keeps it and ends its claim (run to its end, on a
    // thread of its own, from inside the read's `fresh`).
    let other_ran = std::sync::atomic::AtomicBool::new(false);
    let other = |value: &[u8]| {
        if value == b"old" && !other_ran.swap(true, Ordering::SeqCst) {
            let fetches = Arc::clone(&fetches);
            std::thread::scope(|s| {
                s.spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    let got = runtime.block_on(cache(&server).get_or_fetch(
                        "n",
                        DAY,
                        |v| v != b"old",
                        |_| fetch(fetches, MS, "new"),
                    ));
                    assert!(matches!(got, Cached::Fetched(v) if v == b"new"));
                });
            });
        }
        value != b"old"
    };
    let got = bounded(
        10,
        cache(&server).get_or_fetch("n", DAY, other, |_| {
            fetch(Arc::clone(&fetches), MS, "again")
        }),
    )
    .await;
    assert!(other_ran.load(Ordering::SeqCst));
    assert!(matches!(&got, Cached::Found(v) if v == b"new"), "{got:?}");
    assert_eq!(fetches.load(Ordering::SeqCst), 2, "old, new and no more");
    let (value, claim) = redislimit_tests::keys::shared("test", "robots", "n");
    assert_eq!(server.query(&["GET", &value]).as_str(), Some("new"));
    assert_eq!(server.query(&["EXISTS", &claim]), Reply::Integer(0));
}

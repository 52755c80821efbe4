//! What a waiting acquire holds in memory. A crawl keeps one acquire
//! waiting for each host in play, and each is a boxed future: a future
//! that carries every rare path's state inline (connecting, loading the
//! function library) cost 45 KB an acquire through Redis, allocated and
//! copied for every request. No server is needed: the futures are made,
//! never run.
#![cfg(feature = "redis")]

use redislimit::{
    DomainLimiter, FallbackLimiter, HostKey, Limiter, Pacing, RedisLimiter, RedisPool,
    RedisTimeouts,
};

/// The most an acquire's future may take, in bytes (about 4 KB through
/// Redis in a release build).
const MOST: usize = 12 * 1024;

fn host() -> HostKey {
    HostKey::parse("http://a.test/").unwrap()
}

fn redis() -> RedisLimiter {
    let pool = RedisPool::standalone("redis://127.0.0.1:1/", RedisTimeouts::default()).unwrap();
    RedisLimiter::builder(pool, "footprint")
        .pacing(Pacing::builder().build().unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn an_acquire_through_redis_is_a_small_future() {
    let limiter = redis();
    let size = std::mem::size_of_val(&*limiter.acquire_host("t", host(), None));
    assert!(size <= MOST, "a Redis acquire's future takes {size} bytes");

    let fallback = FallbackLimiter::new(limiter, DomainLimiter::new(Pacing::default()));
    let acquire = fallback.acquire_host("t", host(), None);
    let size = std::mem::size_of_val(&*acquire);
    assert!(
        size <= MOST,
        "a fallback acquire's future takes {size} bytes"
    );
}

//! A Redis set up wrong for the limiter is not an outage: a refused
//! password, a missing database, a server that does not speak RESP, TLS to
//! a plain port and a command the user may not run each fail with
//! `Error::Misconfigured` naming the cause, from `ping()` and from every
//! acquire, in bounded time; a fallback limiter does not take over, and
//! the upstream never sees a request.

use std::time::{Duration, Instant};

use redislimit::{Error, Limiter, Misconfiguration, RedisPool, RedisTimeouts, RedisTls};
use redislimit_reqwest::PacingMiddleware;
use redislimit_tests::{RedisServer, TestCa, Upstream};
use reqwest_middleware::ClientBuilder;

use crate::{MS, bounded, host, limiter};

/// `pool` must fail `ping()` and two acquires (the second could be
/// skipped by an open circuit, were it taken for an outage) with `cause`,
/// also through a fallback limiter and through the middleware, whose
/// request must never reach `upstream`.
async fn misconfigured(pool: RedisPool, cause: Misconfiguration, upstream: &Upstream) {
    let started = Instant::now();
    let check = |err: Error, what: &str| match err {
        Error::Misconfigured { cause: found, .. } if found == cause => {}
        other => panic!("{what}: expected a {cause:?} misconfiguration, got {other:?}"),
    };
    let limiter = limiter(pool, |p| p.min_delay(10 * MS), |b| b);
    check(bounded(20, limiter.ping()).await.unwrap_err(), "ping");
    for _ in 0..2 {
        let err = bounded(20, limiter.acquire_host("t", host("a.test"), None))
            .await
            .map(drop)
            .unwrap_err();
        check(err, "acquire");
    }
    let fallback = std::sync::Arc::new(limiter.with_fallback());
    for _ in 0..2 {
        let err = bounded(20, fallback.acquire_host("t", host("a.test"), None))
            .await
            .map(drop)
            .unwrap_err();
        check(err, "acquire through the fallback");
    }
    let http = reqwest::Client::builder()
        .resolve("a.test", upstream.addr())
        .build()
        .unwrap();
    let client = ClientBuilder::new(http)
        .with(PacingMiddleware::new(fallback))
        .build();
    let url = upstream.url("a.test", "/");
    let err = bounded(20, client.get(&url).send()).await.unwrap_err();
    let Some(err) = std::error::Error::source(&err).and_then(|e| e.downcast_ref::<Error>()) else {
        panic!("the middleware failed with something else than the limiter's error: {err:?}");
    };
    assert!(
        matches!(err, Error::Misconfigured { cause: c, .. } if *c == cause),
        "{err:?}"
    );
    assert!(
        upstream.recorder().host("a.test").is_empty(),
        "a request was sent past a misconfigured Redis"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the failures took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_password_is_a_misconfiguration() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    server.query(&["CONFIG", "SET", "requirepass", "secret"]);
    let t = RedisTimeouts::default();
    // None given where one is needed: NOAUTH on the first command.
    let none = RedisPool::standalone(&server.url(), t).unwrap();
    misconfigured(none, Misconfiguration::Authentication, &upstream).await;
    // A wrong one: refused while connecting.
    let wrong = format!("redis://:wrong@127.0.0.1:{}/", server.port());
    let wrong = RedisPool::standalone(&wrong, t).unwrap();
    misconfigured(wrong, Misconfiguration::Authentication, &upstream).await;
    // The right one paces.
    let right = format!("redis://:secret@127.0.0.1:{}/", server.port());
    let right = limiter(
        RedisPool::standalone(&right, t).unwrap(),
        |p| p.min_delay(10 * MS),
        |b| b,
    );
    right.ping().await.expect("the right password is accepted");
    drop(bounded(20, right.acquire_host("t", host("a.test"), None)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_database_is_a_misconfiguration() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let url = format!("redis://127.0.0.1:{}/99", server.port());
    let pool = RedisPool::standalone(&url, RedisTimeouts::default()).unwrap();
    misconfigured(pool, Misconfiguration::Database, &upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_is_not_redis() {
    let upstream = Upstream::start().await;
    let url = format!("redis://127.0.0.1:{}/", upstream.addr().port());
    let pool = RedisPool::standalone(&url, RedisTimeouts::default()).unwrap();
    misconfigured(pool, Misconfiguration::NotRedis, &upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_a_plain_port_is_a_misconfiguration() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let tls = RedisTls::ca_pem(TestCa::new().ca_pem()).unwrap();
    let url = format!("rediss://127.0.0.1:{}/", server.port());
    let pool = RedisPool::standalone_tls(&url, &tls, RedisTimeouts::default()).unwrap();
    misconfigured(pool, Misconfiguration::Tls, &upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_script_rights_is_a_misconfiguration() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    server.query(&["ACL", "SETUSER", "pinger", "on", ">pw", "~*", "+ping"]);
    let url = format!("redis://pinger:pw@127.0.0.1:{}/", server.port());
    let pool = RedisPool::standalone(&url, RedisTimeouts::default()).unwrap();
    let limiter = limiter(pool, |p| p.min_delay(10 * MS), |b| b);
    limiter.ping().await.expect("PING is allowed");
    let err = bounded(20, limiter.acquire_host("t", host("a.test"), None))
        .await
        .map(drop)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Misconfigured {
                cause: Misconfiguration::Permission,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(upstream.recorder().host("a.test").is_empty());
}

//! Redis over TLS: a `rediss://` limiter trusting a throw-away CA paces
//! real requests, seen at the upstream; a plain client on the TLS port
//! (unavailable: the server closes on it, as a dying one would) and a
//! client that does not trust the CA (misconfigured) fail with a typed
//! error, in bounded time. A Cluster of nodes that speak TLS only (their
//! bus too) paces replicas through `RedisPool::cluster_tls`.

use std::error::Error as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redislimit::{
    ConfigError, Error, Limiter, Misconfiguration, RedisLimiter, RedisPool, RedisTimeouts, RedisTls,
};
use redislimit_reqwest::PacingMiddleware;
use redislimit_tests::record::assert_serialized;
use redislimit_tests::resp::{self, Reply};
use redislimit_tests::{RedisCluster, RedisServer, TestCa, Upstream};
use reqwest_middleware::ClientBuilder;

use crate::{MS, bounded, drive_all, host, limiter};

fn trusting(server: &RedisServer) -> RedisTls {
    RedisTls::ca_pem(server.tls().expect("a TLS server").ca_pem()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_limiters_pace_requests_seen_at_the_upstream() {
    let server = RedisServer::start_tls();
    assert!(server.url().starts_with("rediss://"), "{}", server.url());
    let tls = trusting(&server);
    let upstream = Upstream::start().await;
    let gap = 40 * MS;
    let url = upstream.url("a.test", "/slow?chunks=2&every=10");

    // Two replicas, each with a TLS pool of its own, in serialized mode.
    let mut tasks = Vec::new();
    for replica in 0..2 {
        let pool = RedisPool::standalone_tls(&server.url(), &tls, RedisTimeouts::default())
            .expect("a TLS pool");
        let limiter = limiter(
            pool,
            |p| p.max_concurrent(2).min_delay(gap),
            |b| b.lease_ttl(Duration::from_secs(5)),
        );
        let mut headers = http::HeaderMap::new();
        headers.insert("x-replica", replica.to_string().parse().unwrap());
        let http = reqwest::Client::builder()
            .resolve("a.test", upstream.addr())
            .default_headers(headers)
            .build()
            .unwrap();
        let client = ClientBuilder::new(http)
            .with(PacingMiddleware::new(limiter))
            .build();
        for _ in 0..2 {
            let (client, url) = (client.clone(), url.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..3 {
                    let response = client.get(&url).send().await.unwrap();
                    assert!(response.status().is_success());
                    response.bytes().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        bounded(60, task).await.unwrap();
    }

    let seen = upstream.recorder().host("a.test");
    assert_eq!(seen.len(), 12);
    assert_serialized(&seen, gap);
    let senders: std::collections::BTreeSet<_> = seen.iter().map(|r| r.replica).collect();
    assert_eq!(senders.len(), 2, "both replicas should have sent: {seen:?}");
    // The pacing state lives in the TLS server (read over TLS too).
    match server.query(&["DBSIZE"]) {
        Reply::Integer(keys) => assert!(keys > 0, "no keys in the TLS server"),
        other => panic!("DBSIZE answered {other:?}"),
    }
}

/// Acquires once through `pool`; must fail as `Unavailable` (or, with
/// `misconfigured`, as a TLS misconfiguration) well within the pool's
/// timeouts, and returns the error's whole source chain as text.
async fn refused(pool: RedisPool, misconfigured: bool) -> String {
    let limiter: RedisLimiter = limiter(pool, |p| p.min_delay(10 * MS), |b| b);
    let started = Instant::now();
    let result = bounded(10, limiter.acquire_host("test", host("a.test"), None)).await;
    let err = match result {
        Ok(_) => panic!("an acquire was admitted without a working TLS connection"),
        Err(err) => err,
    };
    if misconfigured {
        assert!(
            matches!(
                err,
                Error::Misconfigured {
                    cause: Misconfiguration::Tls,
                    ..
                }
            ),
            "{err:?}"
        );
    } else {
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the failure took {:?}",
        started.elapsed()
    );
    let mut chain = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        chain.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    chain
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_on_the_tls_port_is_unavailable() {
    let server = RedisServer::start_tls();
    // The harness's own plain client cannot talk to it either.
    assert!(resp::command(server.addr(), &["PING"], Duration::from_secs(2)).is_err());
    let plain = format!("redis://127.0.0.1:{}/", server.port());
    let pool = RedisPool::standalone(&plain, RedisTimeouts::default()).unwrap();
    refused(pool, false).await;
    assert!(server.is_running(), "the server died:\n{}", server.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_trust_the_ca_is_misconfigured() {
    let server = RedisServer::start_tls();
    // Another throw-away CA: the server's certificate is not one of its.
    let stranger = RedisTls::ca_pem(TestCa::new().ca_pem()).unwrap();
    let pool =
        RedisPool::standalone_tls(&server.url(), &stranger, RedisTimeouts::default()).unwrap();
    let chain = refused(pool, true).await;
    assert!(chain.to_lowercase().contains("certificate"), "{chain}");
    // The system's certificates do not hold the throw-away CA either.
    let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
    let chain = refused(pool, true).await;
    assert!(chain.to_lowercase().contains("certificate"), "{chain}");
    // The same server answers a client that trusts its CA.
    let pool =
        RedisPool::standalone_tls(&server.url(), &trusting(&server), RedisTimeouts::default())
            .unwrap();
    let trusted: RedisLimiter = limiter(pool, |p| p.min_delay(10 * MS), |b| b);
    let permit = bounded(10, trusted.acquire_host("test", host("a.test"), None))
        .await
        .expect("a client trusting the CA is admitted");
    drop(permit);
}

#[test]
fn tls_pools_need_rediss_urls_and_a_valid_ca() {
    let tls = RedisTls::ca_pem(TestCa::new().ca_pem()).unwrap();
    let err = RedisPool::standalone_tls("redis://127.0.0.1:6379/", &tls, RedisTimeouts::default())
        .unwrap_err();
    assert!(matches!(err, ConfigError::InvalidRedis { .. }), "{err}");
    let err = RedisPool::cluster_tls(
        &["rediss://127.0.0.1:7000/", "redis://127.0.0.1:7001/"],
        &tls,
        RedisTimeouts::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("rediss://"), "{err}");
    assert!(
        TestCa::new().ca_pem() != TestCa::new().ca_pem(),
        "CAs are made fresh"
    );
    let err = RedisTls::ca_pem("not a certificate").unwrap_err();
    assert!(matches!(err, ConfigError::InvalidRedis { .. }), "{err}");
}

/// A Redis Cluster whose nodes speak TLS only (to clients and on the cluster
/// bus), trusted through `RedisPool::cluster_tls`: three replicas pace hosts
/// whose keys live on different masters, every host's requests serialized
/// as the upstream would see them, the state in the nodes (read over TLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_keeps_each_hosts_gap_across_replicas() {
    let cluster = tokio::task::block_in_place(RedisCluster::start_tls);
    let urls = cluster.urls();
    assert!(
        urls.iter().all(|url| url.starts_with("rediss://")),
        "{urls:?}"
    );
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let tls = RedisTls::ca_pem(cluster.ca().expect("a TLS cluster").ca_pem()).unwrap();
    let gap = 5 * MS;
    let hosts = ["a.test", "b.test", "c.test", "d.test", "e.test", "f.test"];
    let replicas: Vec<Arc<dyn Limiter>> = (0..3)
        .map(|_| {
            let pool = RedisPool::cluster_tls(&seeds, &tls, RedisTimeouts::default()).unwrap();
            Arc::new(limiter(pool, |p| p.max_concurrent(2).min_delay(gap), |b| b))
                as Arc<dyn Limiter>
        })
        .collect();
    let rec = drive_all(&replicas, &hosts, 3, 6, 20 * MS).await;
    for name in hosts {
        let reqs = rec.host(name);
        assert_eq!(reqs.len(), 9, "{name}");
        assert_serialized(&reqs, gap);
    }
    let populated = cluster
        .nodes()
        .iter()
        .filter(|n| !matches!(n.query(&["DBSIZE"]), Reply::Integer(0)))
        .count();
    assert!(populated >= 2, "all hosts' keys landed on one master");
}

/// The same Cluster, with a client that does not trust its CA: a typed
/// error in bounded time, and nothing sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_refuses_a_client_that_does_not_trust_it() {
    let cluster = tokio::task::block_in_place(RedisCluster::start_tls);
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let stranger = RedisTls::ca_pem(TestCa::new().ca_pem()).unwrap();
    let pool = RedisPool::cluster_tls(&seeds, &stranger, RedisTimeouts::default()).unwrap();
    let l = limiter(pool, |p| p.min_delay(5 * MS), |b| b);
    let err = bounded(10, l.acquire_host("t", host("a.test"), None))
        .await
        .expect_err("a client that does not trust the cluster's CA is refused");
    // A Cluster client reports a failure to open its first connections as one
    // I/O error (see docs/DESIGN.md): an outage, not a misconfiguration.
    assert!(
        matches!(err, Error::Unavailable { .. } | Error::Misconfigured { .. }),
        "{err:?}"
    );
    for node in cluster.nodes() {
        assert_eq!(
            node.query(&["DBSIZE"]),
            Reply::Integer(0),
            "{}",
            node.addr()
        );
    }
}

//! A rollout across the two ways the scripts run: replicas calling the
//! function library (`FCALL`) and replicas running the scripts (`EVALSHA`,
//! as on a server without functions, or for a user not allowed them) pace
//! one host together, judged at the upstream.

use std::time::Duration;

use redislimit::{Pacing, RedisLimiter};
use redislimit_reqwest::PacingMiddleware;
use redislimit_tests::record::{max_in_flight, min_send_gap};
use redislimit_tests::{RedisServer, Upstream};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

use crate::cost::command_calls;
use crate::{MS, bounded, standalone};

const HOST: &str = "rollout.test";

/// A reqwest client through a limiter over `url`, each request marked
/// with `replica` for the upstream.
fn replica(url: &str, replica: usize, upstream: &Upstream, gap: Duration) -> ClientWithMiddleware {
    let limiter = RedisLimiter::builder(standalone(url), "rollout")
        .pacing(Pacing::builder().min_delay(gap).build().unwrap())
        .cluster_concurrency(2)
        .build()
        .unwrap();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-replica", replica.into());
    let client = reqwest::Client::builder()
        .resolve(HOST, upstream.addr())
        .default_headers(headers)
        .build()
        .unwrap();
    ClientBuilder::new(client)
        .with(PacingMiddleware::new(limiter))
        .build()
}

/// Two replicas on `FCALL` and two on `EVALSHA` (an ACL user allowed
/// neither `FUNCTION` nor `FCALL`), three tasks each, against one host in
/// lease mode (cap 2): the upstream sees every request, never more than
/// two in flight, and no two sends closer than `min_delay` (less the
/// arrival stamps' jitter), whichever path
/// admitted them. Redis counts both kinds of call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_fcall_and_on_evalsha_keep_one_pace() {
    let server = RedisServer::start();
    let scripts_url = server.url_for_user("scripts", "secret", &["-function", "-fcall"]);
    let upstream = Upstream::start().await;
    let gap = 60 * MS;
    let (tasks, each) = (3, 4);
    let mut all = Vec::new();
    for i in 0..4 {
        let url = if i % 2 == 0 {
            server.url()
        } else {
            scripts_url.clone()
        };
        let client = replica(&url, i, &upstream, gap);
        for _ in 0..tasks {
            let (client, url) = (
                client.clone(),
                upstream.url(HOST, "/slow?chunks=2&every=10"),
            );
            all.push(tokio::spawn(async move {
                for _ in 0..each {
                    let response = client.get(&url).send().await.unwrap();
                    assert!(response.status().is_success());
                    response.bytes().await.unwrap();
                }
            }));
        }
    }
    for task in all {
        bounded(60, task).await.unwrap();
    }

    let seen = upstream.recorder().host(HOST);
    assert_eq!(seen.len(), 4 * tasks * each, "{seen:?}");
    for i in 0..4 {
        assert_eq!(
            seen.iter().filter(|r| r.replica == i).count(),
            tasks * each,
            "replica {i}: {seen:?}"
        );
    }
    // Less a quarter for the arrival stamps' jitter on a busy machine: two
    // paces kept apart would interleave far closer.
    let closest = min_send_gap(&seen);
    assert!(
        closest >= gap * 3 / 4,
        "sends {closest:?} apart against a min_delay of {gap:?}: {seen:?}"
    );
    assert!(max_in_flight(&seen) <= 2, "{seen:?}");
    let calls = command_calls(&server);
    for kind in ["fcall", "evalsha"] {
        assert!(
            calls.get(kind).copied().unwrap_or(0) >= (2 * tasks * each) as u64,
            "too few {kind} calls for two replicas' acquires: {calls:?}"
        );
    }
}

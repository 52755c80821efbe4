//! The adaptive backoff: a host failing with bare 503s for 2 s sees its
//! gap widen on every replica, and its pace return after it recovers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redislimit_tests::{RedisServer, Upstream};

use crate::{finish, spawn_all, tempdir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_host_is_backed_off_on_every_replica_and_recovers() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let start = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    // Failing from the first request on, for about 2 s (the crawls take
    // a moment to start).
    let until = (start + Duration::from_millis(2500)).as_millis();
    let list = crate::urls(
        &upstream,
        &["a.test"],
        40,
        &format!("/outage?until={until}"),
    );
    let args = ["--redis", &server.url(), "--min-delay", "50ms"];
    let replicas = spawn_all(dir.path(), &upstream, &list, 2, &args);
    finish(replicas).await;

    let seen = upstream.recorder().host("a.test");
    assert_eq!(seen.len(), 40);
    let epoch_ms = |r: &redislimit_tests::record::Request| {
        // The upstream stamps Instants; the outage ends at a Unix time.
        let ago = r.send.elapsed();
        (SystemTime::now() - ago)
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    let during = seen.iter().filter(|r| epoch_ms(r) < until).count();
    assert!(
        during <= 6,
        "{during} requests reached the host while it failed (at 50 ms, all 40 would)"
    );
    // After it recovered, the pace came back to --min-delay: the last ten
    // requests are far closer together than the widest backoff gap.
    let tail: Vec<Duration> = seen[30..]
        .windows(2)
        .map(|w| w[1].send - w[0].send)
        .collect();
    assert!(
        tail.iter().all(|g| *g < Duration::from_millis(500)),
        "still backing off at the end: {tail:?}"
    );
}

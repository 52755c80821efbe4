//! `--max-bytes-per-sec`: the response bytes of a host, counted by every
//! crawl replica and shared through Redis; judged at the upstream.

use std::time::Duration;

use redislimit_tests::record::assert_serialized;
use redislimit_tests::{RedisServer, Upstream, body_size};

use crate::{MS, finish, spawn_all, tempdir, urls};

/// 100 KiB bodies at 200 KiB/s: two responses' worth a second for the
/// whole fleet, in any 10 s window, and each response's bytes paid for
/// (500 ms) before the next request leaves, whichever replica sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_keep_a_host_within_its_byte_rate() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    const BODY: u64 = 100 * 1024;
    const RATE: u64 = 200 * 1024;
    let list = urls(&upstream, &["a.test"], 24, &format!("/bytes?size={BODY}"));
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        "0ms",
        "--max-bytes-per-sec",
        "200KiB",
    ];
    let lines = finish(spawn_all(dir.path(), &upstream, &list, 3, &args)).await;
    assert_eq!(lines.len(), 24);
    assert!(lines.iter().all(|l| l["status"] == 200), "{lines:?}");
    let mut seen = upstream.recorder().host("a.test");
    seen.sort_by_key(|r| r.send);
    assert_eq!(seen.len(), 24);
    for replica in 0..3 {
        assert!(
            seen.iter().any(|r| r.replica == replica),
            "replica {replica} fetched some"
        );
    }
    let window = Duration::from_secs(10);
    for (i, first) in seen.iter().enumerate() {
        let bytes: u64 = seen[i..]
            .iter()
            .take_while(|r| r.send - first.send < window)
            .map(|r| body_size(&r.path))
            .sum();
        assert!(
            bytes <= RATE * window.as_secs(),
            "{bytes} bytes in the 10 s from request {i}"
        );
    }
    // Serialized: each response's 100 KiB held the host 500 ms after it.
    assert_serialized(&seen, (BODY * 1000 / RATE) as u32 * MS);
}

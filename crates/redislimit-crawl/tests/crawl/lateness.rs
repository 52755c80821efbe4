//! A slow Redis: every reply held 30-80 ms (a proxy between the replicas
//! and Redis) while four replicas crawl two hosts in lease mode. Each
//! admission reaches its replica that late, by a different amount each
//! time; sent as it came, one would leave up to 50 ms closer to the next
//! than the gap. The room each replica asks for its lateness (and the
//! hand-back of an admission later than its room) keeps every gap at the
//! upstream. A run with the guard off (`--max-lateness 1h`) shows what it
//! guards against.

use std::time::Duration;

use redislimit_tests::record::{max_in_flight, min_send_gap};
use redislimit_tests::{RedisServer, StallProxy, Upstream};

use crate::{HOSTS, SLACK, finish, spawn_all, tempdir, urls};

/// The crawl's `--min-delay`.
const GAP: Duration = Duration::from_millis(130);

/// How long every Redis reply is held, at least and at most, and for how long.
const LEAST: Duration = Duration::from_millis(30);
const MOST: Duration = Duration::from_millis(80);
const SLOW_FOR: Duration = Duration::from_secs(8);

/// Four replicas crawl two hosts through a Redis whose every reply is held
/// 30-80 ms for the first 8 s; what the upstream saw of each host: its
/// closest two sends, and the most in flight at once.
async fn crawl_through_a_slow_redis(extra: &[&str]) -> Vec<(Duration, usize)> {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let proxy = StallProxy::start(server.addr()).await;
    let hosts = &HOSTS[..2];
    let list = urls(&upstream, hosts, 24, "/slow?chunks=1&every=20");
    let url = proxy.url();
    let gap = format!("{}ms", GAP.as_millis());
    let mut args = vec![
        "--redis",
        &url,
        "--min-delay",
        &gap,
        "--cluster-concurrency",
        "2",
        "--max-concurrent",
        "2",
        "--lease-ttl",
        "5s",
    ];
    args.extend_from_slice(extra);
    proxy.delay_replies(LEAST, MOST);
    let dir = tempdir();
    let replicas = spawn_all(dir.path(), &upstream, &list, 4, &args);
    let heal = async {
        tokio::time::sleep(SLOW_FOR).await;
        proxy.resume();
    };
    let (lines, ()) = tokio::join!(finish(replicas), heal);
    for line in &lines {
        assert_eq!(line["status"], 200, "{line}");
    }
    hosts
        .iter()
        .map(|host| {
            let seen = upstream.recorder().host(host);
            assert_eq!(seen.len(), 24, "{host}");
            (min_send_gap(&seen), max_in_flight(&seen))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_keeps_every_gap() {
    let _turn = crate::one_at_a_time().await;
    for (i, (gap, in_flight)) in crawl_through_a_slow_redis(&[])
        .await
        .into_iter()
        .enumerate()
    {
        let host = HOSTS[i];
        assert!(
            in_flight <= 2,
            "{host}: {in_flight} in flight, the cap is 2"
        );
        assert!(
            gap + SLACK >= GAP,
            "{host}: two sends {gap:?} apart, the gap is {GAP:?}"
        );
    }
}

/// The judge can fail: sent as they come, however late, the admissions
/// leave closer than the gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_however_late_a_slow_redis_breaks_the_gap() {
    let _turn = crate::one_at_a_time().await;
    let closest = crawl_through_a_slow_redis(&["--max-lateness", "1h"])
        .await
        .into_iter()
        .map(|(gap, _)| gap)
        .min()
        .unwrap();
    assert!(
        closest + SLACK < GAP,
        "sends {closest:?} apart at the closest: the replies were not late enough to show it"
    );
}

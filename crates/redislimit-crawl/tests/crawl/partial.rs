//! Partial failures and misconfiguration, from the crawl's side: a Redis
//! set up wrong stops the crawl with its cause; a crawl started while
//! Redis is down paces at its share (`--expected-replicas`) and joins Redis
//! when it answers; settings that lose the scope's agreement mid-crawl stop
//! it with a non-zero exit.

use std::process::Stdio;
use std::time::Duration;

use redislimit_tests::record::{assert_serialized, max_in_window};
use redislimit_tests::resp::Reply;
use redislimit_tests::{RedisServer, Upstream};
use tokio::process::Command;

use crate::{MS, Replica, SLACK, crawl_binary, finish, spawn_all, tempdir, urls};

/// Runs the crawl on `args` (plus `--resolve a.test:` the upstream) to its
/// end; returns its exit code and stderr.
async fn run(upstream: &Upstream, args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(crawl_binary())
        .args(["--resolve", &format!("a.test:{}", upstream.addr().ip())])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), output)
        .await
        .expect("the crawl did not finish")
        .expect("start the crawl binary");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// How `replica` exited (within a minute), and its stderr.
async fn exit_of(replica: Replica) -> (std::process::ExitStatus, String) {
    let Replica {
        mut child, stderr, ..
    } = replica;
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("the crawl did not stop")
        .unwrap();
    let stderr = String::from_utf8_lossy(&stderr.await.unwrap_or_default()).into_owned();
    (status, stderr)
}

/// A refused password and a URL that points at an HTTP server: exit 2,
/// naming the cause; nothing reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misconfigured_redis_stops_the_crawl_naming_the_cause() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    server.query(&["CONFIG", "SET", "requirepass", "secret"]);
    let url = upstream.url("a.test", "/");
    let wrong = format!("redis://:wrong@127.0.0.1:{}/", server.port());
    let http = format!("redis://127.0.0.1:{}/", upstream.addr().port());
    for (redis, cause) in [
        (wrong.as_str(), "misconfigured (authentication)"),
        (http.as_str(), "misconfigured (not Redis)"),
    ] {
        let (code, stderr) = run(&upstream, &["--redis", redis, &url]).await;
        assert_eq!(code, Some(2), "{redis}: {stderr}");
        assert!(stderr.contains(cause), "{redis}: {stderr}");
        assert!(!stderr.contains("unreachable"), "{redis}: {stderr}");
    }
    assert!(upstream.recorder().all().is_empty());
}

/// Redis down at start: refused without `--expected-replicas` (with a
/// hint); with it, two replicas pace at their shares (together within the
/// host's rate at the upstream), and join Redis once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crawl_started_while_redis_is_down_shares_and_joins_it() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    server.kill();
    let upstream = Upstream::start().await;
    let url = upstream.url("a.test", "/");
    let (code, stderr) = run(&upstream, &["--redis", &server.url(), &url]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--expected-replicas"), "{stderr}");
    assert!(upstream.recorder().all().is_empty());

    let dir = tempdir();
    let gap = 100 * MS;
    let list = urls(&upstream, &["a.test"], 60, "/slow?chunks=2&every=10");
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        "100ms",
        "--expected-replicas",
        "2",
        "--lease-ttl",
        "2s",
    ];
    let replicas = spawn_all(dir.path(), &upstream, &list, 2, &args);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.restart();
    let back = std::time::Instant::now();
    finish(replicas).await;
    let seen = upstream.recorder().host("a.test");
    let outage: Vec<_> = seen.iter().filter(|r| r.send < back).cloned().collect();
    assert!(
        outage.iter().any(|r| r.replica == 0) && outage.iter().any(|r| r.replica == 1),
        "both replicas worked while Redis was down: {outage:?}"
    );
    // Each at half the rate: together within it (two replicas that never
    // met may share a turn, so the gap between them is not promised).
    let peak = max_in_window(&outage, Duration::from_secs(1) - SLACK);
    assert!(peak <= 11, "{peak} sends in 1 s at a 100 ms gap");
    // Joined: pacing is shared again, and the state lives in Redis.
    let after: Vec<_> = seen
        .iter()
        .filter(|r| r.send > back + Duration::from_millis(1500))
        .cloned()
        .collect();
    assert!(after.len() >= 4, "too few sends after Redis came back");
    assert_serialized(&after, gap - SLACK);
    match server.query(&["DBSIZE"]) {
        Reply::Integer(keys) => assert!(keys > 0, "the replicas never wrote to Redis"),
        other => panic!("DBSIZE: {other:?}"),
    }
}

/// The scope's record changes under a running crawl (another rollout's
/// settings): the crawl stops starting requests, says why, and exits 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crawl_that_loses_the_agreement_exits_non_zero() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = urls(&upstream, &["a.test", "b.test"], 40, "/");
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        "50ms",
        "--lease-ttl",
        "1s",
    ];
    let mut replicas = spawn_all(dir.path(), &upstream, &list, 1, &args);
    // Once it has sent a few, the record says other settings.
    let started = std::time::Instant::now();
    while upstream.recorder().all().len() < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the crawl sent nothing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let config = match server.query(&["KEYS", "*:config"]) {
        Reply::Array(Some(keys)) => match keys.into_iter().next() {
            Some(Reply::Bulk(Some(key))) => key,
            other => panic!("no config key: {other:?}"),
        },
        other => panic!("KEYS: {other:?}"),
    };
    let other = "mode=serialized min_delay=10ms quota=off lease_ttl=1s";
    for _ in 0..3 {
        server.query(&["SET", &config, other, "PX", "60000"]);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let replica = replicas.remove(0);
    let (status, stderr) = exit_of(replica).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("other settings"), "{stderr}");
    assert!(
        upstream.recorder().all().len() < list.len(),
        "every URL was sent though the scope disagreed"
    );
}

/// Two replicas crawl one host through the Sentinel of `set` (with `env`
/// added to their environment) and must share one serialized pace on its
/// master: bodies take 60 ms, longer than the 30 ms gap, so only the shared
/// serialization keeps them from overlapping.
async fn crawl_through_sentinel(set: &redislimit_tests::RedisSentinel, env: &[(&str, &str)]) {
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let sentinel = set.sentinel().url();
    let args = [
        "--redis-sentinel",
        &sentinel,
        "--redis-master",
        set.master_name(),
        "--min-delay",
        "30ms",
    ];
    let list = urls(&upstream, &["a.test"], 12, "/slow?chunks=2&every=30");
    let replicas: Vec<_> = crate::deal(&list, 2)
        .iter()
        .enumerate()
        .map(|(i, hand)| crate::spawn_with_env(dir.path(), i, &upstream, hand, &args, env))
        .collect();
    finish(replicas).await;
    let seen = upstream.recorder().host("a.test");
    assert_eq!(seen.len(), 12);
    assert!(seen.iter().any(|r| r.replica == 0) && seen.iter().any(|r| r.replica == 1));
    assert_serialized(&seen, 30 * MS);
    match set.master().query(&["DBSIZE"]) {
        Reply::Integer(keys) => assert!(keys > 0, "nothing in the master"),
        other => panic!("DBSIZE: {other:?}"),
    }
}

/// `--redis-sentinel`: two replicas find the master through a Sentinel and
/// share one serialized pace there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_pace_through_sentinel() {
    let _turn = crate::one_at_a_time().await;
    let set = tokio::task::block_in_place(redislimit_tests::RedisSentinel::start);
    crawl_through_sentinel(&set, &[]).await;
}

/// `--redis-sentinel rediss://...`: the Sentinel, the master and its replica
/// speak TLS only; two replicas trust the CA through `SSL_CERT_FILE` (a
/// Sentinel pool takes no CA of its own) and share one serialized pace on
/// the master the Sentinel names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_pace_through_sentinel_over_tls() {
    let _turn = crate::one_at_a_time().await;
    let set = tokio::task::block_in_place(redislimit_tests::RedisSentinel::start_tls);
    assert!(set.sentinel().url().starts_with("rediss://"));
    let dir = tempdir();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, set.ca().expect("a TLS deployment").ca_pem()).unwrap();
    crawl_through_sentinel(&set, &[("SSL_CERT_FILE", ca.to_str().unwrap())]).await;
}

/// Redis killed (as `SHUTDOWN NOSAVE` would) and a fresh, empty one started
/// on its port 4.5 s later (2 s of the outage's sends, after the 2.5 s in
/// which the replicas wait until the others would know), serialized mode
/// over the fourteen hosts the crawl tests resolve: each host is served by
/// one replica during the outage. Once Redis is back, the others must not
/// be admitted beside that replica's last outage send (or its request
/// still in flight), though the first replica reaches Redis 700 ms after
/// the others (its connection, through a proxy, is held that long: it goes
/// on sending in-process meanwhile; the others' first admission to a host
/// they deferred waits 1.3 s). The first replica serves none of the hosts
/// in about one run in 300 (replica ids are random): then it tries once
/// more.
///
/// Measured with nginx before the fix, the others were admitted at once,
/// beside the owner's last outage send (1-3 sends per run 35-67 ms after
/// the previous end, one overlap). This crawl does not catch that race
/// reliably: it passed on the code before the fix too. The Redis test
/// `degraded::a_redis_back_empty_does_not_admit_beside_the_outage_owner`,
/// which places the owner's request deliberately, failed 3 of 3 before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_empty_keeps_each_hosts_serialized_gap() {
    let _turn = crate::one_at_a_time().await;
    let hosts = crate::RESOLVED;
    for attempt in 0..2 {
        let server = RedisServer::start();
        let upstream = Upstream::start().await;
        let proxy = redislimit_tests::StallProxy::start(server.addr()).await;
        let dir = tempdir();
        let gap = 100 * MS;
        let list = urls(&upstream, &hosts, 80, "/slow?chunks=2&every=10");
        let (direct, through) = (server.url(), proxy.url());
        let replicas: Vec<_> = crate::deal(&list, 3)
            .iter()
            .enumerate()
            .map(|(i, hand)| {
                let url = if i == 0 { &through } else { &direct };
                let args = [
                    "--redis",
                    url,
                    "--min-delay",
                    "100ms",
                    "--lease-ttl",
                    "2s",
                    "--key-by",
                    "host",
                ];
                crate::spawn(dir.path(), i, &upstream, hand, &args)
            })
            .collect();
        // Heartbeats: every replica knows the others.
        tokio::time::sleep(Duration::from_millis(2200)).await;
        let killed = std::time::Instant::now();
        server.kill();
        tokio::time::sleep(Duration::from_millis(4500)).await;
        proxy.stall();
        server.restart();
        let back = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(700)).await;
        proxy.resume();
        finish(replicas).await;
        // From once the requests in flight at the kill have ended (the
        // others cannot see those: docs/DESIGN.md) to the end.
        let since = killed + Duration::from_millis(300);
        for host in hosts {
            let seen: Vec<_> = upstream
                .recorder()
                .host(host)
                .into_iter()
                .filter(|r| r.send >= since)
                .collect();
            assert!(
                seen.iter().any(|r| r.send > back + Duration::from_secs(1)),
                "try {attempt}: {host} was not crawled after Redis came back"
            );
            assert_serialized(&seen, gap - SLACK);
        }
        // The try checked what it is for when the replica behind the
        // proxy served a host during the outage; another only when not.
        let owner_served = upstream
            .recorder()
            .all()
            .iter()
            .any(|r| r.replica == 0 && r.send >= killed && r.send < back);
        if owner_served {
            break;
        }
    }
}

/// Redis restarted empty under two replicas at 100 ms; a third started at
/// once with `--min-delay 40ms` records its settings first. Before: it was
/// accepted, paced beside the others for seconds, and then the two
/// original replicas were refused mid-crawl and exited 0. Now the original
/// replicas put their record back within a heartbeat or two: the newcomer
/// is refused (exit 2, naming both settings) and the others finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_newcomer_with_other_settings_is_refused() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = urls(&upstream, &crate::HOSTS, 30, "/slow?chunks=2&every=10");
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        "100ms",
        "--lease-ttl",
        "1s",
    ];
    let replicas = spawn_all(dir.path(), &upstream, &list, 2, &args);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    server.restart();
    let newcomer_urls = urls(&upstream, &["d.test"], 40, "/");
    let newcomer_args = [
        "--redis",
        &server.url(),
        "--min-delay",
        "40ms",
        "--lease-ttl",
        "1s",
    ];
    let newcomer = crate::spawn(dir.path(), 9, &upstream, &newcomer_urls, &newcomer_args);
    // The original replicas finish their crawl, exiting 0.
    finish(replicas).await;
    let (status, stderr) = exit_of(newcomer).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("min_delay=100ms"), "{stderr}");
    assert!(
        upstream.recorder().host("d.test").len() < newcomer_urls.len(),
        "the newcomer crawled everything beside replicas with other settings"
    );
}

/// Four replicas crawl `hosts` with `mode` (more crawl flags), the first
/// one through a proxy to Redis that stops forwarding for 5 s after a
/// warm-up (its connections kept open) while the others reach Redis
/// directly. Returns what the upstream saw, and when the stall began and
/// ended.
async fn crawl_with_one_cut_off(
    hosts: &[&str],
    per_host: usize,
    mode: &[&str],
) -> (
    Vec<redislimit_tests::record::Request>,
    std::time::Instant,
    std::time::Instant,
) {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let proxy = redislimit_tests::StallProxy::start(server.addr()).await;
    let dir = tempdir();
    let list = urls(&upstream, hosts, per_host, "/slow?chunks=2&every=10");
    let (direct, through) = (server.url(), proxy.url());
    let replicas: Vec<_> = crate::deal(&list, 4)
        .iter()
        .enumerate()
        .map(|(i, hand)| {
            let url = if i == 0 { &through } else { &direct };
            let args: Vec<&str> = ["--redis", url, "--min-delay", "130ms"]
                .iter()
                .chain(mode)
                .copied()
                .collect();
            crate::spawn_resolving(dir.path(), i, &upstream, hand, &args, &[], hosts)
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let stalled = std::time::Instant::now();
    proxy.stall();
    tokio::time::sleep(Duration::from_millis(5000)).await;
    proxy.resume();
    let resumed = std::time::Instant::now();
    finish(replicas).await;
    (upstream.recorder().all(), stalled, resumed)
}

/// One replica alone loses Redis (a proxy between them stops forwarding
/// for 5 s, its connections kept open) while three others crawl on through
/// Redis, lease mode, cap 4, three hosts at 130 ms. Before: while it was
/// cut off, the replica paced at its share beside the others at the full
/// limit (sends 9-25 ms apart at the upstream, 9-12 requests rejected by
/// nginx per run); once the proxy forwarded again, it sent nothing for
/// 6.4-7.2 s although Redis answered it. Now its registry entry lapses,
/// the others keep its share and turns free, and it sends on its own only
/// once they know; a wait that Redis names ends its outage: it sends again
/// within its circuit's probe (a second), the share's grace (1.5 s) and
/// its next turn (turns come every 4 x 130 ms), which a fresh clone's
/// runs put at 3.00 and 3.06 s after the thaw; half a second more is
/// allowed for a busy machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_alone_keeps_the_limit_and_sends_again_soon_after_the_thaw() {
    let _turn = crate::one_at_a_time().await;
    let mode = ["--cluster-concurrency", "4", "--lease-ttl", "10s"];
    let (seen, stalled, resumed) = crawl_with_one_cut_off(&crate::HOSTS, 120, &mode).await;
    for host in crate::HOSTS {
        let mut reqs: Vec<_> = seen.iter().filter(|r| r.host == host).cloned().collect();
        reqs.sort_by_key(|r| r.send);
        // Turns may be taken a tenth of the gap late; arrivals vary by SLACK.
        let closest = redislimit_tests::record::min_send_gap(&reqs);
        assert!(
            closest + SLACK >= 117 * MS,
            "{host}: two sends {closest:?} apart against a gap of 130 ms"
        );
        let peak = max_in_window(&reqs, Duration::from_secs(1) - 2 * SLACK);
        assert!(peak <= 8, "{host}: {peak} sends in 1 s at 130 ms");
    }
    let cut_off: Vec<_> = seen
        .iter()
        .filter(|r| r.replica == 0)
        .map(|r| r.send)
        .collect();
    assert!(
        cut_off
            .iter()
            .any(|&s| s > stalled + Duration::from_secs(1) && s < resumed),
        "the cut-off replica stopped sending while cut off"
    );
    let back = cut_off
        .iter()
        .find(|&&s| s >= resumed)
        .map(|&s| s - resumed)
        .expect("the cut-off replica sent after the thaw");
    let probe_grace_turn = Duration::from_millis(1000 + 1500 + 4 * 130);
    assert!(
        back < probe_grace_turn + Duration::from_millis(500),
        "the cut-off replica sent again {back:?} after the thaw"
    );
}

/// The same in serialized mode over twelve hosts. Before: the cut-off
/// replica served the hosts it owns during an outage (`Partition`, as
/// serialized mode's one request cannot be divided) alone at the full rate
/// while the others served them through Redis: overlapping requests, a
/// 1 ms gap. Now the others leave those hosts to it until it is back.
/// Replica ids are random: the cut-off replica owns none of the twelve
/// hosts in about 3 % of runs, which then show nothing; the crawl is run
/// again then, three times at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_alone_keeps_each_serialized_host() {
    let _turn = crate::one_at_a_time().await;
    let hosts = [
        "a.test", "b.test", "c.test", "r1.test", "r2.test", "r3.test", "r4.test", "r5.test",
        "t.test", "p.test", "h.test", "x.b.test",
    ];
    for _ in 0..3 {
        let (seen, stalled, resumed) = crawl_with_one_cut_off(&hosts, 30, &[]).await;
        for host in hosts {
            let mut reqs: Vec<_> = seen.iter().filter(|r| r.host == host).cloned().collect();
            reqs.sort_by_key(|r| r.send);
            assert_serialized(&reqs, 130 * MS - SLACK);
        }
        if seen
            .iter()
            .any(|r| r.replica == 0 && r.send > stalled && r.send < resumed)
        {
            return;
        }
    }
    panic!("in three crawls, the cut-off replica served none of the hosts while cut off");
}

/// Before: the progress line said "shared through Redis" (or, a moment
/// later, "in-process") while one master of a Cluster was away. Now it
/// says how much went without Redis: a crawl over hosts on every master,
/// one master killed (the others serving their slots), reports the crawl
/// as partly in-process, and the hosts of the other masters keep being
/// crawled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_dead_cluster_is_reported_as_partly_in_process() {
    use redislimit_tests::RedisCluster;
    use redislimit_tests::keys::HostKeys;

    let _turn = crate::one_at_a_time().await;
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    for node in cluster.nodes() {
        node.query(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
    }
    let master_of = |host: &str| cluster.master_of(&HostKeys::of("domain", host).gate).port();
    let victim = master_of("a.test");
    let healthy = ["b.test", "c.test", "r1.test", "r2.test", "r3.test"]
        .into_iter()
        .find(|h| master_of(h) != victim)
        .expect("a host on another master");
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = urls(&upstream, &["a.test", healthy], 40, "/");
    let nodes: Vec<String> = cluster.urls();
    let mut args = vec!["--min-delay", "100ms", "--progress-every", "500ms"];
    for node in &nodes {
        args.extend(["--redis-cluster", node.as_str()]);
    }
    let replica = crate::spawn(dir.path(), 0, &upstream, &list, &args);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster
        .nodes()
        .iter()
        .find(|n| n.port() == victim)
        .expect("the victim")
        .kill();
    let killed = std::time::Instant::now();
    let (status, stderr) = exit_of(replica).await;
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("pacing partly in-process"), "{stderr}");
    let after_kill = upstream
        .recorder()
        .host(healthy)
        .into_iter()
        .filter(|r| r.send > killed + Duration::from_secs(2))
        .count();
    assert!(after_kill >= 5, "{healthy} was not crawled after the kill");
}

//! Live shared policies: `crawl policy push` mid-crawl. Three replicas
//! sharing Redis pace one host at 400 ms; a policy of 100 ms is pushed;
//! the upstream sees every replica on the new gap within one `lease_ttl`,
//! and no gap shorter than the smaller of the two at the switch. A replica
//! started afterwards with the old flags takes the published policy
//! instead of being refused. A file the replicas would refuse is refused
//! by the push, and nothing is published. A published policy outlives a
//! Redis restarted empty and a frozen one, and is pushed and followed
//! through a Cluster.

use std::time::{Duration, Instant};

use redislimit_tests::record::{assert_serialized, max_in_flight, max_in_window};
use redislimit_tests::{RedisCluster, RedisServer, Upstream};

use crate::{MS, SLACK, crawl_binary, exit, finish, spawn, spawn_all, tempdir, urls};

const HOST: &str = "a.test";
const LEASE_TTL: &str = "1s";
const OLD: Duration = Duration::from_millis(400);
const NEW: Duration = Duration::from_millis(100);

/// Runs `crawl policy push FILE` against `redis`: its exit code and stderr.
fn push(redis: &str, file: &std::path::Path) -> (Option<i32>, String) {
    push_to(&["--redis", redis], file)
}

/// Runs `crawl policy push FILE` against the Redis `target` names (the
/// replicas' flags): its exit code and stderr.
fn push_to(target: &[&str], file: &std::path::Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(crawl_binary())
        .args(["policy", "push"])
        .arg(file)
        .args(target)
        .args(["--lease-ttl", LEASE_TTL])
        .output()
        .expect("run crawl policy push");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Runs `crawl policy show` against `redis`: its exit code and stdout.
fn show(redis: &str) -> (Option<i32>, String) {
    show_at(&["--redis", redis])
}

/// Runs `crawl policy show` against the Redis `target` names: its exit
/// code and stdout.
fn show_at(target: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(crawl_binary())
        .args(["policy", "show"])
        .args(target)
        .output()
        .expect("run crawl policy show");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.is_empty() || out.status.success(), "{said}");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Writes `text` as a policy file in `dir` and pushes it to the Redis
/// `target` names; asserts it was published, and returns what the push
/// said.
fn publish(target: &[&str], dir: &std::path::Path, text: &str) -> String {
    let file = dir.join("policy.toml");
    std::fs::write(&file, text).unwrap();
    let (code, said) = push_to(target, &file);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("published version"), "{said}");
    said
}

/// A replica's flags: `redis`, a gap of `gap`, leases of [`LEASE_TTL`].
fn on_redis(redis: &str, gap: Duration) -> Vec<String> {
    on_redis_with(redis, gap, LEASE_TTL)
}

/// A replica's flags: `redis`, a gap of `gap`, leases of `lease_ttl`.
fn on_redis_with(redis: &str, gap: Duration, lease_ttl: &str) -> Vec<String> {
    let gap = format!("{}ms", gap.as_millis());
    [
        "--redis",
        redis,
        "--min-delay",
        &gap,
        "--lease-ttl",
        lease_ttl,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A Redis whose scope has a gap of [`OLD`] published, an upstream, and a
/// directory for the replicas' files.
async fn published_old_gap() -> (RedisServer, Upstream, tempfile::TempDir) {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    publish(&["--redis", &server.url()], dir.path(), &gap_of(OLD));
    (server, upstream, dir)
}

/// Waits for `late`, a replica started with flags other than the
/// published policies, and asserts that it ended well, saying it paced
/// with them.
async fn took_the_published_policies(late: crate::Replica) {
    let (code, said) = exit(late).await;
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("policies were published to the scope"),
        "{said}"
    );
}

/// A policy file whose default is a gap of `gap`.
fn gap_of(gap: Duration) -> String {
    format!("[default]\nmin_delay = \"{}ms\"\n", gap.as_millis())
}

/// Asserts that `crawl policy show` against the Redis `target` names
/// prints version `version` with a gap of `gap`.
fn assert_shows(target: &[&str], version: u64, gap: Duration) {
    let (code, shown) = show_at(target);
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains(&format!("# version {version} ")), "{shown}");
    let gap = format!("\"{}ms\"", gap.as_millis());
    assert!(shown.contains(&gap), "{shown}");
}

/// `crawl policy show` prints the published policies as a policy file
/// which, pushed again, publishes the same policies: every setting of the
/// default and of each rule is written out (a rule switching the default's
/// quota off included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_show_prints_a_file_that_push_reads_back() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let redis = server.url();
    let dir = tempdir();
    let (code, said) = show(&redis);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("no policies are published"), "{said}");

    let file = dir.path().join("policy.toml");
    std::fs::write(
        &file,
        r#"[default]
min_delay = "250ms"
quota = 100
window = "1h"

[[rule]]
match = "api.example.com"
min_delay = "0s"
quota = 0
max_bytes_per_sec = "200KiB"

[[rule]]
match = "*.cdn.example.com"
cluster_concurrency = 4
jitter = "50ms"
"#,
    )
    .unwrap();
    let (code, said) = push(&redis, &file);
    assert_eq!(code, Some(0), "{said}");
    let (code, first) = show(&redis);
    assert_eq!(code, Some(0), "{first}");
    for line in [
        "# version 1 ",
        "min_delay = \"250ms\"\nmax_concurrent = 1\nquota = 100\nwindow = \"1h\"\n",
        "match = \"api.example.com\"\nmin_delay = \"0s\"\nmax_concurrent = 1\nquota = 0\njitter",
        "max_bytes_per_sec = 204800\n",
        "match = \"*.cdn.example.com\"\ncluster_concurrency = 4\nmin_delay = \"250ms\"",
        "jitter = \"50ms\"\n",
    ] {
        assert!(first.contains(line), "{line:?} not in:\n{first}");
    }

    let shown = dir.path().join("shown.toml");
    std::fs::write(&shown, &first).unwrap();
    let (code, said) = push(&redis, &shown);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("published version 2"), "{said}");
    let (code, second) = show(&redis);
    assert_eq!(code, Some(0), "{second}");
    assert_eq!(second, first.replace("# version 1 ", "# version 2 "));
}

/// With Redis down, `crawl policy show` and `push` fail at once (exit 2)
/// saying so, rather than hang or print that nothing is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_show_and_push_say_when_redis_is_down() {
    let server = RedisServer::start();
    let redis = server.url();
    server.kill();
    let dir = tempdir();
    let file = dir.path().join("policy.toml");
    std::fs::write(&file, "[default]\nmin_delay = \"250ms\"\n").unwrap();
    let file = file.display().to_string();
    for args in [
        vec!["policy", "show", "--redis", &redis],
        vec!["policy", "push", &file, "--redis", &redis],
    ] {
        let run = tokio::process::Command::new(crawl_binary())
            .args(&args)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .unwrap_or_else(|_| panic!("{args:?} did not end"))
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(said.contains("Redis does not answer"), "{args:?}: {said}");
        assert!(out.stdout.is_empty(), "{args:?}: {:?}", out.stdout);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_pushed_mid_crawl_reaches_every_replica_within_a_lease_ttl() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let redis = server.url();

    // Refused before it is published: a pattern that is not a host.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[rule]]\nmatch = \"not a host!\"\nmin_delay = \"1s\"\n",
    )
    .unwrap();
    let (code, said) = push(&redis, &bad);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("not a host!"), "{said}");

    let list = urls(&upstream, &[HOST], 36, "/");
    let args = on_redis(&redis, OLD);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let replicas = spawn_all(dir.path(), &upstream, &list, 3, &args);
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let said = publish(&["--redis", &redis], dir.path(), &gap_of(NEW));
    let pushed = Instant::now();
    assert!(said.contains("published version 1"), "{said}");

    // A replica started now with the old flags follows the published policy.
    let late_urls = urls(&upstream, &["b.test"], 3, "/");
    let late = spawn(dir.path(), 3, &upstream, &late_urls, &args);
    finish(replicas).await;
    took_the_published_policies(late).await;

    let seen = upstream.recorder().host(HOST);
    assert_eq!(seen.len(), 36);
    // No gap below the smaller of the two policies', at the switch or
    // anywhere (less the arrival stamps' jitter).
    assert_serialized(&seen, NEW - 5 * MS);
    // Before the push: the old gap (the test could tell them apart).
    let before: Vec<_> = seen.iter().filter(|r| r.send < pushed).cloned().collect();
    assert!(before.len() >= 3, "{before:?}");
    assert_serialized(&before, OLD - 5 * MS);
    // One lease TTL after it: every replica on the new gap.
    let settled = pushed + Duration::from_secs(1);
    let after: Vec<_> = seen
        .windows(2)
        .filter(|w| w[1].send >= settled)
        .map(|w| (w[1].replica, w[1].send - w[0].end))
        .collect();
    for replica in 0..3 {
        assert!(
            after.iter().any(|(r, _)| *r == replica),
            "replica {replica} sent nothing after the switch: {after:?}"
        );
    }
    let slow: Vec<_> = after
        .iter()
        .filter(|(_, gap)| *gap >= OLD - 100 * MS)
        .collect();
    assert!(
        slow.is_empty(),
        "{} sends one lease TTL after the push still at the old gap: {slow:?}",
        slow.len()
    );
}

/// Redis restarted empty under a crawl following a published policy slower
/// than its flags: the replicas put the policy back and keep its pace
/// (judged at the upstream), and a replica started afterwards with the
/// same flags follows it too, rather than being refused or pacing by its
/// flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_policy_outlives_a_redis_restarted_empty() {
    let _turn = crate::one_at_a_time().await;
    let (server, upstream, dir) = published_old_gap().await;
    let redis = server.url();

    let list = urls(&upstream, &[HOST], 15, "/");
    let args = on_redis(&redis, NEW);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let replicas = spawn_all(dir.path(), &upstream, &list, 3, &args);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.restart();
    let back = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let late_urls = urls(&upstream, &[HOST], 3, "/late");
    let late = spawn(dir.path(), 3, &upstream, &late_urls, &args);
    finish(replicas).await;
    took_the_published_policies(late).await;
    // Put back in Redis, as published.
    assert_shows(&["--redis", &redis], 1, OLD);
    let seen = upstream.recorder().host(HOST);
    assert_eq!(seen.len(), 18);
    assert!(
        seen.iter().any(|r| r.send < back) && seen.iter().any(|r| r.send > back && r.replica < 3),
        "the restart fell mid-crawl: {seen:?}"
    );
    // The published gap throughout: before the restart, across it, and
    // after, the late replica's sends included.
    assert_serialized(&seen, OLD - 5 * MS);
}

/// Redis restarted empty under a replica following a published policy,
/// with leases long enough that its next look for the policies is 10 s
/// away: its heartbeat puts the scope's record back (naming version 1),
/// and the policy with it. A replica started as soon as the record is
/// back follows the policy (judged at the upstream) rather than exiting
/// refused by the record, as it did when only that look put the policy
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_as_the_scope_comes_back_follows_the_published_policy() {
    let restart = async |server: &RedisServer| {
        server.restart();
        let restarted = Instant::now();
        while server
            .query(&["KEYS", "*:config"])
            .as_array()
            .is_none_or(|k| k.is_empty())
        {
            assert!(
                restarted.elapsed() < Duration::from_secs(5),
                "the record was not put back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // The first replica's next look still to come (every 10 s).
    a_late_replica_follows_the_policy_after("40s", restart, Some(Duration::from_secs(8))).await;
}

/// The published policy deleted from Redis under a replica following it
/// (the scope's record still names it): a replica started then waits at
/// start for the replica in use to put it back (at its next look, a
/// second here), and follows it (judged at the upstream) rather than
/// exiting refused by the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_while_the_policy_is_lost_waits_for_it() {
    let delete = async |server: &RedisServer| {
        let key = server.query(&["KEYS", "*:policy"]);
        let key = key
            .as_array()
            .and_then(|k| k.first()?.as_str())
            .unwrap()
            .to_owned();
        server.command(&["DEL", &key]);
    };
    a_late_replica_follows_the_policy_after("4s", delete, None).await;
}

/// A replica on Redis with leases of `lease_ttl` follows a published gap
/// slower than its flags; 1.2 s in, `lose` has Redis lose the policy, and
/// a replica started once it returns (within `within` of its start, when
/// given) must follow the policy too: exit 0 saying so, and the published
/// gap throughout at the upstream.
async fn a_late_replica_follows_the_policy_after(
    lease_ttl: &str,
    lose: impl AsyncFnOnce(&RedisServer),
    within: Option<Duration>,
) {
    let _turn = crate::one_at_a_time().await;
    let (server, upstream, dir) = published_old_gap().await;
    let args = on_redis_with(&server.url(), NEW, lease_ttl);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = spawn(
        dir.path(),
        0,
        &upstream,
        &urls(&upstream, &[HOST], 8, "/"),
        &args,
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let lost = Instant::now();
    lose(&server).await;
    let late_urls = urls(&upstream, &[HOST], 3, "/late");
    let late = spawn(dir.path(), 1, &upstream, &late_urls, &args);
    took_the_published_policies(late).await;
    if let Some(within) = within {
        assert!(lost.elapsed() < within, "too slow to tell");
    }
    finish(vec![first]).await;
    let seen = upstream.recorder().host(HOST);
    assert_eq!(seen.len(), 11);
    assert!(seen.iter().any(|r| r.replica == 1), "{seen:?}");
    assert_serialized(&seen, OLD - 5 * MS);
}

/// `crawl policy push` and `show` through a Redis Cluster, named as the
/// replicas name it (`--redis-cluster`): two replicas on the Cluster whose
/// flags say 100 ms follow the published 400 ms (judged at the upstream),
/// and `show` prints it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_are_pushed_and_followed_through_a_cluster() {
    let _turn = crate::one_at_a_time().await;
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let nodes = cluster.urls();
    let mut target = Vec::new();
    for url in &nodes {
        target.extend(["--redis-cluster", url.as_str()]);
    }
    let said = publish(&target, dir.path(), &gap_of(OLD));
    assert!(said.contains("published version 1"), "{said}");

    let list = urls(&upstream, &[HOST], 8, "/");
    let flags = format!("{}ms", NEW.as_millis());
    let mut args = target.clone();
    args.extend(["--min-delay", &flags, "--lease-ttl", LEASE_TTL]);
    let replicas = spawn_all(dir.path(), &upstream, &list, 2, &args);
    let said = finish(replicas).await;
    assert_eq!(said.len(), 8);
    let seen = upstream.recorder().host(HOST);
    assert_eq!(seen.len(), 8);
    assert!(
        seen.iter().any(|r| r.replica == 0) && seen.iter().any(|r| r.replica == 1),
        "{seen:?}"
    );
    assert_serialized(&seen, OLD - 5 * MS);
    assert_shows(&target, 1, OLD);
}

/// Redis frozen under three replicas following a published policy slower
/// than their flags: while they pace in-process, each at its share, they
/// keep the published pace together, not the flags' five times faster one
/// (judged at the upstream: never more than one request per 100 ms over
/// any second, nor more than the published cap in flight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_policy_holds_through_a_frozen_redis() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let redis = server.url();
    let policy = "[default]\nmin_delay = \"100ms\"\ncluster_concurrency = 3\n";
    publish(&["--redis", &redis], dir.path(), policy);

    let list = urls(&upstream, &[HOST], 50, "/slow?chunks=2&every=20");
    let args = [
        "--redis",
        &redis,
        "--min-delay",
        "20ms",
        "--cluster-concurrency",
        "6",
        "--lease-ttl",
        LEASE_TTL,
    ];
    let replicas = spawn_all(dir.path(), &upstream, &list, 3, &args);
    // Every replica registered and read by the others.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let frozen = Instant::now();
    server.pause();
    // Long enough for every replica to send on its own: each waits 2.5 s
    // from the last renewal it sent, and a renewal sent as the circuit's
    // probe (a second apart) during the freeze counts, as it may land
    // (4.5 s left one replica 0.3 s, and the guard below 4 sends, once in
    // about fifteen runs).
    tokio::time::sleep(Duration::from_millis(6000)).await;
    server.resume();
    let resumed = Instant::now();
    finish(replicas).await;
    let seen = upstream.recorder().host(HOST);
    assert_eq!(seen.len(), 50);
    let during = seen
        .iter()
        .filter(|r| r.send > frozen && r.send < resumed)
        .count();
    // When each request left, from the freeze (ms), and which replica sent it.
    let timeline: Vec<_> = seen
        .iter()
        .map(|r| {
            let ms = if r.send >= frozen {
                r.send.duration_since(frozen).as_millis() as i64
            } else {
                -(frozen.duration_since(r.send).as_millis() as i64)
            };
            (ms, r.replica)
        })
        .collect();
    assert!(
        during >= 5,
        "only {during} requests while Redis was frozen ({} ms): {timeline:?}",
        resumed.duration_since(frozen).as_millis()
    );
    let rate = max_in_window(&seen, Duration::from_secs(1) - 2 * SLACK);
    assert!(
        rate <= 10,
        "{rate} requests in 1 s, more than one per 100 ms"
    );
    assert!(max_in_flight(&seen) <= 3, "{seen:?}");
}

//! Servers that state their budget: an upstream allowing 5 requests per
//! host per 2 s window says so in `RateLimit` fields or GitHub's
//! `X-RateLimit-*` headers and answers `429` without `Retry-After` beyond
//! it. Two crawl replicas sharing Redis must never be refused, and must
//! use the budget: judged from the upstream's own counts per window. The
//! same for a budget of bytes (`qu="content-bytes"`) and a cap on
//! requests in flight (`qu="concurrent-requests"`), that one also through
//! a Redis outage.

use std::time::{Duration, Instant};

use redislimit_tests::record::max_in_flight;
use redislimit_tests::{RedisServer, Upstream};

use crate::{finish, spawn_all, tempdir};

const LIMIT: u64 = 5;
const HOSTS: [&str; 2] = ["a.test", "b.test"];
const PER_HOST: usize = 20;

/// Two replicas crawl `PER_HOST` URLs of each host against the budget
/// upstream in `style`, with `extra` flags; returns the upstream and the
/// report lines.
async fn crawl(style: &str, extra: &[&str]) -> (Upstream, Vec<serde_json::Value>) {
    let path = format!("/budget?style={style}&limit={LIMIT}&window=2000");
    crawl_path(&path, 2, "20ms", extra).await
}

/// `replicas` crawl `PER_HOST` URLs of each host at `path`, `min_delay`
/// apart, with `extra` flags.
async fn crawl_path(
    path: &str,
    replicas: usize,
    min_delay: &str,
    extra: &[&str],
) -> (Upstream, Vec<serde_json::Value>) {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = crate::urls(&upstream, &HOSTS, PER_HOST, path);
    let url = server.url();
    let mut args = vec!["--redis", url.as_str(), "--min-delay", min_delay];
    args.extend(extra);
    let lines = finish(spawn_all(dir.path(), &upstream, &list, replicas, &args)).await;
    assert_eq!(lines.len(), HOSTS.len() * PER_HOST);
    (upstream, lines)
}

async fn crawl_within_budget(style: &str) {
    let _turn = crate::one_at_a_time().await;
    let (upstream, lines) = crawl(style, &[]).await;
    within_budget(&upstream, &lines);
}

/// No request refused, the spent budget reported, and the windows used.
fn within_budget(upstream: &Upstream, lines: &[serde_json::Value]) {
    // The report says why hosts were held.
    let spent = lines
        .iter()
        .filter(|l| l["asked"] == "budget-spent")
        .count();
    assert!(
        spent >= HOSTS.len(),
        "{spent} responses reported a spent budget"
    );

    for host in HOSTS {
        let seen = upstream.recorder().host(host);
        let refused: Vec<_> = seen.iter().filter(|r| r.status == 429).collect();
        assert!(
            refused.is_empty(),
            "{host}: {} requests refused",
            refused.len()
        );
        assert!(
            seen.iter().any(|r| r.replica == 0) && seen.iter().any(|r| r.replica == 1),
            "{host}: both replicas fetched it"
        );
        // Windows between the first and the last (which the crawl's start
        // and end cut short) each admitted what the budget allows, or
        // near it: at least 0.8 of the allowed rate.
        let windows = upstream.windows(host);
        assert_eq!(
            windows.iter().map(|w| w.0 as usize).sum::<usize>(),
            PER_HOST,
            "{host}: every request counted: {windows:?}"
        );
        let inner = &windows[1..windows.len() - 1];
        let used: u64 = inner.iter().map(|w| w.0).sum();
        assert!(
            !inner.is_empty() && used * 10 >= inner.len() as u64 * LIMIT * 8,
            "{host}: {used} requests in {} full windows of {LIMIT} (windows: {windows:?})",
            inner.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ietf_ratelimit_fields_keep_two_replicas_within_the_budget() {
    crawl_within_budget("ietf").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_ratelimit_headers_keep_two_replicas_within_the_budget() {
    crawl_within_budget("github").await;
}

/// A budget of `LIMIT` and a half bodies of 4 KiB a window, stated in
/// bytes: three replicas are never refused, and use it. The half body
/// left after `LIMIT` responses is read as spent, as it must be: counted
/// as requests, 2048 would be plenty left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_of_content_bytes_keeps_three_replicas_within_it() {
    let _turn = crate::one_at_a_time().await;
    let size = 4096;
    let path = format!(
        "/budget?unit=content-bytes&size={size}&limit={}&window=2000",
        LIMIT * size + size / 2
    );
    let (upstream, lines) = crawl_path(&path, 3, "20ms", &[]).await;
    within_budget(&upstream, &lines);
}

/// A host allowing 2 requests in flight says so (`qu="concurrent-requests"`)
/// to three replicas allowed 4 at once among them, and sending every
/// 60 ms requests that take 300 ms: it is never refused, and gets 2 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stated_concurrency_caps_three_replicas() {
    let _turn = crate::one_at_a_time().await;
    let path = "/budget?unit=concurrent-requests&limit=2&chunks=3&every=100&window=2000";
    let args = ["--cluster-concurrency", "4"];
    let (upstream, _) = crawl_path(path, 3, "60ms", &args).await;
    for host in HOSTS {
        let seen = upstream.recorder().host(host);
        let refused = seen.iter().filter(|r| r.status == 429).count();
        assert_eq!(refused, 0, "{host}: {refused} requests refused");
        assert_eq!(max_in_flight(&seen), 2, "{host}: {seen:?}");
        for replica in 0..3 {
            assert!(
                seen.iter().any(|r| r.replica == replica),
                "{host}: replica {replica} fetched some"
            );
        }
    }
}

/// A host allowing 3 in flight, through a Redis outage: three replicas
/// learn the cap, Redis is SIGKILLed, and they go on at their shares of
/// the pace (6 in flight configured, 2 each). They divide the stated cap
/// instead (1 each): the upstream refuses nothing, before the outage or
/// during it. Without the division each replica kept 2 in flight, 6 in
/// all. (A cap below the number of replicas leaves one without a part,
/// which then hears no restatement: see `share_divides_a_cap_the_host_stated`
/// in the Redis tests, and docs/DESIGN.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stated_concurrency_holds_through_a_redis_outage() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let path = "/budget?unit=concurrent-requests&limit=3&chunks=3&every=100&window=10000";
    let replicas = three_sharing_a_stated_cap(&server, &upstream, &dir, path, "60ms");
    let down = kill_once_known(&server, &upstream, Instant::now()).await;
    finish(replicas).await;
    for (host, senders) in senders_within_the_cap(&upstream, 3, down, Instant::now()) {
        assert_eq!(senders.len(), 3, "{host}: every replica sent in the outage");
    }
}

/// Regression, judged at the upstream: a host allowing 2 in flight among
/// three replicas, stating it for 1 s with every response, through a Redis
/// outage of 5 s. The replica with no part of the cap sends nothing, so it
/// hears no restatement; once the statement lapsed there, it sent at its
/// share of the configured cap (2) beside the others' parts of the stated
/// one, and the upstream refused requests. Now it leaves the host to them
/// until Redis is back (empty), and the crawl ends through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_below_the_replica_count_holds_through_an_outage_longer_than_its_window() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let path = "/budget?unit=concurrent-requests&limit=2&chunks=3&every=100&window=1000";
    let replicas = three_sharing_a_stated_cap(&server, &upstream, &dir, path, "60ms");
    let down = kill_once_known(&server, &upstream, Instant::now()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    server.restart();
    let back = Instant::now();
    finish(replicas).await;
    for (host, senders) in senders_within_the_cap(&upstream, 2, down, back) {
        assert_eq!(
            senders.len(),
            2,
            "{host}: the two replicas with a part sent in the outage"
        );
    }
}

/// Asserts that the upstream refused nothing and had at most `cap` in
/// flight to each host; returns, for each host, the replicas that sent to
/// it between `from` and `to` (an outage), with what it recorded.
fn senders_within_the_cap(
    upstream: &Upstream,
    cap: usize,
    from: Instant,
    to: Instant,
) -> Vec<(&'static str, std::collections::BTreeSet<usize>)> {
    HOSTS
        .iter()
        .map(|&host| {
            let seen = upstream.recorder().host(host);
            let refused = seen.iter().filter(|r| r.status == 429).count();
            assert_eq!(refused, 0, "{host}: {refused} requests refused: {seen:?}");
            assert!(max_in_flight(&seen) <= cap, "{host}: {seen:?}");
            let senders = seen
                .iter()
                .filter(|r| r.send > from && r.send < to)
                .map(|r| r.replica)
                .collect();
            (host, senders)
        })
        .collect()
}

/// Waits until each of three replicas started at `started` has an answer
/// from every host (which states its cap), and its heartbeat has read the
/// others' and been answered for three beats (each began with its first
/// acquire, before its first answer), so that each knows it shares the
/// host and is known to share it; then SIGKILLs `server`, and returns
/// when.
async fn kill_once_known(server: &RedisServer, upstream: &Upstream, started: Instant) -> Instant {
    every_replica_knows_the_statements(upstream).await;
    let known =
        (Instant::now() + Duration::from_millis(1200)).max(started + Duration::from_millis(1500));
    tokio::time::sleep_until(known.into()).await;
    server.kill();
    Instant::now()
}

/// Three replicas sharing `server`, each host's 30 URLs at `path` (which
/// states a cap on requests in flight) dealt among them: 6 in flight
/// configured, `min_delay` apart, leases of 2 s.
fn three_sharing_a_stated_cap(
    server: &RedisServer,
    upstream: &Upstream,
    dir: &tempfile::TempDir,
    path: &str,
    min_delay: &str,
) -> Vec<crate::Replica> {
    let list = crate::urls(upstream, &HOSTS, 30, path);
    let url = server.url();
    let args = [
        "--redis",
        url.as_str(),
        "--min-delay",
        min_delay,
        "--cluster-concurrency",
        "6",
        "--lease-ttl",
        "2s",
    ];
    spawn_all(dir.path(), upstream, &list, 3, &args)
}

/// Waits (at most 30 s) until every one of three replicas has had an
/// answer from every host, which states its cap.
async fn every_replica_knows_the_statements(upstream: &Upstream) {
    let knows = |replica: usize, host: &str| {
        upstream
            .recorder()
            .host(host)
            .iter()
            .any(|r| r.replica == replica && r.status == 200)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(0..3).all(|n| HOSTS.iter().all(|h| knows(n, h))) {
        assert!(Instant::now() < deadline, "the replicas did not all start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Regression: three replicas started together, Redis SIGKILLed as soon as
/// each has an answer from every host (within their first heartbeat, when
/// each had read the registry only as it was when it registered): the
/// first to register had seen no other, and sent alone at the whole cap
/// the host stated at once, beside the others at their parts of it and
/// what Redis had admitted them: the upstream refused requests. Now the
/// replicas that saw others leave the hosts to them, and the one that saw
/// none waits before it sends alone. Redis comes back, empty, after 4 s,
/// and the crawl ends through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stated_concurrency_holds_when_redis_goes_in_the_first_second() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let path = "/budget?unit=concurrent-requests&limit=3&chunks=2&every=50&window=10000";
    let replicas = three_sharing_a_stated_cap(&server, &upstream, &dir, path, "30ms");
    every_replica_knows_the_statements(&upstream).await;
    server.kill();
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    server.restart();
    let back = Instant::now();
    finish(replicas).await;
    let senders = senders_within_the_cap(&upstream, 3, down, back);
    assert!(
        senders.iter().any(|(_, senders)| !senders.is_empty()),
        "nothing was sent while Redis was down"
    );
}

/// The test of the test: the same crawl not reading the headers (the bare
/// 429s still back off) is refused by the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reading_the_headers_the_same_crawl_is_refused() {
    let _turn = crate::one_at_a_time().await;
    let (upstream, _) = crawl("ietf", &["--no-rate-limit-headers"]).await;
    let refused: usize = HOSTS
        .iter()
        .map(|h| {
            upstream
                .recorder()
                .host(h)
                .iter()
                .filter(|r| r.status == 429)
                .count()
        })
        .sum();
    assert!(refused > 0, "no request was refused");
}

//! nginx as the judge: crawl replicas fetch through a real nginx whose
//! `limit_req` and `limit_conn` stand between them and the upstream, so
//! whether the crawl was polite is decided by a server we did not write.
//!
//! nginx keys both limits by `$host`, so every virtual host (`a.test`,
//! `b.test`, `c.test`, one `server` block each) has its own:
//! - `limit_req` at [`RATE`] requests a second with no burst: a request
//!   that arrives less than 100 ms after the last one nginx accepted for
//!   its host (measured in whole milliseconds of nginx's clock) gets `429`;
//! - `limit_conn` at the test's cap: a request while that many of its
//!   host's are in progress gets `503`.
//!
//! The crawl paces at [`PACE`], 150 ms more than nginx's interval, so that
//! only impoliteness trips the judge and not a request that travelled
//! longer than the one before it on a loaded machine (on two shared cores
//! a request was seen arriving 50 ms late). Bodies ([`SLOW`]) take 320 ms,
//! longer than both: two requests that overlap are refused by `limit_conn`
//! instead of being hidden behind `limit_req`, which nginx checks first,
//! and lease mode has two requests in flight at times.
//!
//! Each test fails on any `429` or `503`, read both from the crawl's
//! reports and from nginx's access log, which must also show every URL
//! once, answered `200`. Two tests show that the judge can fail: replicas
//! that do not share their pace get `429`s, and a replica that lets two
//! requests to a host overlap gets `503`s.
//!
//! A crowd of eight replicas started at one instant over 500 hosts is
//! judged the same way, by an nginx that serves any host name.
//!
//! nginx itself is [`redislimit_tests::Nginx`]. Test host names resolve to
//! `127.0.0.1` (see [`crate::spawn`]), where nginx listens.

use std::collections::BTreeMap;

use redislimit_tests::record::max_in_flight;
use redislimit_tests::{Logged, Nginx, NginxConfig, RedisServer, Upstream};
use serde_json::Value;

use crate::{HOSTS, finish, spawn_all_resolving};

/// nginx's `limit_req` rate per host, requests a second (no burst).
const RATE: u32 = 10;

/// The crawl's `--min-delay`: comfortably above nginx's `1 s / RATE`.
const PACE: &str = "250ms";

/// What the upstream behind nginx serves: 4 chunks 80 ms apart (320 ms).
const SLOW: &str = "/slow?chunks=4&every=80";

/// nginx in front of `upstream` for the test hosts, at [`RATE`] and at
/// most `conns` requests per host in progress.
fn start(upstream: &Upstream, conns: u32) -> Nginx {
    Nginx::start(NginxConfig {
        hosts: Some(&HOSTS),
        rate: RATE,
        conns,
        upstream: Some(upstream.addr()),
    })
}

/// What nginx and the crawl said about one run.
struct Judged {
    /// Per (host, path and query): the status in nginx's log.
    nginx: BTreeMap<(String, String), u16>,
    /// How many of nginx's answers had each status.
    counts: BTreeMap<u16, usize>,
    /// nginx's log, in its order.
    log: Vec<Logged>,
}

/// Runs `replicas` crawls with `args` over `urls` through `nginx`, then
/// checks that nginx's log and the crawl's reports agree: one log line per
/// URL, with the status the report has.
async fn crawl_through(
    nginx: &Nginx,
    upstream: &Upstream,
    urls: &[String],
    replicas: usize,
    args: &[&str],
) -> Judged {
    crawl_through_hosts(nginx, upstream, urls, replicas, args, &[]).await
}

/// [`crawl_through`], with `hosts` resolved to nginx beside the usual ones.
async fn crawl_through_hosts(
    nginx: &Nginx,
    upstream: &Upstream,
    urls: &[String],
    replicas: usize,
    args: &[&str],
    hosts: &[&str],
) -> Judged {
    let dir = crate::tempdir();
    let replicas = spawn_all_resolving(dir.path(), upstream, urls, replicas, args, hosts);
    let reports = finish(replicas).await;
    let log = nginx.access_log(urls.len());
    let mut judged = Judged {
        nginx: BTreeMap::new(),
        counts: BTreeMap::new(),
        log: log.clone(),
    };
    for line in &log {
        *judged.counts.entry(line.status).or_default() += 1;
        let again = judged
            .nginx
            .insert((line.host.clone(), line.uri.clone()), line.status);
        assert!(again.is_none(), "nginx saw {line:?} twice");
    }
    assert_eq!(
        log.len(),
        urls.len(),
        "nginx logged {} requests for {} URLs: {log:?}",
        log.len(),
        urls.len()
    );
    let reported = reported_statuses(&reports);
    assert_eq!(
        reported, judged.nginx,
        "the crawl's reports and nginx's log disagree"
    );
    judged
}

/// Per (host, path and query): the status each report line has.
fn reported_statuses(reports: &[Value]) -> BTreeMap<(String, String), u16> {
    reports
        .iter()
        .map(|line| {
            let url = url::Url::parse(line["url"].as_str().unwrap()).unwrap();
            let status = line["status"]
                .as_u64()
                .unwrap_or_else(|| panic!("no response: {line}"));
            let uri = match url.query() {
                Some(query) => format!("{}?{query}", url.path()),
                None => url.path().to_owned(),
            };
            (
                (url.host_str().unwrap().to_owned(), uri),
                u16::try_from(status).unwrap(),
            )
        })
        .collect()
}

/// nginx answered every request `200`: no `429` (too early) and no `503`
/// (too many at once). A failure shows nginx's error log, which says which
/// limit refused each one.
fn assert_polite(nginx: &Nginx, judged: &Judged) {
    let refused: Vec<_> = judged
        .nginx
        .iter()
        .filter(|(_, status)| **status != 200)
        .collect();
    // What nginx logged of the refused hosts, in order: status, path,
    // end (ms), replica.
    let hosts: std::collections::BTreeSet<&str> =
        refused.iter().map(|((host, _), _)| host.as_str()).collect();
    let seen: Vec<_> = judged
        .log
        .iter()
        .filter(|l| hosts.contains(l.host.as_str()))
        .map(|l| (l.status, &l.host, &l.uri, l.at_ms, l.replica))
        .collect();
    assert!(
        refused.is_empty(),
        "nginx's answers by status: {:?} (429: too early, 503: too many at once); \
         refused: {refused:?}\nwhat nginx logged of their hosts: {seen:?}\n{}",
        judged.counts,
        nginx.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_accepts_one_replica_pacing_in_process() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let nginx = start(&upstream, 1);
    let urls = nginx.urls(&HOSTS, 6, SLOW);
    let judged = crawl_through(&nginx, &upstream, &urls, 1, &["--min-delay", PACE]).await;
    assert_polite(&nginx, &judged);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_accepts_replicas_serialized_through_redis() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let nginx = start(&upstream, 1);
    let urls = nginx.urls(&HOSTS, 6, SLOW);
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        PACE,
        "--max-concurrent",
        "4",
        "--lease-ttl",
        "5s",
    ];
    let judged = crawl_through(&nginx, &upstream, &urls, 3, &args).await;
    assert_polite(&nginx, &judged);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_accepts_replicas_leasing_through_redis() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let nginx = start(&upstream, 2);
    let hosts = &HOSTS[..2];
    let urls = nginx.urls(hosts, 10, SLOW);
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        PACE,
        "--cluster-concurrency",
        "2",
    ];
    let judged = crawl_through(&nginx, &upstream, &urls, 3, &args).await;
    assert_polite(&nginx, &judged);
    // nginx's cap of 2 was put to the test: the crawl used both slots.
    let peak = hosts
        .iter()
        .map(|host| max_in_flight(&upstream.recorder().host(host)))
        .max();
    assert_eq!(peak, Some(2), "lease mode never used its second slot");
}

/// The judge can fail: three replicas that pace alone, each at a polite
/// [`PACE`] (4 a second), send each host 12 requests a second together,
/// more than nginx's [`RATE`], and those that come sooner than 100 ms
/// after another replica's are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_refuses_replicas_that_do_not_share_a_pace() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let nginx = start(&upstream, 1);
    let urls = nginx.urls(&HOSTS, 15, "/?fast=1");
    let judged = crawl_through(
        &nginx,
        &upstream,
        &urls,
        3,
        &["--min-delay", PACE, "--no-backoff"],
    )
    .await;
    let early = judged.counts.get(&429).copied().unwrap_or(0);
    assert!(
        early > 0,
        "nginx refused nothing as too early: {:?}",
        judged.counts
    );
}

/// The judge can fail: one replica that lets two requests to a host be in
/// flight, each sent a polite [`PACE`] after the one before, overlaps
/// bodies that take longer than that, and nginx's cap of one refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_refuses_overlapping_requests() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let nginx = start(&upstream, 1);
    let urls = nginx.urls(&HOSTS[..1], 6, SLOW);
    let judged = crawl_through(
        &nginx,
        &upstream,
        &urls,
        1,
        &["--min-delay", PACE, "--max-concurrent", "2", "--no-backoff"],
    )
    .await;
    let crowded = judged.counts.get(&503).copied().unwrap_or(0);
    assert!(
        crowded > 0,
        "nginx refused nothing as too many at once: {:?}",
        judged.counts
    );
}

/// nginx's `limit_req` rate per host for the crowd below: one request
/// every 200 ms, 50 ms less than the crawl's [`PACE`].
const CROWD_RATE: u32 = 5;

/// Eight replicas started at one instant over 500 hosts, in lease mode
/// (cap 2), through one Redis: nginx refuses nothing. Their first acquires
/// come as a crowd of 4,000 script calls; an admission that reaches its
/// busy replica late must not be sent closer than the gap to another
/// replica's (this crowd was once refused 2-22 requests in its first
/// 0.3 s, sent 102-198 ms apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_replicas_started_together_over_500_hosts_are_polite() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let nginx = Nginx::start(NginxConfig {
        hosts: None,
        rate: CROWD_RATE,
        conns: 2,
        upstream: Some(upstream.addr()),
    });
    let names: Vec<String> = (0..500).map(|i| format!("h{i}.crowd.test")).collect();
    let hosts: Vec<&str> = names.iter().map(String::as_str).collect();
    let urls = nginx.urls(&hosts, 4, "/slow?chunks=1&every=100");
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        PACE,
        "--cluster-concurrency",
        "2",
        "--max-concurrent",
        "2",
        "--concurrency",
        "16",
    ];
    let judged = crawl_through_hosts(&nginx, &upstream, &urls, 8, &args, &hosts).await;
    assert_polite(&nginx, &judged);
    // Every replica sent, to many hosts.
    let record = upstream.recorder().all();
    let replicas: std::collections::BTreeSet<usize> = record.iter().map(|r| r.replica).collect();
    assert_eq!(replicas.len(), 8, "not every replica sent: {replicas:?}");
}

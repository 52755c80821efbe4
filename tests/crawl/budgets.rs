//! Servers that state their budget: an upstream allowing 5 requests per
//! host per 2 s window says so in `RateLimit` fields or GitHub's
//! `X-RateLimit-*` headers and answers `429` without `Retry-After` beyond
//! it. Two crawl replicas sharing Redis must never be refused, and must
//! use the budget: judged from the upstream's own counts per window.

use redislimit_tests::{RedisServer, Upstream};

use crate::{finish, spawn_all, tempdir};

const LIMIT: u64 = 5;
const HOSTS: [&str; 2] = ["a.test", "b.test"];
const PER_HOST: usize = 20;

async fn crawl_within_budget(style: &str) {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let path = format!("/budget?style={style}&limit={LIMIT}&window=2000");
    let list = crate::urls(&upstream, &HOSTS, PER_HOST, &path);
    let args = ["--redis", &server.url(), "--min-delay", "20ms"];
    let lines = finish(spawn_all(dir.path(), &upstream, &list, 2, &args)).await;
    assert_eq!(lines.len(), HOSTS.len() * PER_HOST);

    for host in HOSTS {
        let seen = upstream.recorder().host(host);
        let refused: Vec<_> = seen.iter().filter(|r| r.status == 429).collect();
        assert!(refused.is_empty(), "{host}: {} requests refused", refused.len());
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

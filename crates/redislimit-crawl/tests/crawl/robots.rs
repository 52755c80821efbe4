//! `--robots`: each host's robots.txt, fetched through the same pacing,
//! decides which URLs go and how far apart; judged at the upstream.

use std::time::Duration;

use redislimit_tests::{RedisServer, Upstream};

use crate::{SLACK, finish, spawn, tempdir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn robots_txt_disallows_and_sets_the_crawl_delay() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    upstream.set_robots(
        "a.test",
        200,
        "User-agent: *\nDisallow: /private\nCrawl-delay: 1\n",
    );
    let dir = tempdir();
    let mut list = Vec::new();
    for i in 0..4 {
        list.push(upstream.url("a.test", &format!("/public?i={i}")));
        if i < 2 {
            list.push(upstream.url("a.test", &format!("/private/page?i={i}")));
        }
        // No robots.txt (404): everything allowed, at --min-delay.
        list.push(upstream.url("b.test", &format!("/private/page?i={i}")));
    }
    // Two replicas through Redis: each reads robots.txt, and the delay it
    // asks for holds between any two of their requests.
    let server = RedisServer::start();
    let url = server.url();
    let args = ["--robots", "--min-delay", "50ms", "--redis", &url];
    let replicas = crate::spawn_all(dir.path(), &upstream, &list, 2, &args);
    let report = finish(replicas).await;

    let a = upstream.recorder().host("a.test");
    let paths: Vec<&str> = a.iter().map(|r| r.path.as_str()).collect();
    // Each replica asked for robots.txt before anything else there (the
    // second one's request waits its turn, the crawl delay included).
    for replica in [0, 1] {
        let first = a.iter().find(|r| r.replica == replica).unwrap();
        assert_eq!(first.path, "/robots.txt", "replica {replica}: {paths:?}");
    }
    assert_eq!(paths.iter().filter(|p| **p == "/robots.txt").count(), 2);
    assert!(
        !paths.iter().any(|p| p.starts_with("/private")),
        "{paths:?}"
    );
    let public: Vec<_> = a.iter().filter(|r| r.path.starts_with("/public")).collect();
    assert_eq!(public.len(), 4);
    assert!(public.iter().any(|r| r.replica == 0) && public.iter().any(|r| r.replica == 1));
    for pair in public.windows(2) {
        let gap = pair[1].send - pair[0].send;
        assert!(
            gap + SLACK >= Duration::from_secs(1),
            "a.test asked for 1 s between requests and got {gap:?}"
        );
    }
    let b = upstream.recorder().host("b.test");
    assert_eq!(b.len(), 6, "two robots.txt and the four URLs");
    assert!(
        b.windows(2)
            .all(|w| w[1].send - w[0].send < Duration::from_secs(1))
    );
    // The disallowed URLs are reported as skipped, not as errors.
    let skipped: Vec<_> = report.iter().filter(|l| l["skipped"].is_string()).collect();
    assert_eq!(skipped.len(), 2, "{report:?}");
    for line in skipped {
        assert!(line["url"].as_str().unwrap().contains("/private"));
        assert!(line["error"].is_null() && line["status"].is_null());
        assert_eq!(line["skipped"], "disallowed by robots.txt");
    }
}

/// RFC 9309: a robots.txt that cannot be had (5xx) disallows the host; it
/// is asked for again (three times in all), and nothing else is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_robots_txt_keeps_the_crawl_off_the_host() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    upstream.set_robots("c.test", 503, "");
    let dir = tempdir();
    let list = crate::urls(&upstream, &["c.test"], 3, "/page");
    let args = ["--robots", "--robots-retry", "200ms", "--min-delay", "20ms"];
    let report = finish(vec![spawn(dir.path(), 0, &upstream, &list, &args)]).await;
    let seen = upstream.recorder().host("c.test");
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen.iter().all(|r| r.path == "/robots.txt"));
    assert!(
        report.iter().all(|l| l["skipped"]
            .as_str()
            .is_some_and(|s| s.contains("robots.txt unavailable"))),
        "{report:?}"
    );
}

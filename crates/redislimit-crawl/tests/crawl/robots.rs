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
    // Two replicas through Redis: one reads robots.txt for both, and the
    // delay it asks for holds between any two of their requests.
    let server = RedisServer::start();
    let url = server.url();
    let args = ["--robots", "--min-delay", "50ms", "--redis", &url];
    let replicas = crate::spawn_all(dir.path(), &upstream, &list, 2, &args);
    let report = finish(replicas).await;

    let a = upstream.recorder().host("a.test");
    let paths: Vec<&str> = a.iter().map(|r| r.path.as_str()).collect();
    // robots.txt was asked for before anything else there, once for both.
    assert_eq!(paths[0], "/robots.txt", "{paths:?}");
    assert_eq!(paths.iter().filter(|p| **p == "/robots.txt").count(), 1);
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
    let sent: Vec<_> = b.iter().map(|r| (r.replica, r.path.as_str())).collect();
    assert_eq!(b.len(), 5, "one robots.txt and the four URLs: {sent:?}");
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

/// With Redis, robots.txt is fetched by one replica for the fleet and its
/// outcome kept 24 hours: three replicas ask each host once; a 5xx keeps
/// every replica off the host; a second crawl asks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn robots_txt_is_fetched_once_for_the_fleet_and_kept_for_the_next_crawl() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    upstream.set_robots("a.test", 200, "User-agent: *\nDisallow: /private\n");
    upstream.set_robots("c.test", 503, "");
    let server = RedisServer::start();
    let url = server.url();
    let args = [
        "--robots",
        "--robots-retry",
        "100ms",
        "--min-delay",
        "20ms",
        "--redis",
        &url,
    ];
    let hosts = ["a.test", "b.test", "c.test"];
    let robots = |host: &str| {
        upstream
            .recorder()
            .host(host)
            .into_iter()
            .filter(|r| r.path == "/robots.txt")
            .collect::<Vec<_>>()
    };
    for run in 0..2 {
        let dir = tempdir();
        let mut list = crate::urls(&upstream, &hosts, 6, &format!("/public/{run}"));
        list.extend(crate::urls(&upstream, &["a.test"], 3, "/private/x"));
        let report = finish(crate::spawn_all(dir.path(), &upstream, &list, 3, &args)).await;
        assert_eq!(report.len(), list.len());
        // One robots.txt per host for the fleet, in both runs together;
        // c.test's three attempts, all by one replica.
        for host in ["a.test", "b.test"] {
            let asked: Vec<_> = robots(host).iter().map(|r| (r.replica, r.send)).collect();
            assert_eq!(asked.len(), 1, "run {run}: {host} {asked:?}");
        }
        let c = robots("c.test");
        assert_eq!(c.len(), 3, "run {run}: {c:?}");
        assert!(c.iter().all(|r| r.replica == c[0].replica), "{c:?}");
        // Nothing but robots.txt reached c.test, or a.test's /private.
        let sent: Vec<_> = hosts
            .iter()
            .flat_map(|h| upstream.recorder().host(h))
            .filter(|r| r.path != "/robots.txt")
            .collect();
        assert!(
            sent.iter()
                .all(|r| r.host != "c.test" && !r.path.starts_with("/private")),
            "{sent:?}"
        );
        let public = |h: &str| sent.iter().filter(|r| r.host == h).count();
        assert_eq!(
            (public("a.test"), public("b.test")),
            (6 * (run + 1), 6 * (run + 1))
        );
        for line in &report {
            let url = line["url"].as_str().unwrap();
            let skipped = line["skipped"].as_str();
            if url.contains("c.test") {
                assert!(
                    skipped.is_some_and(|s| s.contains("robots.txt unavailable")),
                    "{line}"
                );
            } else if url.contains("/private") {
                assert_eq!(skipped, Some("disallowed by robots.txt"), "{line}");
            } else {
                assert_eq!(line["status"], 200, "{line}");
            }
        }
        // Every replica kept off c.test, and each had some of its URLs.
        for replica in 0..3 {
            let file = dir.path().join(format!("report-{replica}.jsonl"));
            let text = std::fs::read_to_string(file).unwrap();
            assert!(text.contains("c.test"), "replica {replica}");
        }
    }
}

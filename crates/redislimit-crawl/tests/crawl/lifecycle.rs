//! Redirects, penalties that must not starve other hosts, per-host order,
//! and stopping on a signal.

use std::time::{Duration, Instant};

use redislimit_tests::record::{Request, assert_serialized};
use redislimit_tests::{RedisServer, Upstream};

use crate::{MS, SLACK, finish, read_report, signal, spawn, tempdir};

fn on(seen: &[Request], host: &str) -> Vec<Request> {
    seen.iter().filter(|r| r.host == host).cloned().collect()
}

/// Regression: reqwest followed redirects inside the pacing middleware, so
/// t.test got the redirected requests unpaced, and a 429 at the end of a
/// redirect held the host that redirected. Every hop is now paced on its
/// own host, and the penalty goes to the host that sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redirect_hop_is_paced_and_penalized_on_its_own_host() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let gap = 300 * MS;
    let mut list = Vec::new();
    for n in 1..=5 {
        let to = upstream.url("t.test", &format!("/?via=r{n}"));
        list.push(upstream.redirect_url(&format!("r{n}.test"), &to, 302));
        list.push(upstream.url("t.test", &format!("/?direct={n}")));
    }
    // h.test redirects to p.test, which answers 429 Retry-After: 2; the
    // next redirect to p.test must wait for it, h.test itself must not.
    let busy = upstream.url("p.test", "/status?code=429&retry_after=2");
    let after = upstream.url("p.test", "/?after");
    list.push(upstream.redirect_url("h.test", &busy, 302));
    list.push(upstream.redirect_url("h.test", &after, 301));
    list.push(upstream.url("h.test", "/?plain"));
    let replica = spawn(dir.path(), 0, &upstream, &list, &["--min-delay", "300ms"]);
    let report = finish(vec![replica]).await;

    let seen = upstream.recorder().all();
    let target = on(&seen, "t.test");
    assert_eq!(target.len(), 10, "{target:?}");
    assert_serialized(&target, gap);
    for n in 1..=5 {
        assert_eq!(on(&seen, &format!("r{n}.test")).len(), 1);
    }
    let (p, h) = (on(&seen, "p.test"), on(&seen, "h.test"));
    assert_eq!((p.len(), h.len()), (2, 3), "{seen:?}");
    let hold = Duration::from_secs(2);
    assert!(
        p[1].send + SLACK >= p[0].send + hold,
        "p.test was not held after its 429: {:?}",
        p[1].send - p[0].send
    );
    let plain = h.iter().find(|r| r.path == "/?plain").unwrap();
    assert!(
        plain.send < p[0].send + hold,
        "h.test was held for p.test's 429: {:?} after it",
        plain.send - p[0].send
    );
    // The report records the hops.
    let line = report
        .iter()
        .find(|l| {
            l["url"]
                .as_str()
                .is_some_and(|u| u.contains("h.test") && u.contains("code=302"))
        })
        .unwrap();
    assert_eq!(line["status"], 429);
    assert_eq!(line["final_url"].as_str(), Some(busy.as_str()));
    assert_eq!(line["redirects"].as_array().map(Vec::len), Some(1));
}

/// Regression: the URLs of a host held by a long penalty waited holding
/// every `--concurrency` slot, and the healthy host stalled for the whole
/// hold. With one slot, a healthy host's sends never wait for the other
/// host's 3 s penalty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalized_host_does_not_hold_up_a_healthy_one() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let mut list = Vec::new();
    for i in 0..20 {
        if i < 3 {
            list.push(upstream.url("p.test", &format!("/status?code=429&retry_after=3&i={i}")));
        }
        list.push(upstream.url("h.test", &format!("/?i={i}")));
    }
    let replica = spawn(
        dir.path(),
        0,
        &upstream,
        &list,
        &["--min-delay", "100ms", "--concurrency", "1"],
    );
    finish(vec![replica]).await;
    let seen = upstream.recorder().all();
    let (penalized, healthy) = (on(&seen, "p.test"), on(&seen, "h.test"));
    assert_eq!((penalized.len(), healthy.len()), (3, 20));
    // p.test was held 3 s after each 429...
    for pair in penalized.windows(2) {
        assert!(pair[1].send + SLACK >= pair[0].send + Duration::from_secs(3));
    }
    // ...and h.test went on at its own pace meanwhile: no gap between its
    // sends came anywhere near the penalty.
    let worst = healthy
        .windows(2)
        .map(|w| w[1].send - w[0].send)
        .max()
        .unwrap();
    assert!(
        worst < Duration::from_secs(1),
        "h.test waited {worst:?} between two sends"
    );
    assert!(
        healthy.last().unwrap().send < penalized[1].send,
        "h.test finished only after p.test's first hold"
    );
}

/// Regression: with `--concurrency` above 1, spawned tasks raced to
/// acquire and each host's URLs went out of input order. Two hosts, four
/// in flight per host, eight overall: each host's requests reach the
/// upstream in the order of the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hosts_urls_go_out_in_input_order() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let mut list = Vec::new();
    for i in 0..30 {
        for host in ["a.test", "b.test"] {
            list.push(upstream.url(host, &format!("/slow?chunks=2&every=30&i={i:02}")));
        }
    }
    let args = ["--min-delay", "15ms", "--max-concurrent", "4"];
    let replica = spawn(dir.path(), 0, &upstream, &list, &args);
    finish(vec![replica]).await;
    let seen = upstream.recorder().all();
    for host in ["a.test", "b.test"] {
        let order: Vec<String> = on(&seen, host).into_iter().map(|r| r.path).collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order.len(), 30);
        assert_eq!(order, sorted, "{host}: out of input order");
    }
    // Several were in flight at once: the order was not bought by sending
    // one at a time.
    assert!(redislimit_tests::record::max_in_flight(&on(&seen, "a.test")) >= 2);
}

/// Regression: SIGTERM killed a replica without its summary or report, and
/// its leases held the host for the whole lease TTL: the next replica
/// waited 8.5 s of a 10 s TTL. Now the requests in flight finish, every
/// lease is released before the process exits (143), and the report holds
/// every request that completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_and_releases_the_host() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let slow = crate::urls(&upstream, &["a.test"], 10, "/slow?chunks=4&every=200");
    let args = [
        "--redis",
        &server.url(),
        "--lease-ttl",
        "10s",
        "--min-delay",
        "50ms",
    ];
    let mut first = spawn(dir.path(), 0, &upstream, &slow, &args);
    // The second replica waits behind the first one's lease.
    let mut waiting = upstream.arrivals();
    while waiting < 2 {
        tokio::time::sleep(20 * MS).await;
        waiting = upstream.arrivals();
    }
    let next = crate::urls(&upstream, &["a.test"], 2, "/?second");
    let second = spawn(dir.path(), 1, &upstream, &next, &args);
    tokio::time::sleep(300 * MS).await;
    signal(first.child.id().unwrap(), "TERM");
    let status = tokio::time::timeout(Duration::from_secs(20), first.child.wait())
        .await
        .expect("the stopped replica did not exit")
        .unwrap();
    let exited = Instant::now();
    let stderr = String::from_utf8_lossy(&first.stderr.await.unwrap_or_default()).into_owned();
    assert_eq!(status.code(), Some(143), "{stderr}");
    finish(vec![second]).await;

    let seen = upstream.recorder().all();
    let from_first: Vec<&Request> = seen.iter().filter(|r| r.replica == 0).collect();
    let from_second: Vec<&Request> = seen.iter().filter(|r| r.replica == 1).collect();
    assert!(
        !from_first.is_empty() && from_first.len() < slow.len(),
        "the stop came too early or too late: {} of {}",
        from_first.len(),
        slow.len()
    );
    assert!(
        from_second[0].send < exited + Duration::from_secs(1),
        "the next replica's first request came {:?} after the stopped one exited",
        from_second[0].send - exited
    );
    // Every request the upstream served to the stopped replica is in its
    // report, complete.
    let report = read_report(&first.report);
    let completed: Vec<&serde_json::Value> = report
        .iter()
        .filter(|l| l["status"] == 200 && l["error"].is_null())
        .collect();
    assert_eq!(completed.len(), from_first.len(), "{report:?}\n{stderr}");
    assert!(stderr.contains("SIGTERM"), "{stderr}");
}

/// A second signal ends the requests in flight at once: the replica exits
/// (130 for SIGINT) long before its 5 s requests would have finished,
/// reports them as aborted, and still releases the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigint_aborts_and_still_releases() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let slow = crate::urls(&upstream, &["a.test"], 3, "/slow?chunks=10&every=500");
    let args = [
        "--redis",
        &server.url(),
        "--cluster-concurrency",
        "2",
        "--max-concurrent",
        "2",
        "--lease-ttl",
        "10s",
        "--min-delay",
        "20ms",
    ];
    let mut first = spawn(dir.path(), 0, &upstream, &slow, &args);
    while upstream.arrivals() < 2 {
        tokio::time::sleep(20 * MS).await;
    }
    let pid = first.child.id().unwrap();
    signal(pid, "INT");
    tokio::time::sleep(200 * MS).await;
    signal(pid, "INT");
    let status = tokio::time::timeout(Duration::from_secs(4), first.child.wait())
        .await
        .expect("a second SIGINT did not end the replica")
        .unwrap();
    assert_eq!(status.code(), Some(130));
    let report = read_report(&first.report);
    let (started, unstarted): (Vec<_>, Vec<_>) =
        report.iter().partition(|l| l["not_started"] != true);
    assert_eq!(started.len(), 2, "{report:?}");
    assert!(
        started
            .iter()
            .all(|l| l["error"].as_str().is_some_and(|e| e.contains("aborted"))),
        "{report:?}"
    );
    // The third never started, and says so (a resumed crawl fetches it).
    assert_eq!(unstarted.len(), 1, "{report:?}");
    assert_eq!(unstarted[0]["sent"], false, "{report:?}");
    // Both leases were released: another replica gets both slots at once.
    let next = crate::urls(&upstream, &["a.test"], 2, "/slow?chunks=2&every=300&next");
    let second = spawn(dir.path(), 1, &upstream, &next, &args);
    finish(vec![second]).await;
    let seen = upstream.recorder().all();
    let second: Vec<&Request> = seen.iter().filter(|r| r.replica == 1).collect();
    assert_eq!(second.len(), 2);
    assert!(
        second[0].end > second[1].send,
        "the second replica could not use both slots: a lease was left behind"
    );
}

//! Faults mid-crawl: nothing is lost, pacing falls back and comes back.

use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use redislimit_tests::record::{
    Request, assert_serialized, max_in_flight, max_in_window, min_send_gap,
};
use redislimit_tests::{RedisServer, Upstream};

use crate::{HOSTS, MS, SLACK, finish, spawn, spawn_all, tempdir, urls};

/// How long after its last heartbeat reached Redis a replica that lost it
/// sends nothing (until the replicas that may still reach Redis know, see
/// docs/DESIGN.md, "Partial outages"): outages here last this much longer
/// than the fallback is judged over.
const ALONE_AFTER: Duration = Duration::from_millis(2500);

/// How much closer than its `min_delay` two sends of one replica may
/// arrive at the upstream: the way from the crawl's record of a send to the
/// upstream's varies. Measured here with four replicas on two cores, one
/// request of a pair the crawl had recorded a full `min_delay` apart arrived
/// 10.3 ms late, so 5 ms failed about one run in ten; the bursts this guards
/// against were 3-4 ms apart.
const ARRIVAL_SLACK: Duration = SLACK;

/// No replica sent two requests to one host closer than `gap` (less the
/// arrival slack). Returns how many (replica, host) pairs were checked.
/// `report` (the replicas' report lines) and `fault` (when Redis was hit)
/// only make a failure easier to read.
fn assert_each_replica_spaced(
    seen: &[Request],
    gap: Duration,
    report: &[serde_json::Value],
    fault: Instant,
) -> usize {
    let stamped: BTreeMap<(String, String), u64> = report
        .iter()
        .filter_map(|line| {
            let url = url::Url::parse(line["url"].as_str()?).ok()?;
            let path = format!("{}?{}", url.path(), url.query().unwrap_or(""));
            Some((
                (url.host_str()?.to_owned(), path),
                line["start_ms"].as_u64()?,
            ))
        })
        .collect();
    let stamp = |r: &Request| stamped.get(&(r.host.clone(), r.path.clone())).copied();
    let mut by_sender: BTreeMap<(usize, &str), Vec<&Request>> = BTreeMap::new();
    for r in seen {
        by_sender.entry((r.replica, &r.host)).or_default().push(r);
    }
    for ((replica, host), sends) in &mut by_sender {
        sends.sort_by_key(|r| r.send);
        for pair in sends.windows(2) {
            let apart = pair[1].send - pair[0].send;
            let stamps = (stamp(pair[0]), stamp(pair[1]));
            assert!(
                apart + ARRIVAL_SLACK >= gap,
                "replica {replica} sent two requests to {host} {apart:?} apart, \
                 its min_delay is {gap:?}; the second arrived {:?} after the fault; \
                 the crawl stamped them (epoch ms) {stamps:?}",
                pair[1].send.saturating_duration_since(fault)
            );
        }
    }
    by_sender.len()
}

/// The requests to `host` sent after `since`.
fn sent_after(upstream: &Upstream, host: &str, since: Instant) -> Vec<Request> {
    upstream
        .recorder()
        .host(host)
        .into_iter()
        .filter(|r| r.send >= since)
        .collect()
}

/// Two replicas crawl while `fault` strikes Redis and `heal` undoes it;
/// every URL ends once, and once Redis is back the replicas share one
/// serialized pace again.
async fn crawl_through(fault: impl FnOnce(&RedisServer), heal: impl FnOnce(&RedisServer)) {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = urls(&upstream, &HOSTS[..2], 60, "/slow?chunks=2&every=20");
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        "80ms",
        "--lease-ttl",
        "2s",
    ];
    let replicas = spawn_all(dir.path(), &upstream, &list, 2, &args);

    tokio::time::sleep(Duration::from_millis(600)).await;
    fault(&server);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    heal(&server);
    let healed = Instant::now();
    finish(replicas).await;

    // Shared again: give the replicas a moment to find Redis, then check.
    // Replicas probe a Redis that failed once a second; allow that and a
    // request in flight before checking.
    let since = healed + Duration::from_millis(1500);
    let mut checked = 0;
    for host in &HOSTS[..2] {
        let after = sent_after(&upstream, host, since);
        checked += after.len();
        assert_serialized(&after, 80 * MS);
    }
    assert!(
        checked >= 4,
        "too few requests after the fault to tell ({checked})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_crawl_loses_nothing_and_sharing_resumes() {
    let _turn = crate::one_at_a_time().await;
    crawl_through(RedisServer::kill, RedisServer::restart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_mid_crawl_loses_nothing_and_sharing_resumes() {
    let _turn = crate::one_at_a_time().await;
    crawl_through(RedisServer::pause, RedisServer::resume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_request_frees_its_slot_after_the_lease() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let lease = Duration::from_secs(1);
    let args = [
        "--redis",
        &server.url(),
        "--cluster-concurrency",
        "1",
        "--lease-ttl",
        "1s",
        "--min-delay",
        "0ms",
    ];
    let long = vec![upstream.url("a.test", "/slow?chunks=200&every=50")];
    let mut doomed = spawn(dir.path(), 0, &upstream, &long, &args);
    let started = Instant::now();
    while upstream.arrivals() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the first replica never sent its request"
        );
        tokio::time::sleep(10 * MS).await;
    }
    doomed.child.start_kill().unwrap(); // SIGKILL, mid-request
    doomed.child.wait().await.unwrap();

    let survivor = spawn(
        dir.path(),
        1,
        &upstream,
        &[upstream.url("a.test", "/after-crash")],
        &args,
    );
    finish(vec![survivor]).await;
    let seen = upstream.recorder().host("a.test");
    assert_eq!(seen.len(), 2);
    let (dead, next) = (&seen[0], &seen[1]);
    assert_eq!(next.path, "/after-crash");
    assert!(
        next.send + SLACK >= dead.send + lease,
        "the slot was taken {:?} after the dead replica's send, before its lease ran out",
        next.send - dead.send
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_holds_the_host_on_every_replica() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let args = [
        "--redis",
        &server.url(),
        "--cluster-concurrency",
        "4",
        "--min-delay",
        "10ms",
    ];
    let first = vec![upstream.url("a.test", "/status?code=429&retry_after=2")];
    let busy = spawn(dir.path(), 0, &upstream, &first, &args);
    let report = finish(vec![busy]).await;
    assert_eq!(report[0]["status"], 429);
    assert_eq!(report[0]["retry_after_ms"], 2000);

    let others: Vec<_> = (1..3)
        .map(|n| {
            spawn(
                dir.path(),
                n,
                &upstream,
                &urls(&upstream, &["a.test"], 3, &format!("/r{n}")),
                &args,
            )
        })
        .collect();
    finish(others).await;
    let seen = upstream.recorder().host("a.test");
    assert_eq!(seen.len(), 7);
    let penalty_end = seen[0].end + Duration::from_secs(2);
    for later in &seen[1..] {
        assert!(
            later.send >= penalty_end,
            "replica {} sent {:?} into the 2 s penalty",
            later.replica,
            penalty_end - later.send
        );
    }
}

/// Regression: acquires queued behind a frozen Redis timed out together and
/// the in-process fallback sent them at once (26 requests rejected by nginx
/// in one 4 ms burst), and a request following one Redis admitted late was
/// sent right after it. Four replicas in lease mode share each host through
/// Redis, which is frozen mid-crawl and resumed: no replica sends two
/// requests to one host closer than its `min_delay`, before, during or
/// after the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_keep_their_gap_across_a_frozen_redis() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let gap = 100 * MS;
    let list = urls(&upstream, &HOSTS, 120, "/slow?chunks=2&every=20");
    let args = [
        "--redis",
        &server.url(),
        "--cluster-concurrency",
        "4",
        "--lease-ttl",
        "10s",
        "--min-delay",
        "100ms",
    ];
    let replicas = spawn_all(dir.path(), &upstream, &list, 4, &args);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let frozen = Instant::now();
    server.pause();
    tokio::time::sleep(ALONE_AFTER + Duration::from_millis(2000)).await;
    server.resume();
    let resumed = Instant::now();
    let report = finish(replicas).await;

    let seen = upstream.recorder().all();
    assert_eq!(seen.len(), list.len());
    let outage = seen
        .iter()
        .filter(|r| r.send >= frozen && r.send < resumed)
        .count();
    let after = seen.iter().filter(|r| r.send >= resumed).count();
    assert!(
        outage >= 20 && after >= 20,
        "the crawl did not span the outage and the recovery: {outage} sent during it, {after} after"
    );
    assert_eq!(
        assert_each_replica_spaced(&seen, gap, &report, frozen),
        4 * HOSTS.len()
    );
}

/// Regression: one replica with eight requests in flight burst to each host
/// when Redis froze (its queued acquires failed over together) and again
/// when it came back. Ten tries, each freezing Redis mid-crawl and resuming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_keeps_its_gap_across_a_freeze_and_a_resume() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let gap = 80 * MS;
    for attempt in 0..10 {
        let upstream = Upstream::start().await;
        let dir = tempdir();
        let scope = format!("try{attempt}");
        let list = urls(&upstream, &HOSTS[..2], 25, "/slow?chunks=2&every=10");
        let args = [
            "--redis",
            &server.url(),
            "--scope",
            &scope,
            "--cluster-concurrency",
            "4",
            "--lease-ttl",
            "10s",
            "--min-delay",
            "80ms",
        ];
        let replica = spawn(dir.path(), 0, &upstream, &list, &args);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let frozen = Instant::now();
        server.pause();
        tokio::time::sleep(Duration::from_millis(900)).await;
        server.resume();
        let report = finish(vec![replica]).await;
        let seen = upstream.recorder().all();
        assert_eq!(seen.len(), list.len(), "try {attempt}");
        assert_eq!(
            assert_each_replica_spaced(&seen, gap, &report, frozen),
            2,
            "try {attempt}"
        );
    }
}

/// Four replicas in lease mode (cap 4, 100 ms gap) crawl three hosts with
/// `--fallback policy`; Redis is frozen for 3 s once every replica is in the
/// registry. Returns every request the upstream saw, and when the outage
/// began and ended.
async fn four_replicas_through_an_outage(
    policy: &str,
    extra: &[&str],
) -> (Vec<Request>, Instant, Instant) {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = urls(&upstream, &HOSTS, 100, "/slow?chunks=2&every=20");
    let args = [
        "--redis",
        &server.url(),
        "--cluster-concurrency",
        "4",
        "--min-delay",
        "100ms",
        "--fallback",
        policy,
    ];
    let args: Vec<&str> = args.iter().chain(extra).copied().collect();
    let replicas = spawn_all(dir.path(), &upstream, &list, 4, &args);
    // Two heartbeats after the last replica started: every one has read
    // every other's entry.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let frozen = Instant::now();
    server.pause();
    tokio::time::sleep(ALONE_AFTER + Duration::from_secs(3)).await;
    server.resume();
    let resumed = Instant::now();
    finish(replicas).await;
    let seen = upstream.recorder().all();
    if extra.is_empty() {
        assert_eq!(seen.len(), list.len(), "every URL reached the upstream");
    }
    (seen, frozen, resumed)
}

/// The most requests to `host` in any 1 s (less twice the slack for where
/// the upstream stamps arrivals), and the most in flight at once.
fn peaks(seen: &[Request], host: &str) -> (usize, usize) {
    let reqs: Vec<Request> = seen.iter().filter(|r| r.host == host).cloned().collect();
    (
        max_in_window(&reqs, Duration::from_secs(1) - 2 * SLACK),
        max_in_flight(&reqs),
    )
}

/// Regression: with Redis frozen, four replicas sent four times each host's
/// rate. With the default policy the upstream never sees more than the
/// configured rate (one per 100 ms, averaged over any 1 s) or more than the
/// cap in flight, before, during or after the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_fallback_keeps_each_hosts_rate_across_replicas() {
    let _turn = crate::one_at_a_time().await;
    let (seen, frozen, resumed) = four_replicas_through_an_outage("share", &[]).await;
    let during = seen
        .iter()
        .filter(|r| r.send >= frozen && r.send < resumed)
        .count();
    assert!(during >= 30, "only {during} requests during the outage");
    for host in HOSTS {
        let (rate, in_flight) = peaks(&seen, host);
        let timeline: Vec<(i64, usize)> = seen
            .iter()
            .filter(|r| r.host == host)
            .map(|r| {
                let ms = if r.send >= frozen {
                    (r.send - frozen).as_millis() as i64
                } else {
                    -((frozen - r.send).as_millis() as i64)
                };
                (ms, r.replica)
            })
            .collect();
        assert!(
            rate <= 10,
            "{host}: {rate} requests in 1 s, more than 1 per 100 ms; \
             (ms from the freeze, replica), resumed at {:?}: {timeline:?}",
            resumed - frozen
        );
        assert!(
            in_flight <= 4,
            "{host}: {in_flight} in flight, the cap is 4"
        );
    }
}

/// With `partition`, one replica serves each host during the outage: the
/// host's requests keep the exact gap and the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_keeps_exact_spacing_during_the_outage() {
    let _turn = crate::one_at_a_time().await;
    // A URL whose host another replica serves waits for Redis, holding one
    // of the crawl's --concurrency slots; --max-wait frees the slots (the
    // URL ends with an error) so the serving replicas reach their own.
    let (seen, frozen, resumed) =
        four_replicas_through_an_outage("partition", &["--max-wait", "1s"]).await;
    for host in HOSTS {
        let during: Vec<Request> = seen
            .iter()
            .filter(|r| r.host == host && r.send >= frozen && r.send < resumed)
            .cloned()
            .collect();
        assert!(
            during.len() >= 10,
            "{host}: only {} during the outage",
            during.len()
        );
        let gap = min_send_gap(&during);
        assert!(
            gap + ARRIVAL_SLACK >= 100 * MS,
            "{host}: sends {gap:?} apart"
        );
        assert!(max_in_flight(&during) <= 4);
    }
}

/// With `full`, every replica paces at the whole limit during the outage:
/// the upstream sees the excess (the test that shows the others can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_fallback_shows_the_excess() {
    let _turn = crate::one_at_a_time().await;
    let (seen, _, _) = four_replicas_through_an_outage("full", &[]).await;
    let worst = HOSTS.iter().map(|h| peaks(&seen, h).0).max().unwrap();
    assert!(
        worst > 20,
        "only {worst} requests in 1 s with four replicas at full pace"
    );
}

//! Degraded mode: three replicas lose Redis and carry on in-process, and
//! together they keep each host's limits (`Share`, `Partition`), or show
//! what happens when they do not (`Full`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redislimit::{Error, FallbackLimiter, FallbackPolicy, Limiter, RedisLimiter};
use redislimit_tests::record::{
    Recorder, Request, assert_serialized, max_in_flight, max_in_window, min_send_gap,
};
use redislimit_tests::{RedisServer, StallProbe, StallProxy};

use crate::{MS, bounded, host, limiter, standalone};

const REPLICAS: usize = 3;

/// Three replicas with `policy`, registered (each has acquired and its
/// heartbeat has been read by the others).
async fn replicas(
    server: &RedisServer,
    gap: Duration,
    cap: u32,
    policy: FallbackPolicy,
) -> Vec<Arc<FallbackLimiter<RedisLimiter>>> {
    let url = server.url();
    replicas_at(&[&url, &url, &url], gap, cap, policy).await
}

/// One replica with `policy` per Redis URL of `urls`, registered.
async fn replicas_at(
    urls: &[&str],
    gap: Duration,
    cap: u32,
    policy: FallbackPolicy,
) -> Vec<Arc<FallbackLimiter<RedisLimiter>>> {
    let all = started(urls, gap, cap, policy).await;
    // Three heartbeats: every replica has read every other's entry, and
    // knows that they have read its own (see
    // `replicas_started_together_keep_the_limit_when_redis_goes_at_once`).
    tokio::time::sleep(Duration::from_millis(1600)).await;
    all
}

/// One replica with `policy` per Redis URL of `urls`, each started by an
/// acquire (its first heartbeat begins with it).
async fn started(
    urls: &[&str],
    gap: Duration,
    cap: u32,
    policy: FallbackPolicy,
) -> Vec<Arc<FallbackLimiter<RedisLimiter>>> {
    let all: Vec<_> = urls
        .iter()
        .map(|url| {
            Arc::new(
                limiter(
                    standalone(url),
                    |p| p.min_delay(gap),
                    |b| b.cluster_concurrency(cap).fallback_policy(policy),
                )
                .with_fallback(),
            )
        })
        .collect();
    for l in &all {
        drop(
            bounded(5, l.acquire_host("t", host("warm.test"), None))
                .await
                .unwrap(),
        );
    }
    all
}

/// How long after its last renewal in the registry a replica that lost
/// Redis waits before it sends on its own, at most: until every replica
/// that may still reach Redis knows (see docs/DESIGN.md, "Partial
/// outages").
const ALONE_AFTER: Duration = Duration::from_millis(2500);

/// Redis frozen, every replica sends to `a.test` from four tasks for
/// `outage` after [`ALONE_AFTER`], each request taking `work`; returns
/// what an upstream would have recorded. Acquires still waiting when the
/// outage ends give up.
async fn crawl_frozen(
    server: &RedisServer,
    all: &[Arc<FallbackLimiter<RedisLimiter>>],
    outage: Duration,
    work: Duration,
) -> Arc<Recorder> {
    server.pause();
    let recorder = crawl(all, &["a.test"], ALONE_AFTER + outage, work).await;
    server.resume();
    recorder
}

/// Every replica sends from four tasks for `outage`, each task cycling
/// through `hosts` (an acquire gives up after 1.5 s, and moves on), each
/// request taking `work`; returns what an upstream would have recorded.
async fn crawl(
    all: &[Arc<FallbackLimiter<RedisLimiter>>],
    hosts: &[&str],
    outage: Duration,
    work: Duration,
) -> Arc<Recorder> {
    crawl_giving_up(all, hosts, outage, work, 1500 * MS, None).await
}

/// [`crawl`], an acquire giving up after `give_up`; with `restate`, every
/// response states a cap on requests in flight for its window (`cap`,
/// `window`), as a host's `RateLimit` fields do.
async fn crawl_giving_up(
    all: &[Arc<FallbackLimiter<RedisLimiter>>],
    hosts: &[&str],
    outage: Duration,
    work: Duration,
    give_up: Duration,
    restate: Option<(u32, Duration)>,
) -> Arc<Recorder> {
    let recorder = Arc::new(Recorder::new());
    let stop = tokio::time::Instant::now() + outage;
    let mut tasks = Vec::new();
    for (replica, l) in all.iter().enumerate() {
        for task in 0..4 {
            let (l, recorder) = (Arc::clone(l), Arc::clone(&recorder));
            let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
            tasks.push(tokio::spawn(async move {
                let mut i = task;
                while tokio::time::Instant::now() < stop {
                    let name = &hosts[i % hosts.len()];
                    i += 1;
                    let until = stop.min(tokio::time::Instant::now() + give_up);
                    match l.acquire_host("t", host(name), Some(until)).await {
                        Ok(permit) => {
                            let send = Instant::now();
                            tokio::time::sleep(work).await;
                            recorder.record(name, replica, send, Instant::now());
                            if let Some((cap, window)) = restate {
                                bounded(5, l.cap_host(host(name), cap, window))
                                    .await
                                    .unwrap();
                            }
                            drop(permit);
                        }
                        // Given up (its turn would come after the
                        // deadline): the next try waits a moment, so that
                        // tries refused at once do not spin a worker and
                        // starve the other replicas' timers.
                        Err(Error::WaitBudget { .. }) => tokio::time::sleep(MS).await,
                        Err(err) => panic!("the fallback failed: {err:?}"),
                    }
                }
            }));
        }
    }
    for task in tasks {
        bounded(30, task).await.unwrap();
    }
    recorder
}

/// The most sends any 1 s holds at `gap` spacing, with a little slack for
/// where the instants are taken.
fn rate_bound(gap: Duration) -> usize {
    (Duration::from_secs(1).as_micros() / gap.as_micros()) as usize + 1
}

/// Consecutive sends of `seen` (sorted by send) keep `gap`, less the tenth
/// of it a turn may be taken late, and no second holds more than its rate.
fn assert_gap_and_rate(seen: &[Request], gap: Duration) {
    let closest = min_send_gap(seen);
    assert!(
        closest >= gap * 8 / 10,
        "sends {closest:?} apart against a gap of {gap:?}: {seen:?}"
    );
    let peak = max_in_window(seen, Duration::from_secs(1) - 5 * MS);
    assert!(
        peak <= rate_bound(gap),
        "{peak} sends in 1 s, more than the rate of one every {gap:?}"
    );
}

/// Regression: every replica's fallback paced at the full per-host limit,
/// so N replicas sent N times the rate, quota and in-flight cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_keeps_the_rate_and_cap_of_all_replicas_together() {
    let server = RedisServer::start();
    let gap = 150 * MS;
    let all = replicas(&server, gap, 6, FallbackPolicy::Share).await;
    let seen = crawl_frozen(&server, &all, Duration::from_secs(3), 20 * MS)
        .await
        .host("a.test");
    let senders: std::collections::BTreeSet<_> = seen.iter().map(|r| r.replica).collect();
    assert_eq!(
        senders.len(),
        REPLICAS,
        "every replica keeps working: {seen:?}"
    );
    let peak = max_in_window(&seen, Duration::from_secs(1) - 5 * MS);
    assert!(
        peak <= rate_bound(gap),
        "{peak} sends in 1 s, more than the rate of one every {gap:?}"
    );
    assert!(max_in_flight(&seen) <= 6);
}

/// Regression: replicas started together each read the registry as it
/// was when they registered, so the first saw only itself; when Redis went
/// away within their first second it sent alone at the whole rate at once,
/// beside the others at their shares of it. Now a replica that the ones
/// registered before it may not have read yet leaves the host to them,
/// and the first, which saw no other, waits as a share does before it
/// sends alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_started_together_keep_the_limit_when_redis_goes_at_once() {
    let gap = 150 * MS;
    for attempt in 1.. {
        let server = RedisServer::start();
        let url = server.url();
        let started_at = Instant::now();
        let all = started(&[&url, &url, &url], gap, 6, FallbackPolicy::Share).await;
        // Each first heartbeat (from the first acquire) answered, and no
        // second one yet: Redis goes within a heartbeat of the start.
        tokio::time::sleep(100 * MS).await;
        let within_a_heartbeat = started_at.elapsed() < 450 * MS;
        let seen = crawl_frozen(&server, &all, Duration::from_secs(3), 20 * MS)
            .await
            .host("a.test");
        assert!(!seen.is_empty(), "the fleet sent nothing: {seen:?}");
        let peak = max_in_window(&seen, Duration::from_secs(1) - 5 * MS);
        assert!(
            peak <= rate_bound(gap),
            "{peak} sends in 1 s, more than the rate of one every {gap:?}: {seen:?}"
        );
        let mut sorted = seen.clone();
        sorted.sort_by_key(|r| r.send);
        let closest = min_send_gap(&sorted);
        assert!(
            closest >= gap * 8 / 10,
            "sends {closest:?} apart against a gap of {gap:?}: {seen:?}"
        );
        if within_a_heartbeat {
            // The first replica saw no other: it sends alone, at the
            // whole rate once it has waited (the others leave it the
            // host). Later, every replica's roster names all three, and
            // the first takes its share of them.
            assert!(seen.len() >= 10, "the first replica kept working: {seen:?}");
            return;
        }
        assert!(
            attempt < 3,
            "three times the replicas took more than a heartbeat to start"
        );
    }
}

/// Regression: a cap on requests in flight the host stated was not
/// divided: each replica kept to the whole of it (within its share of the
/// configured cap), so three sent up to three times what the host allows.
/// Here the host allows 3, then 2, of the 6 configured; each replica's
/// share of the pace lets it have 2 in flight. Each keeps to its part of
/// the stated cap: 1 each, then 1 for two of them and none for the third
/// (a cap below the number of replicas).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_divides_a_cap_the_host_stated() {
    for stated in [3, 2] {
        let server = RedisServer::start();
        let all = replicas(&server, 40 * MS, 6, FallbackPolicy::Share).await;
        for l in &all {
            bounded(
                5,
                l.cap_host(host("a.test"), stated, Duration::from_secs(60)),
            )
            .await
            .unwrap();
        }
        let seen = crawl_frozen(&server, &all, Duration::from_secs(2), 300 * MS)
            .await
            .host("a.test");
        let senders: std::collections::BTreeSet<_> = seen.iter().map(|r| r.replica).collect();
        assert_eq!(senders.len(), REPLICAS.min(stated as usize), "{seen:?}");
        let most = max_in_flight(&seen);
        assert!(
            most <= stated as usize,
            "{most} in flight, the host allows {stated}: {seen:?}"
        );
    }
}

/// Regression: a replica whose part of a stated cap is none hears no
/// restatement (it sends nothing), so once the statement's window lapsed
/// there it sent at its share of the configured cap, beside the others'
/// parts of the stated one, which their responses kept restating: up to 4
/// in flight where the host allowed 2, for the rest of the outage. Now it
/// leaves the host to them until Redis admits it again. Here the host
/// allows 2 among 3 replicas, restated for 4 s with every response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_no_part_of_a_stated_cap_keeps_out_after_it_lapses() {
    let server = RedisServer::start();
    let all = replicas(&server, 40 * MS, 6, FallbackPolicy::Share).await;
    let window = Duration::from_secs(4);
    for l in &all {
        bounded(5, l.cap_host(host("a.test"), 2, window))
            .await
            .unwrap();
    }
    server.pause();
    let outage = ALONE_AFTER + Duration::from_secs(4);
    let seen = crawl_giving_up(
        &all,
        &["a.test"],
        outage,
        300 * MS,
        1500 * MS,
        Some((2, window)),
    )
    .await;
    server.resume();
    let seen = seen.host("a.test");
    let most = max_in_flight(&seen);
    assert!(most <= 2, "{most} in flight, the host allows 2: {seen:?}");
    let senders: std::collections::BTreeSet<_> = seen.iter().map(|r| r.replica).collect();
    assert_eq!(senders.len(), 2, "{seen:?}");
}

/// Regression: a request that had found this replica a part of the host's
/// pace (no cap stated yet) and then waited for its turn took a part of a
/// cap the host stated meanwhile even when its part was none (one, at
/// least): each replica's first response here states a cap of 1 among the
/// three, while each replica's next request waits for its turn, and all
/// three sent it. Now only the replica whose part the cap is sends; the
/// others leave the host to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_stated_while_a_request_waits_for_its_turn_is_kept() {
    let server = RedisServer::start();
    let gap = Duration::from_secs(1);
    let all = replicas(&server, gap, 6, FallbackPolicy::Share).await;
    server.pause();
    let recorder = Arc::new(Recorder::new());
    let sends = all.iter().enumerate().map(|(replica, l)| {
        let (l, recorder) = (Arc::clone(l), Arc::clone(&recorder));
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let first = l.acquire_host("t", host("a.test"), Some(deadline)).await;
            let first = first.expect("each replica's first request takes its turn");
            let sent = Instant::now();
            // The next request: admitted in process one gap after the
            // first, it then waits in its share for its turn, two gaps on.
            let next = {
                let l = Arc::clone(&l);
                let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
                tokio::spawn(
                    async move { l.acquire_host("t", host("a.test"), Some(deadline)).await },
                )
            };
            // The first response states the cap while the next waits.
            tokio::time::sleep(1800 * MS).await;
            recorder.record("a.test", replica, sent, Instant::now());
            bounded(5, l.cap_host(host("a.test"), 1, Duration::from_secs(60)))
                .await
                .unwrap();
            drop(first);
            match bounded(10, next).await.unwrap() {
                Ok(permit) => {
                    let sent = Instant::now();
                    tokio::time::sleep(100 * MS).await;
                    recorder.record("a.test", replica, sent, Instant::now());
                    drop(permit);
                    true
                }
                Err(Error::WaitBudget { .. }) => false,
                Err(err) => panic!("the fallback failed: {err:?}"),
            }
        }
    });
    let tasks: Vec<_> = sends.map(tokio::spawn).collect();
    let mut senders = 0;
    for task in tasks {
        senders += usize::from(bounded(30, task).await.unwrap());
    }
    server.resume();
    assert_eq!(
        senders,
        1,
        "the host allows one request among three replicas: {:?}",
        recorder.host("a.test")
    );
}

/// The same for each replica's first request of the outage, which takes
/// its plan and then waits in its share for its turn: only the checks in
/// the share stand between the statement and the send there (a request
/// after the first is checked again by its caller). A cap of 1 among the
/// three, stated while they wait, is the part of one replica only, and no
/// other sends after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_stated_while_the_first_outage_requests_wait_for_their_turns_is_kept() {
    let server = RedisServer::start();
    let all = replicas(&server, Duration::from_secs(1), 6, FallbackPolicy::Share).await;
    server.pause();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let sends: Vec<_> = all
        .iter()
        .map(|l| {
            let l = Arc::clone(l);
            tokio::spawn(async move {
                match l.acquire_host("t", host("a.test"), Some(deadline)).await {
                    // Held to the end: the host allows one in flight.
                    Ok(permit) => Some((Instant::now(), permit)),
                    Err(Error::WaitBudget { .. }) => None,
                    Err(err) => panic!("the fallback failed: {err:?}"),
                }
            })
        })
        .collect();
    let planned = Instant::now() + Duration::from_secs(10);
    while !all.iter().all(|l| l.is_degraded()) {
        assert!(Instant::now() < planned, "the replicas did not fall back");
        tokio::time::sleep(5 * MS).await;
    }
    // Each waits for its turn (one every 3 s), none yet sent.
    let stated = Instant::now();
    let statements: Vec<_> = all
        .iter()
        .map(|l| {
            let l = Arc::clone(l);
            tokio::spawn(
                async move { l.cap_host(host("a.test"), 1, Duration::from_secs(60)).await },
            )
        })
        .collect();
    for said in statements {
        bounded(5, said).await.unwrap().unwrap();
    }
    let stated_by = Instant::now();
    let mut sent = Vec::new();
    for (replica, task) in sends.into_iter().enumerate() {
        if let Some((at, permit)) = bounded(20, task).await.unwrap() {
            sent.push((replica, at, permit));
        }
    }
    server.resume();
    let before = sent.iter().filter(|(_, at, _)| *at < stated).count();
    let later: Vec<_> = sent
        .iter()
        .filter(|(_, at, _)| *at > stated_by)
        .map(|(replica, at, _)| (replica, at.duration_since(stated)))
        .collect();
    assert!(
        before <= 1,
        "{before} replicas sent before the statement: too late to tell"
    );
    assert!(
        later.len() <= 1,
        "the host allows one request among three replicas; after it said so: {later:?}"
    );
}

/// A replica whose part of a stated cap is none, taking turns for another
/// host (its share is active), takes no turn for this one: it leaves it
/// to the others, and keeps sending to the other host at its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_no_part_of_a_stated_cap_still_takes_turns_elsewhere() {
    let server = RedisServer::start();
    let all = replicas(&server, 40 * MS, 6, FallbackPolicy::Share).await;
    for l in &all {
        bounded(5, l.cap_host(host("a.test"), 2, Duration::from_secs(60)))
            .await
            .unwrap();
    }
    server.pause();
    let seen = crawl(
        &all,
        &["a.test", "b.test"],
        ALONE_AFTER + Duration::from_secs(3),
        300 * MS,
    )
    .await;
    server.resume();
    let (a, b) = (seen.host("a.test"), seen.host("b.test"));
    let senders = |seen: &[_]| -> std::collections::BTreeSet<usize> {
        seen.iter()
            .map(|r: &redislimit_tests::record::Request| r.replica)
            .collect()
    };
    assert_eq!(senders(&a).len(), 2, "two replicas have a part: {a:?}");
    let most = max_in_flight(&a);
    assert!(most <= 2, "{most} in flight, the host allows 2: {a:?}");
    assert_eq!(
        senders(&b).len(),
        REPLICAS,
        "every replica sends to b: {b:?}"
    );
    assert!(max_in_flight(&b) <= 6);
}

/// Regression: each replica sent once per two of its turns, half its
/// share: the turn after a send began a few microseconds before the share
/// let it through, so it waited a whole period for the next. Each replica
/// now sends at (nearly) its whole share, one request per N x `min_delay`.
///
/// A replica whose runtime wakes past its turn's window (10 ms here) on a
/// busy machine rightly waits for its next turn: each stall of the runtime
/// that the probe saw excuses the turns it spans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_sends_at_each_replicas_whole_share() {
    let server = RedisServer::start();
    // A tenth of it (10 ms) is how late into its turn a send may still go.
    let gap = 100 * MS;
    let all = replicas(&server, gap, 6, FallbackPolicy::Share).await;
    let probe = StallProbe::start();
    let seen = crawl_frozen(&server, &all, Duration::from_secs(8), 30 * MS)
        .await
        .host("a.test");
    let period = gap * REPLICAS as u32;
    let stalls = probe.stalls(5 * MS);
    for replica in 0..REPLICAS {
        let sends: Vec<_> = seen.iter().filter(|r| r.replica == replica).collect();
        let (Some(first), Some(last)) = (sends.first(), sends.last()) else {
            panic!("replica {replica} sent nothing: {seen:?}");
        };
        // Sends after its first, against the turns it had in that time:
        // 0.9 of them, less the turns stalls took; and whatever the
        // stalls, well above the half the regression sent.
        let turns = (last.send - first.send).as_micros() / period.as_micros();
        let sent = sends.len() as u128 - 1;
        // The stalls that ended while it was sending, and the turns each
        // spans.
        let excused: u128 = stalls
            .iter()
            .filter(|s| s.woke > first.send && s.woke <= last.send + period)
            .map(|s| 1 + s.late.as_micros() / period.as_micros())
            .sum();
        assert!(
            turns >= 15 && (sent + 1 + excused) * 10 >= turns * 9 && (sent + 1) * 3 >= turns * 2,
            "replica {replica} sent {sent} requests in {turns} of its turns ({:?}); \
             the runtime stalled {excused} turns' worth: {stalls:?}",
            last.send - first.send,
        );
    }
    let peak = max_in_window(&seen, Duration::from_secs(1) - 5 * MS);
    assert!(
        peak <= rate_bound(gap),
        "{peak} sends in 1 s, more than the rate of one every {gap:?}"
    );
}

/// Regression: the request taking its turn is the circuit's probe of a
/// frozen Redis, and it waited for the call past its turn's window, so
/// the turn was lost. With the replicas' period over the probe's second,
/// most turns probed (3 sends in five turns). The
/// probe now gives up when the turn's window ends, and the request goes in
/// its turn: from the fleet's first send in the outage to its last, each
/// replica uses all its turns but one at most (on a busy machine the outage
/// may be noticed late, so what is judged is the turns once sending began,
/// not a count of sends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_in_a_turn_does_not_cost_the_turn() {
    let server = RedisServer::start();
    // A 1.2 s period: a second after each probe, the next turn probes.
    let gap = 400 * MS;
    let all = replicas(&server, gap, 6, FallbackPolicy::Share).await;
    let probe = StallProbe::start();
    let seen = crawl_frozen(&server, &all, Duration::from_secs(6), 30 * MS)
        .await
        .host("a.test");
    let stalls = probe.stalls(5 * MS);
    for replica in 0..REPLICAS {
        let sends = seen.iter().filter(|r| r.replica == replica).count();
        assert!(
            sends >= 2,
            "replica {replica} sent {sends} requests in the outage: {seen:?}"
        );
    }
    // Turns go round the replicas, one every `gap`: a longer pause
    // between two sends lost the turns of the replicas after the first
    // sender, one per `gap` (a runtime stall of a quarter gap or more in
    // between excuses it). Each replica may lose one turn, as it may
    // probe a Redis that does not answer once at the outage's start; the
    // regression lost two turns in five.
    let mut lost = [0u32; REPLICAS];
    for w in seen.windows(2) {
        let (a, b) = (w[0].send, w[1].send);
        let excused = stalls
            .iter()
            .any(|s| s.woke > a && s.woke <= b + gap && s.late >= gap / 4);
        let turns = ((b - a).as_micros() + gap.as_micros() / 2) / gap.as_micros();
        if excused || turns < 2 {
            continue;
        }
        for k in 1..turns as usize {
            lost[(w[0].replica + k) % REPLICAS] += 1;
        }
    }
    assert!(
        lost.iter().all(|&n| n <= 1),
        "turns lost per replica: {lost:?}; stalls: {stalls:?}; {seen:?}"
    );
    assert!(min_send_gap(&seen) >= gap * 9 / 10, "{seen:?}");
}

/// Regression: a request taking its turn during an outage waits for the
/// primary only until its turn's window ends. Once Redis was back but
/// slower to answer than that window, every answer came too late to end
/// the outage, and the replicas stayed on their shares for good. An answer
/// that comes after the turn now ends it: with one replica gone quiet, the
/// two left go back to the whole shared cap of requests in flight, which
/// their shares (a third each) could not reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_leave_their_shares_when_redis_answers_slowly() {
    let server = RedisServer::start();
    let proxy = StallProxy::start(server.addr()).await;
    let url = proxy.url();
    // A turn's window is 2 ms; Redis answers in 12-15 ms.
    let gap = 20 * MS;
    let all = replicas_at(&[&url, &url, &url], gap, 6, FallbackPolicy::Share).await;
    proxy.stall();
    drop(crawl(&all, &["a.test"], ALONE_AFTER + 1000 * MS, 600 * MS).await);
    proxy.delay_replies(12 * MS, 15 * MS);
    let seen = crawl(&all[..2], &["a.test"], Duration::from_secs(7), 600 * MS)
        .await
        .host("a.test");
    proxy.resume();
    let last = seen
        .iter()
        .map(|r| r.send)
        .max()
        .expect("sends after the outage");
    let late: Vec<_> = seen
        .iter()
        .filter(|r| r.send + Duration::from_secs(3) > last)
        .cloned()
        .collect();
    // Two shares of a cap of six: four; the whole cap: six.
    assert!(
        max_in_flight(&late) >= 5,
        "at most {} in flight in the last 3 s: the replicas did not leave their shares",
        max_in_flight(&late)
    );
    assert!(max_in_flight(&seen) <= 6);
}

/// With a cap of one request (serialized mode), sharing cannot divide it:
/// one replica serves the host, exactly as Redis would have paced it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_divided_is_partitioned() {
    for policy in [FallbackPolicy::Share, FallbackPolicy::Partition] {
        let server = RedisServer::start();
        let gap = 100 * MS;
        let all = replicas(&server, gap, 0, policy).await;
        let seen = crawl_frozen(&server, &all, Duration::from_secs(2), 30 * MS)
            .await
            .host("a.test");
        assert!(
            seen.len() >= 5,
            "{policy:?}: too few sends to judge: {seen:?}"
        );
        let senders: std::collections::BTreeSet<_> = seen.iter().map(|r| r.replica).collect();
        assert_eq!(
            senders.len(),
            1,
            "{policy:?}: more than one replica served the host"
        );
        assert_serialized(&seen, gap - 5 * MS);
    }
}

/// `Full` is today's behaviour: the test shows the excess it allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_lets_every_replica_send_at_the_whole_rate() {
    let server = RedisServer::start();
    let gap = 150 * MS;
    let all = replicas(&server, gap, 6, FallbackPolicy::Full).await;
    let seen = crawl_frozen(&server, &all, Duration::from_secs(3), 20 * MS)
        .await
        .host("a.test");
    let peak = max_in_window(&seen, Duration::from_secs(1));
    assert!(
        peak > 2 * rate_bound(gap),
        "only {peak} sends in 1 s: Full should let 3 replicas exceed the rate"
    );
}

/// Regression: a request admitted in-process during an outage was
/// invisible to Redis when it came back; another replica was admitted
/// through Redis beside it. Now it counts in Redis (as a lease, or as the
/// serialized holder) before it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_during_the_outage_counts_once_redis_is_back() {
    for cap in [0u32, 1] {
        let server = RedisServer::start();
        let make = || {
            limiter(
                standalone(&server.url()),
                |p| p.min_delay(10 * MS),
                |b| {
                    b.cluster_concurrency(cap)
                        .fallback_policy(FallbackPolicy::Full)
                },
            )
        };
        let a = make().with_fallback();
        let b = make();
        drop(
            bounded(5, b.acquire_host("t", host("warm.test"), None))
                .await
                .unwrap(),
        );
        server.pause();
        let held = bounded(5, a.acquire_host("t", host("long.test"), None))
            .await
            .unwrap();
        let sent = Instant::now();
        tokio::time::sleep(300 * MS).await;
        server.resume();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let waiting = tokio::spawn(async move {
            let permit = bounded(10, b.acquire_host("t", host("long.test"), None))
                .await
                .unwrap();
            (Instant::now(), permit)
        });
        tokio::time::sleep(Duration::from_millis(3000) - sent.elapsed()).await;
        let released = Instant::now();
        drop(held);
        let (admitted, permit) = bounded(10, waiting).await.unwrap();
        drop(permit);
        assert!(
            admitted >= released,
            "cap {cap}: another replica was admitted {:?} before the request \
             sent during the outage ended",
            released - admitted
        );
    }
}

/// Regression: Redis came back (empty, after a restart) while the replica
/// that served a host during the outage had a request in flight there and
/// had not noticed yet (its circuit probes once a second); a replica that
/// had deferred the host asked Redis, which knew nothing of that request,
/// and was admitted beside it. Now a replica's first admission for a host
/// it deferred waits until the serving replica has noticed Redis and told
/// it what it sent (or until that no longer matters).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_back_empty_does_not_admit_beside_the_outage_owner() {
    let server = RedisServer::start();
    let gap = 100 * MS;
    let all = replicas(&server, gap, 0, FallbackPolicy::Partition).await;
    server.kill();
    // The replicas send on their own once the others would know.
    tokio::time::sleep(ALONE_AFTER).await;
    // A host the first replica serves during the outage, which the second
    // defers.
    let soon = || Some(tokio::time::Instant::now() + Duration::from_millis(300));
    let mut owned = None;
    for i in 0..32 {
        let name = format!("h{i}.restart.test");
        if let Ok(permit) = all[0].acquire_host("t", host(&name), soon()).await {
            drop(permit);
            let deferred = all[1].acquire_host("t", host(&name), soon()).await;
            assert!(
                matches!(deferred, Err(Error::WaitBudget { .. })),
                "{name}: served by two replicas during the outage: {deferred:?}"
            );
            owned = Some(name);
            break;
        }
    }
    let name = owned.expect("the first replica serves one of 32 hosts");
    // Every circuit is due for its probe; the owner's fails now, so it
    // will not notice Redis for a second, and sends in-process.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let recorder = Arc::new(Recorder::new());
    let permit = bounded(5, all[0].acquire_host("t", host(&name), None))
        .await
        .unwrap();
    let sent = Instant::now();
    let (rec, hold_name) = (Arc::clone(&recorder), name.clone());
    let owner = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        rec.record(&hold_name, 0, sent, Instant::now());
        drop(permit);
    });
    server.restart();
    // The deferring replica notices Redis first (its heartbeat could).
    bounded(5, all[1].primary().ping()).await.unwrap();
    let permit = bounded(10, all[1].acquire_host("t", host(&name), None))
        .await
        .unwrap();
    let sent = Instant::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    recorder.record(&name, 1, sent, Instant::now());
    drop(permit);
    owner.await.unwrap();
    let mut seen = recorder.host(&name);
    seen.sort_by_key(|r| r.send);
    assert_serialized(&seen, gap - 5 * MS);
}

/// Regression: one replica alone lost Redis (its connection stalled; the
/// others still reached it) and paced at its share in-process while the
/// others went on at the whole limit through Redis: sends 9-25 ms apart
/// against a gap of 130 ms. Now its entry in the registry lapses, the
/// others keep its share and its turns free, and it sends on its own only
/// once they know.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_cut_off_alone_keeps_the_shared_limit() {
    let server = RedisServer::start();
    let proxy = StallProxy::start(server.addr()).await;
    let (url, cut) = (server.url(), proxy.url());
    let gap = 150 * MS;
    let all = replicas_at(&[&url, &url, &cut], gap, 6, FallbackPolicy::Share).await;
    proxy.stall();
    let seen = crawl(&all, &["a.test"], Duration::from_secs(6), 20 * MS).await;
    proxy.resume();
    let mut seen = seen.host("a.test");
    seen.sort_by_key(|r| r.send);
    let alone = seen.iter().filter(|r| r.replica == 2).count();
    assert!(alone >= 2, "the cut-off replica kept working: {seen:?}");
    assert!(
        seen.iter().filter(|r| r.replica != 2).count() >= 10,
        "the others kept working: {seen:?}"
    );
    assert_gap_and_rate(&seen, gap);
    assert!(max_in_flight(&seen) <= 6);
}

/// Regression: a replica started while another was cut off alone. The
/// cut-off replica planned its outage from the roster it last read (three
/// replicas: turns one in three), the others planned for it from the
/// roster they read now, which named the newcomer (four: they kept one
/// turn in four free), and three of its four turns fell among theirs:
/// sends 15 µs apart. Now they plan for it from the replicas registered
/// before its last renewal, which read them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_while_another_is_cut_off_keeps_the_shared_limit() {
    roster_changes_while_one_is_cut_off(true).await;
}

/// Regression: the same with a replica that left (closed) while another
/// was cut off alone: the cut-off replica still counted it (turns one in
/// four), the others no longer did (one in three). Now the registry keeps
/// the departure, and they plan for the cut-off replica with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_leaving_while_another_is_cut_off_keeps_the_shared_limit() {
    roster_changes_while_one_is_cut_off(false).await;
}

/// Replicas on Redis, and the third cut off alone (its proxy stalls); once
/// its entry has lapsed and the others read the lapse, a fourth replica
/// starts (`joins`) or the fourth of four closes, and the others read
/// that; then every replica left crawls `a.test` for 3 s (the cut-off
/// replica's turns come every 450 or 600 ms). What an upstream would
/// record keeps the gap and the rate.
async fn roster_changes_while_one_is_cut_off(joins: bool) {
    let server = RedisServer::start();
    let proxy = StallProxy::start(server.addr()).await;
    let (url, cut) = (server.url(), proxy.url());
    let gap = 150 * MS;
    let urls: &[&str] = if joins {
        &[&url, &url, &cut]
    } else {
        &[&url, &url, &cut, &url]
    };
    let mut all = replicas_at(urls, gap, 6, FallbackPolicy::Share).await;
    proxy.stall();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    if joins {
        all.extend(started(&[&url], gap, 6, FallbackPolicy::Share).await);
        tokio::time::sleep(Duration::from_millis(1600)).await;
    } else {
        let leaver = all.pop().expect("four replicas");
        bounded(5, leaver.close(None)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let seen = crawl(&all, &["a.test"], Duration::from_secs(3), 20 * MS).await;
    proxy.resume();
    let mut seen = seen.host("a.test");
    seen.sort_by_key(|r| r.send);
    for replica in 0..all.len() {
        assert!(
            seen.iter().filter(|r| r.replica == replica).count() >= 2,
            "replica {replica} kept working: {seen:?}"
        );
    }
    assert_gap_and_rate(&seen, gap);
}

/// Regression: with one replica cut off alone, the others kept the whole
/// of a cap the host stated (less nothing for the cut-off replica's
/// part of it, as they do for the configured cap), and the cut-off
/// replica kept its share of the configured cap: 4 in flight where the
/// host allowed 3. Each now leaves the others' parts of it free; 5 does
/// not divide by 3 (parts of 2, 2 and 1), and the parts add up to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_cut_off_alone_keeps_a_cap_the_host_stated() {
    let server = RedisServer::start();
    let proxy = StallProxy::start(server.addr()).await;
    let (url, cut) = (server.url(), proxy.url());
    let all = replicas_at(&[&url, &url, &cut], 40 * MS, 6, FallbackPolicy::Share).await;
    for l in &all {
        bounded(5, l.cap_host(host("a.test"), 5, Duration::from_secs(60)))
            .await
            .unwrap();
    }
    proxy.stall();
    let seen = crawl(&all, &["a.test"], Duration::from_secs(6), 300 * MS).await;
    proxy.resume();
    let seen = seen.host("a.test");
    assert!(
        seen.iter().filter(|r| r.replica == 2).count() >= 2,
        "the cut-off replica kept working: {seen:?}"
    );
    let most = max_in_flight(&seen);
    assert!(most <= 5, "{most} in flight, the host allows 5: {seen:?}");
}

/// Regression: in serialized mode, a replica cut off alone served the hosts
/// it owns during an outage (`Partition`) at the whole rate while the others
/// served them through Redis: overlapping requests, a 1 ms gap. Now the
/// others leave its hosts to it until it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_cut_off_alone_keeps_each_serialized_host() {
    let server = RedisServer::start();
    let proxy = StallProxy::start(server.addr()).await;
    let (url, cut) = (server.url(), proxy.url());
    let gap = 130 * MS;
    let all = replicas_at(&[&url, &url, &cut], gap, 0, FallbackPolicy::Partition).await;
    let names: Vec<String> = (0..24).map(|i| format!("h{i}.cut.test")).collect();
    let hosts: Vec<&str> = names.iter().map(String::as_str).collect();
    proxy.stall();
    // A host served by another replica is given up soon, for the next.
    let seen = crawl_giving_up(
        &all,
        &hosts,
        Duration::from_secs(6),
        30 * MS,
        300 * MS,
        None,
    )
    .await;
    proxy.resume();
    assert!(
        seen.all().iter().any(|r| r.replica == 2),
        "the cut-off replica served none of 24 hosts"
    );
    for name in &hosts {
        let mut host = seen.host(name);
        host.sort_by_key(|r| r.send);
        assert_serialized(&host, gap - 5 * MS);
    }
}

//! Failovers mid-crawl: the Redis master holding the hosts' keys is killed
//! (SIGKILL) and its replica promoted, by Redis Cluster itself or by a
//! Sentinel, while three replicas crawl in lease mode. Judged from what the
//! upstream saw: every URL reaches it exactly once, the limits hold as far
//! as the docs promise through the outage, and once the new master answers
//! the replicas share one pace again, through it.
//!
//! The bounds asserted, per host, and where they are promised:
//!
//! - the whole run: at most one send per `min_delay` over any second,
//!   across replicas (README, "Share it between replicas": with `Share`, the
//!   default, all replicas together stay "within the rate, quota and cap"
//!   during an outage; invariant 2 of docs/DESIGN.md outside it), and each
//!   replica's own sends at least `min_delay` apart (README: "acquires that
//!   fail over together go out one `min_delay` apart ... and the same holds
//!   when Redis comes back");
//! - in flight: at most `cluster_concurrency` among the requests sent
//!   before the kill (arriving up to `SLACK` after it: admitted before it),
//!   and at most that among those sent after it, but not
//!   both groups together: `FallbackPolicy` says the limits "hold from the
//!   first send of the outage on: a request another replica had in flight
//!   when Redis went away is not visible to the others". For a host whose
//!   keys a surviving Cluster master holds, Redis does not go away at one
//!   instant: each replica's circuit (one per limiter, not per node) opens
//!   when its own call to the dead master fails and closes at its next
//!   answer from a live one, so its outages start at moments the upstream
//!   cannot see, and only the requests sent before the kill are checked;
//! - for `JUDGED` from `RECOVERY` after the promotion (a replica whose
//!   circuit is open asks Redis again once a second, then keeps taking its
//!   turns of the outage's share for a grace of 1.5 s): invariant 2 across
//!   replicas, sends at least `min_delay` apart and at most
//!   `cluster_concurrency` in flight, sent by more than one replica.
//!
//! Sends are spaced where Redis admits them; the upstream sees them after
//! the answer travels back and the request goes out. A pair the upstream
//! saw closer than `min_delay` (less [`SLACK`]) that the crawl itself
//! stamped far enough apart when it sent them was delayed on its way, and
//! is not counted (see `too_close`).
//!
//! The new master is also asked directly: while the crawl goes on after
//! the recovery, it holds each host's next allowed send, booked after its
//! promotion, and every replica runs the host's scripts on it (`MONITOR`).
//!
//! The Cluster replicas are `crawl` processes. The crawl's command line
//! takes no Sentinel, so the Sentinel replicas are the crawl's own
//! `Crawler` and pacing flags with a limiter built as the crawl builds it
//! through `RedisPool::sentinel`, each on a thread and runtime of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use redislimit::{FallbackPolicy, Limiter, RedisLimiter, RedisPool, RedisTimeouts};
use redislimit_crawl::{Args, Crawler, Fetched};
use redislimit_tests::keys::HostKeys;
use redislimit_tests::record::{Request, max_in_flight, max_in_window};
use redislimit_tests::{RedisCluster, RedisSentinel, RedisServer, Upstream};

use crate::{RESOLVED, SLACK, finish, spawn_all, tempdir, urls};

/// The shared gap per host.
const GAP: Duration = Duration::from_millis(100);

/// Requests in flight per host across replicas (lease mode).
const CAP: usize = 3;

/// Crawl replicas; as many as `CAP`, so that the default fallback
/// (`Share`) divides the cap among them rather than partitioning the hosts.
const REPLICAS: usize = 3;

/// How long a lease lives without release or renewal (`--lease-ttl`).
const LEASE_TTL: Duration = Duration::from_secs(2);

/// The pacing every replica runs with: `GAP`, two in flight per host in a
/// process (so three replicas could reach six and the shared `CAP` binds),
/// and `LEASE_TTL`.
const PACING: [&str; 8] = [
    "--min-delay",
    "100ms",
    "--max-concurrent",
    "2",
    "--cluster-concurrency",
    "3",
    "--lease-ttl",
    "2s",
];

/// A body of four chunks 100 ms apart: about 400 ms in flight, so at one
/// send per `GAP` the cap is reached.
const PATH: &str = "/slow?chunks=4&every=100";

/// URLs per host: about 15 s of crawling (the cap allows some 7 a second,
/// the outage's shares fewer), past the warm-up, the failover, the
/// recovery and the window judged after it.
const PER_HOST: usize = 100;

/// How long after the start the master is killed: two heartbeats after
/// the last replica started, so each has read every other's registry entry
/// (the outage's shares are divided by what it read).
const WARM_UP: Duration = Duration::from_millis(2500);

/// How long a killed master goes unanswered before it is taken for down
/// (`cluster-node-timeout`, `down-after-milliseconds`): longer than the
/// 2.5 s in which replicas that lost Redis send nothing (until the others
/// would know, see docs/DESIGN.md, "Partial outages"), so that the crawl's
/// fallback has a second or two before the promotion.
const DOWN_AFTER_MS: u64 = 3500;

/// The longest the promotion may take: `cluster-node-timeout` or
/// `down-after-milliseconds` ([`DOWN_AFTER_MS`]), then the election, on a loaded machine.
const PROMOTION_TIMEOUT: Duration = Duration::from_secs(20);

/// From the promotion until sharing is judged: a replica whose circuit is
/// open asks Redis again once a second, and for 1.5 s after its first
/// answer it still takes its turns of the outage's share; then the
/// requests in flight (400 ms) end.
const RECOVERY: Duration = Duration::from_millis(3000);

/// How long after `RECOVERY` the shared pace is judged.
const JUDGED: Duration = Duration::from_secs(3);

/// How long the new master's commands are watched.
const WATCH: Duration = Duration::from_millis(1500);

/// The most sends per host the shared pace allows in any second.
const PER_SECOND: usize = 10;

/// When the failover happened, on the test's clock.
#[derive(Debug, Clone, Copy)]
struct Failover {
    /// When the master was killed.
    killed: Instant,
    /// When every node (or the Sentinel) reported its replica promoted.
    promoted: Instant,
}

impl Failover {
    /// From when the shared pace is judged again.
    fn recovered(&self) -> Instant {
        self.promoted + RECOVERY
    }
}

/// The keys of `host` the crawl paces with (default prefix and scope).
fn keys_of(host: &str) -> HostKeys {
    HostKeys::of("domain", host)
}

/// Microseconds on `node`'s clock (`TIME`).
fn redis_now_us(node: &RedisServer) -> u64 {
    let reply = node.query(&["TIME"]);
    let parts = reply.as_array().expect("TIME answers an array");
    let field = |i: usize| -> u64 { parts[i].as_str().unwrap().parse().unwrap() };
    field(0) * 1_000_000 + field(1)
}

/// The next allowed send in `host`'s gate on `node` (µs on its clock), if
/// it holds one.
fn gate_next(node: &RedisServer, host: &str) -> Option<u64> {
    node.query(&["HGET", &keys_of(host).gate, "next"])
        .as_str()
        .and_then(|v| v.parse().ok())
}

/// Runs blocking harness code (polling servers) without stalling the
/// runtime that serves the upstream.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Every command `node` runs for `how_long` (`MONITOR`), one line each:
/// `<time> [<db> <client address>] "<command>" "<arg>" ...`.
fn monitor(node: &RedisServer, how_long: Duration) -> Vec<String> {
    let deadline = Instant::now() + how_long;
    let mut stream = TcpStream::connect_timeout(&node.addr(), Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("cannot connect to {} to monitor it: {e}", node.addr()));
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    stream.write_all(b"*1\r\n$7\r\nMONITOR\r\n").unwrap();
    let mut reader = BufReader::new(stream);
    let mut lines = Vec::new();
    let mut line = String::new();
    while Instant::now() < deadline {
        match reader.read_line(&mut line) {
            Ok(0) => panic!("{} closed the MONITOR connection", node.addr()),
            Ok(_) if line.ends_with('\n') => lines.push(std::mem::take(&mut line)),
            Ok(_) => {}
            // A read timeout keeps what was read in `line`.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("monitoring {} failed: {e}", node.addr()),
        }
    }
    lines
}

/// The client connections that ran a script on `host`'s keys, in the lines
/// of [`monitor`].
fn scripting_clients(lines: &[String], host: &str) -> BTreeSet<String> {
    let gate = format!("\"{}\"", keys_of(host).gate);
    lines
        .iter()
        .filter(|line| {
            (line.contains("\"FCALL\"") || line.contains("\"EVALSHA\"")) && line.contains(&gate)
        })
        .filter_map(|line| {
            let inside = line.split_once('[')?.1.split_once(']')?.0;
            Some(inside.split_once(' ')?.1.to_owned())
        })
        .collect()
}

/// While the crawl goes on after the recovery: `node`, the new master,
/// holds each of `hosts`' next allowed send, booked after its promotion (at
/// `promoted_us` on its clock), and at least one connection per replica
/// runs the hosts' scripts on it.
fn assert_shared_through(node: &RedisServer, hosts: &[&str], promoted_us: u64) {
    let lines = monitor(node, WATCH);
    for host in hosts {
        let next = gate_next(node, host);
        assert!(
            next.is_some_and(|next| next > promoted_us),
            "{host}: the new master {} holds no booking made after its promotion \
             (next allowed send {next:?}, promoted at {promoted_us} µs)",
            node.addr()
        );
        let clients = scripting_clients(&lines, host);
        assert!(
            clients.len() >= REPLICAS,
            "{host}: within {WATCH:?} only {clients:?} ran its scripts on the new master {}, \
             {REPLICAS} replicas crawl it",
            node.addr()
        );
    }
}

/// Milliseconds from `mark` to `at`, negative before it.
fn ms_from(mark: Instant, at: Instant) -> i64 {
    if at >= mark {
        (at - mark).as_millis() as i64
    } else {
        -((mark - at).as_millis() as i64)
    }
}

/// `reqs` as `<ms from the kill>+<ms in flight>@<replica>`, for failure
/// messages.
fn rows<'a>(reqs: impl IntoIterator<Item = &'a Request>, killed: Instant) -> String {
    reqs.into_iter()
        .map(|r| {
            format!(
                "{}+{}@{}",
                ms_from(killed, r.send),
                (r.end - r.send).as_millis(),
                r.replica
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// When each request left its crawl replica (Unix ms, stamped by the crawl
/// once admitted), by host and path with query, as the upstream records
/// requests.
type Stamps = BTreeMap<(String, String), u64>;

/// The crawl's stamps from (URL, `start_ms`) pairs of its report.
fn stamps<'a>(lines: impl IntoIterator<Item = (&'a str, u64)>) -> Stamps {
    lines
        .into_iter()
        .filter_map(|(url, start)| {
            let url = url::Url::parse(url).ok()?;
            let path = format!("{}?{}", url.path(), url.query().unwrap_or(""));
            Some(((url.host_str()?.to_owned(), path), start))
        })
        .collect()
}

/// The crawl's stamp of `r`, if it reported one.
fn stamp_of(stamps: &Stamps, r: &Request) -> Option<u64> {
    stamps.get(&(r.host.clone(), r.path.clone())).copied()
}

/// The consecutive sends of `reqs` that arrived closer than `GAP` less
/// [`SLACK`] and that the crawl also stamped closer than that (its stamps
/// are whole milliseconds: 1 ms closer still), each described: sends let
/// out too early. A pair the crawl sent far enough apart but that arrived
/// closer (by at most three slacks more) was delayed on its way to the
/// upstream.
fn too_close(reqs: &[Request], stamps: &Stamps, killed: Instant) -> Vec<String> {
    let least_ms = GAP.saturating_sub(SLACK).as_millis() as i64;
    reqs.windows(2)
        .filter(|pair| pair[1].send - pair[0].send + SLACK < GAP)
        .filter_map(|pair| {
            let stamped = match (stamp_of(stamps, &pair[0]), stamp_of(stamps, &pair[1])) {
                (Some(a), Some(b)) => Some(b as i64 - a as i64),
                _ => None,
            };
            // A delay on the way excuses a few milliseconds more than the slack, not a
            // burst: closer than the gap less four slacks is too close whatever the
            // crawl stamped.
            let arrived = pair[1].send - pair[0].send;
            if arrived + 4 * SLACK >= GAP && stamped.is_some_and(|apart| apart + 1 >= least_ms) {
                return None;
            }
            Some(format!(
                "{:?} apart ({}), stamped {stamped:?} ms apart",
                pair[1].send - pair[0].send,
                rows(pair, killed)
            ))
        })
        .collect()
}

/// The most sends of `reqs` in any second (less twice [`SLACK`] for where
/// the upstream stamps arrivals); when the upstream saw more than the pace
/// allows, the smaller of that and the most the crawl stamped in such a
/// window (requests delayed on their way arrive bunched).
fn busiest_second(reqs: &[Request], stamps: &Stamps) -> usize {
    let window = Duration::from_secs(1) - 2 * SLACK;
    let seen = max_in_window(reqs, window);
    if seen <= PER_SECOND {
        return seen;
    }
    let mut sent: Vec<u64> = reqs
        .iter()
        .map(|r| stamp_of(stamps, r).unwrap_or(0))
        .collect();
    sent.sort_unstable();
    let window_ms = window.as_millis() as u64 - 1;
    let stamped = sent
        .iter()
        .map(|&s| {
            sent.iter()
                .filter(|&&o| o >= s && o < s + window_ms)
                .count()
        })
        .max()
        .unwrap_or(0);
    seen.min(stamped)
}

/// The requests of `reqs` in flight together when most were, for failure
/// messages.
fn peak(reqs: &[Request], killed: Instant) -> String {
    let together = |r: &Request| -> Vec<&Request> {
        reqs.iter()
            .filter(|o| o.send <= r.send && o.end > r.send)
            .collect()
    };
    reqs.iter()
        .map(together)
        .max_by_key(Vec::len)
        .map_or_else(String::new, |most| rows(most, killed))
}

/// Every URL of `list` reached the upstream exactly once, and nothing else
/// did.
fn assert_each_url_seen_once(seen: &[Request], list: &[String]) {
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for r in seen {
        *count.entry(format!("{}{}", r.host, r.path)).or_default() += 1;
    }
    for url in list {
        let url = url::Url::parse(url).unwrap();
        let key = format!(
            "{}{}?{}",
            url.host_str().unwrap(),
            url.path(),
            url.query().unwrap_or("")
        );
        let times = count.get(&key);
        assert_eq!(
            times,
            Some(&1),
            "{key} reached the upstream {times:?} times"
        );
    }
    assert_eq!(
        seen.len(),
        list.len(),
        "the upstream saw requests not asked for"
    );
}

/// The bounds of the module's documentation, per host of `hosts`, on the
/// upstream's record `seen`; `failed` are the hosts whose keys the killed
/// master held. Every breach is collected, then the check fails naming
/// them all with every host's requests. Returns how many requests to each
/// host were judged after the recovery.
fn assert_bounds(
    seen: &[Request],
    stamps: &Stamps,
    hosts: &[&str],
    failed: &[&str],
    failover: Failover,
) -> Vec<usize> {
    let Failover { killed, .. } = failover;
    let (recovered, judged_until) = (failover.recovered(), failover.recovered() + JUDGED);
    let mut breaches = Vec::new();
    let mut judged = Vec::new();
    for &host in hosts {
        let reqs: Vec<Request> = seen.iter().filter(|r| r.host == host).cloned().collect();
        let mut breach = |what: String| breaches.push(format!("{host}: {what}"));

        let rate = busiest_second(&reqs, stamps);
        if rate > PER_SECOND {
            breach(format!("{rate} sends in 1 s, more than one per {GAP:?}"));
        }

        // A request Redis admitted just before the kill reaches the upstream just
        // after it (the answer travels back, the request goes out): one that arrives
        // within the slack of the kill counts as sent before it.
        let (before, after_kill): (Vec<Request>, Vec<Request>) =
            reqs.iter().cloned().partition(|r| r.send < killed + SLACK);
        let mut groups = vec![(before, "sent before the kill")];
        if failed.contains(&host) {
            groups.push((after_kill, "sent after the kill"));
        }
        for (group, name) in &groups {
            let most = max_in_flight(group);
            if most > CAP {
                breach(format!(
                    "{most} in flight among the requests {name}, the cap is {CAP}: {}",
                    peak(group, killed)
                ));
            }
        }

        let mut by_replica: BTreeMap<usize, Vec<Request>> = BTreeMap::new();
        for r in &reqs {
            by_replica.entry(r.replica).or_default().push(r.clone());
        }
        for (replica, own) in &by_replica {
            let close = too_close(own, stamps, killed);
            if !close.is_empty() {
                breach(format!(
                    "replica {replica} sent requests closer than min_delay {GAP:?}: {close:?}"
                ));
            }
        }

        let after: Vec<Request> = reqs
            .iter()
            .filter(|r| r.send >= recovered && r.send < judged_until)
            .cloned()
            .collect();
        let close = too_close(&after, stamps, killed);
        if !close.is_empty() {
            breach(format!(
                "after the recovery, sends closer than min_delay {GAP:?} across replicas: \
                 {close:?}"
            ));
        }
        let most = max_in_flight(&after);
        if most > CAP {
            breach(format!(
                "after the recovery, {most} in flight across replicas, the cap is {CAP}: {}",
                peak(&after, killed)
            ));
        }
        let senders: BTreeSet<usize> = after.iter().map(|r| r.replica).collect();
        if senders.len() < 2 {
            breach(format!(
                "after the recovery only replicas {senders:?} sent: nothing shared to judge"
            ));
        }
        judged.push(after.len());
    }
    if !breaches.is_empty() {
        let all: Vec<String> = hosts
            .iter()
            .map(|&host| {
                let reqs = seen.iter().filter(|r| r.host == host);
                format!("{host}: {}", rows(reqs, killed))
            })
            .collect();
        panic!(
            "{} breaches; promoted {} ms after the kill, judged from {} to {} ms:\n{}\n\
             requests as <ms from the kill>+<ms in flight>@<replica>:\n{}",
            breaches.len(),
            ms_from(killed, failover.promoted),
            ms_from(killed, recovered),
            ms_from(killed, judged_until),
            breaches.join("\n"),
            all.join("\n")
        );
    }
    judged
}

/// What the upstream saw of a crawl through a failover: every URL exactly
/// once, requests to the `failed` hosts while the master was down (the
/// crawl went on), and the bounds of [`assert_bounds`] with enough
/// requests after the recovery to judge them.
fn judge(
    seen: &[Request],
    stamps: &Stamps,
    list: &[String],
    hosts: &[&str],
    failed: &[&str],
    failover: Failover,
) {
    assert_each_url_seen_once(seen, list);
    let outage = seen
        .iter()
        .filter(|r| r.send >= failover.killed && r.send < failover.promoted)
        .filter(|r| failed.contains(&r.host.as_str()))
        .count();
    assert!(
        outage >= 5,
        "only {outage} requests to {failed:?} while their master was down ({:?}): the crawl \
         did not go on",
        failover.promoted - failover.killed
    );
    let judged = assert_bounds(seen, stamps, hosts, failed, failover);
    assert!(
        judged.iter().all(|&n| n >= 10),
        "too few requests after the recovery to judge the shared pace: {judged:?} for {hosts:?}"
    );
}

/// The names of `RESOLVED` whose keys `master` of `cluster` holds, and the
/// first whose keys it does not.
fn split_hosts(cluster: &RedisCluster, master: &RedisServer) -> (Vec<&'static str>, &'static str) {
    let (on, off): (Vec<&str>, Vec<&str>) = RESOLVED
        .iter()
        .copied()
        .partition(|host| cluster.master_of(&keys_of(host).gate).port() == master.port());
    (on, off[0])
}

/// Three crawl processes pace two hosts whose keys live on one master of a
/// Redis Cluster with a replica per master, and a third host whose keys
/// another master holds. The first master is killed (SIGKILL) mid-crawl;
/// the cluster promotes its replica; the crawl goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_killed_mid_crawl_fails_over_and_sharing_resumes() {
    let _turn = crate::one_at_a_time().await;
    let cluster = blocking(|| RedisCluster::start_with_replicas_timeout(DOWN_AFTER_MS));
    let victim = cluster.master_of(&keys_of("a.test").gate);
    let heir = cluster
        .replica_of(victim)
        .expect("every master has a replica");
    let (on_victim, elsewhere) = split_hosts(&cluster, victim);
    assert!(
        on_victim.len() >= 2,
        "fewer than two test hosts' keys on {}: {on_victim:?}",
        victim.addr()
    );
    let failed = [on_victim[0], on_victim[1]];
    let hosts = [failed[0], failed[1], elsewhere];

    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = urls(&upstream, &hosts, PER_HOST, PATH);
    let mut args: Vec<String> = PACING.iter().map(|a| (*a).to_owned()).collect();
    for url in cluster.urls() {
        args.extend(["--redis-cluster".to_owned(), url]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let replicas = spawn_all(dir.path(), &upstream, &list, REPLICAS, &args);

    tokio::time::sleep(WARM_UP).await;
    for host in failed {
        assert!(
            blocking(|| gate_next(victim, host)).is_some(),
            "{host}: the master about to be killed ({}) holds no pacing state for it",
            victim.addr()
        );
    }
    let killed = Instant::now();
    victim.kill();
    blocking(|| cluster.wait_master(heir, PROMOTION_TIMEOUT));
    let failover = Failover {
        killed,
        promoted: Instant::now(),
    };
    let promoted_us = blocking(|| redis_now_us(heir));
    assert_eq!(
        cluster.master_of(&keys_of(failed[0]).gate).port(),
        heir.port(),
        "the promoted replica does not serve the failed master's slots"
    );

    tokio::time::sleep_until(failover.recovered().into()).await;
    blocking(|| assert_shared_through(heir, &failed, promoted_us));

    let report = finish(replicas).await;
    for line in &report {
        assert_eq!(line["status"], 200, "a URL did not end with 200: {line}");
    }
    let stamps = stamps(
        report
            .iter()
            .filter_map(|line| Some((line["url"].as_str()?, line["start_ms"].as_u64()?))),
    );
    let seen = upstream.recorder().all();
    judge(&seen, &stamps, &list, &hosts, &failed, failover);
}

/// One crawl replica in this process: the crawl's own [`Crawler`] and
/// pacing flags, its limiter built as the crawl builds it but through
/// `RedisPool::sentinel` (the crawl's command line takes no Sentinel), on
/// a thread and runtime of its own, as a process would have. Returns what
/// became of each URL.
fn sentinel_replica(
    n: usize,
    sentinel_url: String,
    upstream_ip: IpAddr,
    list: Vec<String>,
) -> std::thread::JoinHandle<Vec<Fetched>> {
    let mut argv: Vec<String> = ["crawl", "--concurrency", "8", "--header"]
        .map(str::to_owned)
        .into();
    argv.push(format!("x-replica:{n}"));
    // The flags that need a Redis URL are given to the limiter below.
    argv.extend(PACING[..4].iter().map(|a| (*a).to_owned()));
    for host in RESOLVED {
        argv.extend(["--resolve".to_owned(), format!("{host}:{upstream_ip}")]);
    }
    std::thread::spawn(move || {
        let args = Args::try_parse_from(&argv).expect("crawl arguments");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let (_, policies) = args.policies().unwrap();
            let pool = RedisPool::sentinel(
                &[sentinel_url.as_str()],
                RedisSentinel::MASTER_NAME,
                RedisTimeouts::default(),
            )
            .unwrap();
            let limiter = RedisLimiter::builder(pool, "domain")
                .policies(policies)
                .cluster_concurrency(CAP as u32)
                .lease_ttl(LEASE_TTL)
                .fallback_policy(FallbackPolicy::Share)
                .build()
                .unwrap();
            limiter.ping().await.expect("the Sentinel's master answers");
            limiter.check_config().await.unwrap();
            let limiter: Arc<dyn Limiter> = Arc::new(limiter.with_fallback());
            let crawler = Crawler::new(Arc::clone(&limiter), &args).unwrap();
            let urls: Vec<url::Url> = list.iter().map(|u| u.parse().unwrap()).collect();
            // Bounded like a crawl process (see `finish`), so a stuck replica fails the
            // test instead of hanging it.
            let fetched = tokio::time::timeout(Duration::from_secs(90), crawler.run(urls, false))
                .await
                .expect("a crawl replica did not finish within 90 s")
                .unwrap();
            let close_by = tokio::time::Instant::now() + Duration::from_secs(5);
            limiter.close(Some(close_by)).await.unwrap();
            fetched
        })
    })
}

/// Three crawl replicas pace three hosts in lease mode through a master
/// found by Sentinel. The master is killed (SIGKILL) mid-crawl; the
/// Sentinel promotes its replica; the crawl goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_master_killed_mid_crawl_fails_over_and_sharing_resumes() {
    let _turn = crate::one_at_a_time().await;
    let set = blocking(|| RedisSentinel::start_down_after(DOWN_AFTER_MS));
    let (master, heir) = (set.master(), set.replica());
    let hosts = crate::HOSTS;
    let upstream = Upstream::start().await;
    let list = urls(&upstream, &hosts, PER_HOST, PATH);
    let hands = crate::deal(&list, REPLICAS);
    let replicas: Vec<_> = hands
        .iter()
        .enumerate()
        .map(|(n, hand)| {
            sentinel_replica(n, set.sentinel().url(), upstream.addr().ip(), hand.clone())
        })
        .collect();

    tokio::time::sleep(WARM_UP).await;
    for host in hosts {
        assert!(
            blocking(|| gate_next(master, host)).is_some(),
            "{host}: the master about to be killed ({}) holds no pacing state for it",
            master.addr()
        );
    }
    let killed = Instant::now();
    master.kill();
    blocking(|| set.wait_for_master(heir.addr(), PROMOTION_TIMEOUT));
    let failover = Failover {
        killed,
        promoted: Instant::now(),
    };
    let promoted_us = blocking(|| redis_now_us(heir));

    tokio::time::sleep_until(failover.recovered().into()).await;
    blocking(|| assert_shared_through(heir, &hosts, promoted_us));

    let mut fetched = Vec::new();
    for (replica, hand) in replicas.into_iter().zip(&hands) {
        let theirs = blocking(|| replica.join()).expect("a crawl replica panicked");
        assert_eq!(theirs.len(), hand.len(), "a replica did not end every URL");
        fetched.extend(theirs);
    }
    let mut ended: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &fetched {
        assert_eq!(f.status, Some(200), "{} ended so: {f:?}", f.url);
        *ended.entry(&f.url).or_default() += 1;
    }
    for url in &list {
        let times = ended.get(url.as_str());
        assert_eq!(times, Some(&1), "{url} ended {times:?} times");
    }
    let stamps = stamps(fetched.iter().map(|f| (f.url.as_str(), f.start_ms)));
    let seen = upstream.recorder().all();
    judge(&seen, &stamps, &list, &hosts, &hosts, failover);
}

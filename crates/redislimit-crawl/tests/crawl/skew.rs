//! Clock skew: replicas whose wall clocks are wrong, one an hour ahead and
//! one a minute behind, crawl alongside two replicas whose clocks are
//! right, and the invariants of lease and serialized mode hold at the
//! upstream, as does the lease of a skewed replica killed mid-request,
//! because Redis's clock (`TIME` inside the scripts) decides, not the
//! replicas'. A replica alone at 30 s or an hour behind, or an hour ahead,
//! keeps its pace too: the lateness of its admissions is measured against
//! Redis's clock through Tokio's monotonic one, never its wall clock.
//!
//! The wrong clocks come from libfaketime (Debian package `faketime`),
//! preloaded into the crawl process with `FAKETIME=+1h` or `FAKETIME=-1m`.
//! Each test reads the crawl's own report, whose `start_ms` and `end_ms`
//! are the process's wall clock, and checks that it is off by the offset,
//! so a libfaketime that silently did nothing fails the test.
//!
//! `FAKETIME_DONT_FAKE_MONOTONIC=1`: only the wall clock is skewed. By
//! default libfaketime also moves `CLOCK_MONOTONIC` to the faked wall
//! time (about 1.8e9 s instead of the seconds since boot). Rust's
//! `Condvar::wait_timeout` and `thread::park_timeout` turn a timeout into
//! an absolute `CLOCK_MONOTONIC` deadline for the `futex` system call,
//! which the kernel reads on its own, unfaked clock: a 200 ms wait then
//! lasts decades. The limiter's timer thread waits that way; tried without
//! this setting, the skewed crawls never finished. A monotonic clock is
//! per machine and means nothing to another one anyway; the skew that
//! replicas on different machines really have is in the wall clock, which
//! is what these tests fake.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redislimit_tests::record::{assert_serialized, max_in_flight, min_send_gap};
use redislimit_tests::{RedisServer, Upstream};

use crate::{HOSTS, MS, Replica, SLACK, deal, finish, read_report, tempdir, urls};

/// A clock an hour ahead: `FAKETIME` and the offset in milliseconds.
const AHEAD: (&str, i64) = ("+1h", 3_600_000);

/// A clock a minute behind.
const BEHIND: (&str, i64) = ("-1m", -60_000);

/// The clocks of the replicas of a mixed run, by replica number: two
/// skewed, two right.
const CLOCKS: [Option<(&str, i64)>; 4] = [Some(AHEAD), Some(BEHIND), None, None];

/// The clocks a replica runs with alone: 30 s and an hour behind, an hour
/// ahead.
const LONE: [(&str, i64); 3] = [("-30s", -30_000), ("-1h", -3_600_000), AHEAD];

/// How far a replica's report may be from the test's clock (plus the
/// offset): the report stamps milliseconds, the test reads its clock
/// before the start and after the end; this only absorbs rounding.
const CLOCK_TOLERANCE_MS: i64 = 1_000;

/// What to install when libfaketime is missing.
const INSTALL_HINT: &str = "install it with `apt-get install faketime` (Debian/Ubuntu), or run \
                            `cargo xtask test`, which installs it";

/// libfaketime's preload library, where Debian (multiarch) and a
/// `make install` put it.
fn libfaketime() -> PathBuf {
    let arch = std::env::consts::ARCH;
    [
        format!("/usr/lib/{arch}-linux-gnu/faketime/libfaketime.so.1"),
        "/usr/lib64/faketime/libfaketime.so.1".to_owned(),
        "/usr/lib/faketime/libfaketime.so.1".to_owned(),
        "/usr/local/lib/faketime/libfaketime.so.1".to_owned(),
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|path| path.is_file())
    .unwrap_or_else(|| panic!("libfaketime.so.1 not found; {INSTALL_HINT}"))
}

/// The test's wall clock, Unix epoch milliseconds.
fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

/// Starts replica `n` as [`crate::spawn`] does, its wall clock skewed by
/// `skew` (a `FAKETIME` offset such as `+1h`) when given.
fn spawn_skewed(
    dir: &Path,
    n: usize,
    upstream: &Upstream,
    urls: &[String],
    extra: &[&str],
    skew: Option<&str>,
) -> Replica {
    let preload = libfaketime();
    let preload = preload.to_str().expect("a UTF-8 path to libfaketime");
    let env: &[(&str, &str)] = match skew {
        Some(skew) => &[
            ("LD_PRELOAD", preload),
            ("FAKETIME", skew),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
        None => &[],
    };
    crate::spawn_with_env(dir, n, upstream, urls, extra, env)
}

/// Every line of each report was stamped by a clock its `offset` (ms) off
/// the test's, between `before` and `after` (the test's clock) shifted by
/// it.
fn assert_clocks(reports: &[(PathBuf, i64)], before: i64, after: i64) {
    for (report, offset) in reports {
        let lines = read_report(report);
        assert!(!lines.is_empty(), "{} is empty", report.display());
        for line in &lines {
            for field in ["start_ms", "end_ms"] {
                let stamped = line[field].as_i64().unwrap();
                let (low, high) = (
                    before + offset - CLOCK_TOLERANCE_MS,
                    after + offset + CLOCK_TOLERANCE_MS,
                );
                assert!(
                    (low..=high).contains(&stamped),
                    "{}: {field} {stamped} is not within [{low}, {high}], the test's clock \
                     from the start to the end shifted by the replica's offset {offset} ms \
                     (give or take {CLOCK_TOLERANCE_MS} ms); did libfaketime take effect? \
                     {line}",
                    report.display(),
                );
            }
        }
    }
}

/// Deals `urls` out to one replica per [`CLOCKS`] entry, runs them with
/// `args` until they finish (every URL ended once), and checks each one's
/// clock; every URL must have been answered `200`.
async fn crawl_with_skewed_clocks(upstream: &Upstream, urls: &[String], args: &[&str]) {
    let dir = tempdir();
    let before = now_ms();
    let replicas: Vec<Replica> = deal(urls, CLOCKS.len())
        .iter()
        .zip(CLOCKS)
        .enumerate()
        .map(|(n, (hand, clock))| {
            spawn_skewed(dir.path(), n, upstream, hand, args, clock.map(|c| c.0))
        })
        .collect();
    let reports: Vec<(PathBuf, i64)> = replicas
        .iter()
        .zip(CLOCKS)
        .map(|(r, clock)| (r.report.clone(), clock.map_or(0, |c| c.1)))
        .collect();
    let lines = finish(replicas).await;
    let after = now_ms();
    assert_clocks(&reports, before, after);
    for line in &lines {
        assert_eq!(line["status"], 200, "{line}");
    }
    let senders: BTreeSet<usize> = upstream
        .recorder()
        .all()
        .iter()
        .map(|r| r.replica)
        .collect();
    assert_eq!(
        senders,
        (0..CLOCKS.len()).collect(),
        "not every replica reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_clocks_keep_the_lease_cap_and_gap() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let hosts = &HOSTS[..2];
    let list = urls(&upstream, hosts, 12, "/slow?chunks=3&every=30");
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        "50ms",
        "--cluster-concurrency",
        "2",
        "--lease-ttl",
        "5s",
    ];
    crawl_with_skewed_clocks(&upstream, &list, &args).await;
    for host in hosts {
        let seen = upstream.recorder().host(host);
        assert_eq!(seen.len(), 12, "{host}");
        let in_flight = max_in_flight(&seen);
        assert!(
            in_flight <= 2,
            "{host}: {in_flight} in flight, the cap is 2"
        );
        let gap = min_send_gap(&seen);
        assert!(gap + SLACK >= 50 * MS, "{host}: sends {gap:?} apart");
    }
}

/// One replica alone, its wall clock 30 s or an hour behind, or an hour
/// ahead: it sends at its pace in lease mode (where a late admission could
/// come too close to the next), every gap kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_replica_with_a_skewed_clock_keeps_its_pace() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    for (n, (skew, offset)) in LONE.into_iter().enumerate() {
        let host = HOSTS[n];
        let list = urls(&upstream, &[host], 12, "/slow?chunks=1&every=20");
        let args = [
            "--redis",
            &server.url(),
            "--min-delay",
            "50ms",
            "--cluster-concurrency",
            "2",
            "--max-concurrent",
            "2",
            "--lease-ttl",
            "5s",
        ];
        let dir = tempdir();
        let before = now_ms();
        let replica = spawn_skewed(dir.path(), 0, &upstream, &list, &args, Some(skew));
        let report = replica.report.clone();
        let lines = finish(vec![replica]).await;
        assert_clocks(&[(report, offset)], before, now_ms());
        for line in &lines {
            assert_eq!(line["status"], 200, "{line}");
        }
        let seen = upstream.recorder().host(host);
        assert_eq!(seen.len(), 12, "{host} at {skew}");
        assert!(max_in_flight(&seen) <= 2, "{host} at {skew}");
        let gap = min_send_gap(&seen);
        assert!(
            gap + SLACK >= 50 * MS,
            "a replica at {skew} sent {host} {gap:?} apart"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_clocks_keep_a_serialized_pace() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let list = urls(&upstream, &HOSTS, 8, "/slow?chunks=2&every=30");
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        "30ms",
        "--max-concurrent",
        "4",
        "--lease-ttl",
        "5s",
    ];
    crawl_with_skewed_clocks(&upstream, &list, &args).await;
    for host in HOSTS {
        let seen = upstream.recorder().host(host);
        assert_eq!(seen.len(), 8, "{host}");
        // Bodies take 60 ms, longer than the gap: only the shared
        // serialization keeps the replicas from overlapping.
        assert_serialized(&seen, 30 * MS);
    }
}

/// A replica killed mid-request leaves its slot booked until the lease
/// runs out on the Redis clock: not at once because its clock is behind,
/// not an hour later because its clock is ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_skewed_replica_frees_its_slot_after_the_lease() {
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
    let doomed_hosts = [("a.test", AHEAD), ("b.test", BEHIND)];
    let before = now_ms();
    let mut doomed: Vec<Replica> = doomed_hosts
        .iter()
        .enumerate()
        .map(|(n, (host, clock))| {
            // A quick URL first, whose report line shows the clock.
            let list = vec![
                upstream.url("c.test", &format!("/quick?i={n}")),
                upstream.url(host, "/slow?chunks=200&every=50"),
            ];
            spawn_skewed(dir.path(), n, &upstream, &list, &args, Some(clock.0))
        })
        .collect();
    let started = Instant::now();
    while upstream.arrivals() < 2 * doomed.len()
        || doomed.iter().any(|r| read_report(&r.report).is_empty())
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the skewed replicas never sent their requests"
        );
        tokio::time::sleep(10 * MS).await;
    }
    for replica in &mut doomed {
        replica.child.start_kill().unwrap(); // SIGKILL, mid-request
        replica.child.wait().await.unwrap();
    }
    let clocks: Vec<(PathBuf, i64)> = doomed
        .iter()
        .zip(doomed_hosts)
        .map(|(r, (_, clock))| (r.report.clone(), clock.1))
        .collect();
    assert_clocks(&clocks, before, now_ms());
    let after: Vec<String> = doomed_hosts
        .iter()
        .map(|(host, _)| upstream.url(host, "/after-crash"))
        .collect();
    let survivor = spawn_skewed(dir.path(), 2, &upstream, &after, &args, None);
    finish(vec![survivor]).await;
    for (host, clock) in doomed_hosts {
        let seen = upstream.recorder().host(host);
        assert_eq!(seen.len(), 2, "{host}");
        let (dead, next) = (&seen[0], &seen[1]);
        assert_eq!(next.path, "/after-crash");
        assert!(
            next.send + SLACK >= dead.send + lease,
            "{host}: the slot of a replica whose clock was {} was taken {:?} after its send, \
             before its lease ran out",
            clock.0,
            next.send - dead.send
        );
    }
}

//! A failover to a replica whose clock runs ahead of its master's. Redis 7
//! replicates a script's effects, so every instant the old master stored (a
//! lease deadline, the gate's `next`, a key's expiry) is an absolute instant
//! of the old master's clock: on the promoted node a dead holder's lease ends
//! early by the skew, and by no more.

use std::path::Path;
use std::time::{Duration, Instant};

use redislimit::{Limiter, RedisLimiter};
use redislimit_tests::RedisServer;
use redislimit_tests::keys::HostKeys;
use redislimit_tests::resp::Reply;

use crate::{MS, bounded, host, limiter, standalone};

/// libfaketime as Debian and Ubuntu install it (package `faketime`).
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The C library, preloaded after libfaketime so that `malloc` and friends
/// are glibc's: Debian's `redis-server` links jemalloc, whose initialisation
/// reads the clock while libfaketime's own initialisation allocates, and the
/// two then recurse into each other until the server hangs (libfaketime
/// issue #130). Preloaded after libfaketime, so that libfaketime still finds
/// the real clock functions as the next definitions.
const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

/// How far the replica's clock runs ahead of the master's.
const SKEW: Duration = Duration::from_secs(2);

/// The lease of the holder that dies.
const LEASE: Duration = Duration::from_secs(6);

/// The spacing between sends.
const GAP: Duration = Duration::from_millis(50);

/// How closely two servers' `TIME` must differ by [`SKEW`]: it bounds a
/// comparison of two clocks read over loopback, one after the other.
const CLOCK_TOLERANCE: Duration = Duration::from_millis(500);

/// Between the system clock the servers read and this process's monotonic
/// clock over a few seconds.
const TOLERANCE: Duration = Duration::from_millis(100);

fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap()
}

/// The server's clock (`TIME`) in microseconds since the epoch.
fn time_us(server: &RedisServer) -> i64 {
    let reply = server.query(&["TIME"]);
    match reply.as_array() {
        Some([secs, micros]) => {
            let field = |r: &Reply| -> i64 { r.as_str().and_then(|t| t.parse().ok()).unwrap() };
            field(secs) * 1_000_000 + field(micros)
        }
        _ => panic!("TIME answered {reply:?}"),
    }
}

/// How far `ahead`'s clock is ahead of `base`'s, in microseconds: `ahead`'s
/// `TIME` against the middle of two reads of `base`'s around it.
fn skew_us(ahead: &RedisServer, base: &RedisServer) -> i64 {
    let first = time_us(base);
    let theirs = time_us(ahead);
    let second = time_us(base);
    theirs - (first + second) / 2
}

/// The members of ZSET `key` with their scores, lowest first.
fn zset(server: &RedisServer, key: &str) -> Vec<(String, i64)> {
    let reply = server.query(&["ZRANGE", key, "0", "-1", "WITHSCORES"]);
    let items = reply
        .as_array()
        .unwrap_or_else(|| panic!("ZRANGE {key} answered {reply:?}"));
    items
        .chunks(2)
        .map(|pair| {
            let member = pair[0].as_str().unwrap().to_owned();
            // A score is a double; lease deadlines are integers below 2^53.
            let score: f64 = pair[1].as_str().unwrap().parse().unwrap();
            (member, score as i64)
        })
        .collect()
}

/// The absolute expiry of `key` in milliseconds (`PEXPIRETIME`; -1 without
/// one, -2 when it does not exist).
fn expiry_ms(server: &RedisServer, key: &str) -> i64 {
    match server.query(&["PEXPIRETIME", key]) {
        Reply::Integer(ms) => ms,
        other => panic!("PEXPIRETIME {key} answered {other:?}"),
    }
}

/// Waits (at most 10 s) until `replica` holds `expected` in ZSET `key`.
async fn until_replicated(replica: &RedisServer, key: &str, expected: &[(String, i64)]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = zset(replica, key);
        if seen == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica holds {seen:?} in {key}, not {expected:?}\n{}",
            replica.logs()
        );
        tokio::time::sleep(20 * MS).await;
    }
}

/// Waits (at most 10 s) until `replica` is in sync with its master.
async fn wait_in_sync(replica: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = replica.query(&["INFO", "replication"]);
        let info = info.as_str().unwrap_or_default();
        if info.lines().any(|l| l.trim() == "master_link_status:up") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never synced:\n{info}\n{}",
            replica.logs()
        );
        tokio::time::sleep(20 * MS).await;
    }
}

/// Acquires a permit on a runtime of its own and then "crashes": the permit
/// is leaked and the runtime (with the lease renewal task) is shut down, as
/// when the process dies. Returns the instant just before the acquire.
fn crash_while_holding(l: RedisLimiter) -> Instant {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let before = Instant::now();
        rt.block_on(async {
            let permit = l.acquire_host("t", host("a.test"), None).await.unwrap();
            std::mem::forget(permit);
        });
        drop(rt);
        before
    })
    .join()
    .unwrap()
}

/// A holder admitted on the master dies; the replica, whose clock is
/// [`SKEW`] ahead, is promoted and the master killed. The replicated lease
/// deadline is the old master's clock reading plus [`LEASE`], so on the
/// promoted node it is exactly the skew earlier than its own clock would
/// have set, and the next acquire there is admitted no earlier than
/// `LEASE - SKEW` after the first: the documented bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_clock_ahead_ends_a_lease_early_by_the_skew_only() {
    assert!(
        Path::new(FAKETIME).exists(),
        "{FAKETIME} is missing: install libfaketime with `apt-get install faketime`, \
         or run `cargo xtask test`, which installs it"
    );
    assert!(Path::new(LIBC).exists(), "{LIBC} is missing");
    // The master serves the full sync at once, not after 5 s of batching.
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let master_port = master.port().to_string();
    let offset = format!("+{}s", SKEW.as_secs());
    let preload = format!("{FAKETIME}:{LIBC}");
    let replica = RedisServer::start_with_env(
        &["--replicaof", "127.0.0.1", &master_port],
        &[
            ("LD_PRELOAD", &preload),
            ("FAKETIME", &offset),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    // faketime really moved the replica's clock (else nothing below tests
    // a skew).
    let skew = skew_us(&replica, &master);
    assert!(
        (skew - us(SKEW)).abs() <= us(CLOCK_TOLERANCE),
        "the replica runs {skew} µs ahead of the master, not {SKEW:?}: is libfaketime \
         working?\n{}",
        replica.logs()
    );
    bounded(15, wait_in_sync(&replica)).await;

    let make = |url: &str| {
        limiter(
            standalone(url),
            |p| p.min_delay(GAP),
            |b| {
                b.cluster_concurrency(1)
                    .lease_ttl(LEASE)
                    .tuning(redislimit::Tuning::default().with_concurrency_retry(10 * MS))
            },
        )
    };
    let holder = make(&master.url());
    let keys = HostKeys::of("test", "a.test");
    // Both clocks read around the admission, which happens in between.
    let (ahead_before, master_before) = (time_us(&replica), time_us(&master));
    let before = crash_while_holding(holder);
    let (master_after, ahead_after) = (time_us(&master), time_us(&replica));

    // The old master booked the lease until its own clock's admission
    // instant plus the lease.
    let booked = zset(&master, &keys.leases);
    assert_eq!(booked.len(), 1, "one lease: {booked:?}");
    let (token, deadline) = booked[0].clone();
    let admitted = deadline - us(LEASE);
    assert!(
        (master_before..=master_after).contains(&admitted),
        "the lease deadline {deadline} is not the master's admission instant \
         (between {master_before} and {master_after}) plus {LEASE:?}"
    );
    let key_expiry = expiry_ms(&master, &keys.leases);

    // Replicated as effects: the same absolute instants. (`WAIT` would
    // not do: it waits for the writes of its own connection, and the
    // harness opens a fresh one per command.)
    bounded(15, until_replicated(&replica, &keys.leases, &booked)).await;
    assert_eq!(replica.command(&["REPLICAOF", "NO", "ONE"]), "+OK\r\n");
    master.kill();
    assert_eq!(
        zset(&replica, &keys.leases),
        booked,
        "the promoted node holds other leases than the old master booked"
    );
    assert_eq!(expiry_ms(&replica, &keys.leases), key_expiry);

    // By the promoted node's own clock the holder was admitted between
    // `ahead_before` and `ahead_after`; the deadline it holds is SKEW
    // earlier than that plus the lease, and only SKEW.
    let (early_least, early_most) = (ahead_before - admitted, ahead_after - admitted);
    assert!(
        early_least <= us(SKEW + CLOCK_TOLERANCE) && early_most >= us(SKEW - CLOCK_TOLERANCE),
        "on the promoted node the lease ends {early_least}..{early_most} µs early by its own \
         clock, not {SKEW:?}"
    );
    // The key outlives the lease by its one second of slack on the
    // promoted node's clock as on the old master's: both are absolute (to
    // the millisecond the expiry is rounded to).
    let slack_ms = key_expiry - deadline / 1000;
    assert!(
        slack_ms >= 999,
        "the leases key expires {slack_ms} ms after the lease deadline, not 1 s"
    );

    // The promoted node admits the next request once its clock passes the
    // old master's deadline: SKEW early, never earlier.
    let survivor = make(&replica.url());
    let permit = bounded(15, survivor.acquire_host("t", host("a.test"), None))
        .await
        .expect("the dead holder's slot never came back on the promoted node");
    let sent = Instant::now();
    let clock_at_send = time_us(&replica);
    assert!(
        sent + TOLERANCE >= before + LEASE - SKEW,
        "admitted {:?} after the dead holder, before its lease ended even by the promoted \
         node's clock ({:?})",
        sent - before,
        LEASE - SKEW
    );
    let rebooked = zset(&replica, &keys.leases);
    assert!(
        rebooked.len() == 1 && rebooked[0].0 != token && rebooked[0].1 >= deadline + us(LEASE),
        "after the dead holder's lease {token} ended at {deadline}, the promoted node holds \
         {rebooked:?}"
    );
    println!(
        "skew {skew} µs; key slack {slack_ms} ms; admitted {:?} after the dead holder \
         (lease {LEASE:?}); by the old master's clock the lease still had {} µs to run",
        sent - before,
        deadline - (clock_at_send - skew)
    );
    drop(permit);
}

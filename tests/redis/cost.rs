//! What an acquire costs Redis, read from `INFO commandstats`.

use std::collections::BTreeMap;
use std::time::Duration;

use redislimit::Limiter;
use redislimit_tests::RedisServer;
use redislimit_tests::keys::HostKeys;
use redislimit_tests::resp::Reply;

use crate::{MS, host, limiter, standalone};

/// `cmdstat_<name>:calls=N,...` lines, as name -> calls.
pub(crate) fn command_calls(server: &RedisServer) -> BTreeMap<String, u64> {
    server
        .command(&["INFO", "commandstats"])
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// The scripts run as one function library, loaded by the first call that
/// finds it missing: on a fresh server, and again when the server lost it
/// (`FUNCTION FLUSH`, as a restart without persistence does). Counted by
/// Redis, with the library it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripts_are_one_function_library_loaded_again_when_lost() {
    let server = RedisServer::start();
    let l = limiter(standalone(&server.url()), |p| p.min_delay(MS), |b| b);
    let libraries = || {
        server
            .command(&["FUNCTION", "LIST"])
            .matches("redislimit_")
            .count()
    };
    // Calls sent together before the first load (the acquire, the
    // agreement, the registry) all find it missing; one loads it.
    let loaded = |calls: &BTreeMap<String, u64>| calls.get("function|load").copied().unwrap_or(0);
    let scripts = |calls: &BTreeMap<String, u64>| {
        calls.get("evalsha").copied().unwrap_or(0) + calls.get("eval").copied().unwrap_or(0)
    };
    drop(l.acquire_host("t", host("a.test"), None).await.unwrap());
    let calls = command_calls(&server);
    assert_eq!(loaded(&calls), 1, "{calls:?}");
    assert_eq!(scripts(&calls), 0, "{calls:?}");
    assert!(
        libraries() >= 1,
        "no library: {}",
        server.command(&["FUNCTION", "LIST"])
    );

    // Lost, then a crowd of acquires at once (as after a restart): the
    // calls that found it missing, one load, those calls again.
    server.command(&["FUNCTION", "FLUSH"]);
    server.command(&["CONFIG", "RESETSTAT"]);
    let l = std::sync::Arc::new(l);
    let mut crowd = tokio::task::JoinSet::new();
    for i in 0..50 {
        let l = std::sync::Arc::clone(&l);
        crowd.spawn(async move {
            drop(
                l.acquire_host("t", host(&format!("h{i}.test")), None)
                    .await
                    .unwrap(),
            );
        });
    }
    while let Some(done) = crowd.join_next().await {
        done.unwrap();
    }
    let calls = command_calls(&server);
    assert_eq!(loaded(&calls), 1, "{calls:?}");
    assert!(calls.get("fcall").copied().unwrap_or(0) >= 51, "{calls:?}");
    assert_eq!(scripts(&calls), 0, "{calls:?}");
    assert!(libraries() >= 1, "not loaded again");
}

/// A server at its `maxmemory` without eviction refuses an acquire (it
/// would book a lease) but still runs a release: the lease it ends is gone
/// at once, not a `lease_ttl` later. Read from Redis's own lease set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_memory_still_takes_releases() {
    let server = RedisServer::start();
    let l = limiter(
        standalone(&server.url()),
        |p| p.min_delay(MS),
        |b| b.cluster_concurrency(2),
    );
    let leases = HostKeys::of("test", "a.test").leases;
    let held = l.acquire_host("t", host("a.test"), None).await.unwrap();
    let count = || match server.query(&["ZCARD", &leases]) {
        Reply::Integer(n) => n,
        other => panic!("ZCARD answered {other:?}"),
    };
    assert_eq!(count(), 1);
    server.command(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    server.command(&["CONFIG", "SET", "maxmemory", "1"]);
    let refused = l.acquire_host("t", host("b.test"), None).await;
    assert!(
        refused.is_err(),
        "an acquire booked a lease on a full server"
    );
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while count() != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the release did not run on a full server: {}",
            server.command(&["ZRANGE", &leases, "0", "-1", "WITHSCORES"])
        );
        tokio::time::sleep(10 * MS).await;
    }
    server.command(&["CONFIG", "SET", "maxmemory", "0"]);
}

/// A user the server does not let load functions (an ACL without
/// `FUNCTION`) is paced with `EVALSHA` instead, from the first refusal on,
/// at the same pace: the host's second admission comes a `min_delay` after
/// the first (less what the two round trips may differ by).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_not_allowed_functions_is_paced_with_evalsha() {
    let server = RedisServer::start();
    let url = server.url_for_user("paced", "secret", &["-function"]);
    let l = limiter(standalone(&url), |p| p.min_delay(200 * MS), |b| b);
    drop(l.acquire_host("t", host("a.test"), None).await.unwrap());
    let first = std::time::Instant::now();
    drop(l.acquire_host("t", host("a.test"), None).await.unwrap());
    let gap = first.elapsed();
    assert!(
        gap >= 150 * MS,
        "the second send came {gap:?} after the first"
    );
    drop(l.acquire_host("t", host("b.test"), None).await.unwrap());
    let calls = command_calls(&server);
    // The calls sent together before the first refusal (the acquire, the
    // agreement, the registry) tried FCALL; none after it.
    let tried = calls.get("fcall").copied().unwrap_or(0);
    assert!((1..=3).contains(&tried), "{calls:?}");
    assert!(
        calls.get("evalsha").copied().unwrap_or(0) >= 3,
        "the acquires ran with EVALSHA: {calls:?}"
    );
    assert_eq!(
        calls.get("function|load").copied().unwrap_or(0),
        0,
        "a refused load is not counted: {calls:?}"
    );
    server.command(&["CONFIG", "RESETSTAT"]);
    drop(l.acquire_host("t", host("c.test"), None).await.unwrap());
    let calls = command_calls(&server);
    assert_eq!(calls.get("fcall"), None, "{calls:?}");
    assert!(calls.contains_key("evalsha"), "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_acquire_on_a_free_host_is_one_script_call() {
    let server = RedisServer::start();
    // Commands the acquire script itself runs (counted by Redis too).
    let in_script = [
        "time",
        "hmget",
        "hset",
        "zremrangebyscore",
        "zcard",
        "zrange",
        "zadd",
        "pttl",
        "pexpire",
        "zscore",
        "hgetall",
    ];
    for cap in [0u32, 3] {
        let l = limiter(
            standalone(&server.url()),
            |p| p.min_delay(MS).quota(10).window(1000 * MS),
            // One key space per mode: replicas of one scope must agree.
            // An admission handed back for lateness (a loaded machine)
            // would be a second call: never handed back here.
            |b| {
                b.cluster_concurrency(cap)
                    .prefix(format!("cap{cap}"))
                    .tuning(redislimit::Tuning::default().with_max_lateness(Duration::MAX))
            },
        );
        // Warm up: the connection is made and the script cached.
        drop(l.acquire_host("t", host("warm.test"), None).await.unwrap());
        tokio::time::sleep(50 * MS).await; // let the release land
        server.command(&["CONFIG", "RESETSTAT"]);
        let permit = l.acquire_host("t", host("free.test"), None).await.unwrap();
        let calls = command_calls(&server);
        drop(permit);
        assert_eq!(calls.get("fcall"), Some(&1), "cap {cap}: {calls:?}");
        for (name, n) in &calls {
            let expected =
                name == "fcall" || name == "config|resetstat" || in_script.contains(&name.as_str());
            assert!(
                expected,
                "cap {cap}: an acquire also sent {name} ({n} calls): {calls:?}"
            );
        }
        // The release is one call, sent off the caller's path: the script
        // in serialized mode, a plain `ZREM` of the lease in lease mode
        // (the acquire script runs no `ZREM` on a free host).
        tokio::time::sleep(50 * MS).await;
        let after = command_calls(&server);
        let (fcalls, zrems) = if cap == 0 { (2, None) } else { (1, Some(&1)) };
        assert_eq!(after.get("fcall"), Some(&fcalls), "cap {cap}: {after:?}");
        assert_eq!(after.get("zrem"), zrems, "cap {cap}: {after:?}");
    }
}

/// A permit released before its first renewal is due costs Redis its
/// acquire and release and nothing more (the booked renewal is taken
/// back), and one held past it is renewed. Counted by Redis: `ZSCORE` is
/// run by the acquire script (its void check) and by the renewal of a
/// lease, by no other script a limiter sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_is_sent_only_for_a_permit_held_until_it_is_due() {
    let server = RedisServer::start();
    let ttl = 200 * MS; // a renewal is due every 100 ms of holding
    let l = limiter(
        standalone(&server.url()),
        |p| p,
        |b| {
            b.cluster_concurrency(3)
                .lease_ttl(ttl)
                .tuning(redislimit::Tuning::default().with_max_lateness(Duration::MAX))
        },
    );
    drop(l.acquire_host("t", host("warm.test"), None).await.unwrap());
    tokio::time::sleep(50 * MS).await;
    let zscores = || command_calls(&server).get("zscore").copied().unwrap_or(0);

    server.command(&["CONFIG", "RESETSTAT"]);
    for i in 0..20 {
        drop(
            l.acquire_host("t", host(&format!("short{i}.test")), None)
                .await
                .unwrap(),
        );
    }
    // Three renewal periods on: a renewal not taken back would have run.
    tokio::time::sleep(3 * ttl / 2).await;
    assert_eq!(zscores(), 20, "only the acquires' void checks ran");

    server.command(&["CONFIG", "RESETSTAT"]);
    let held = l.acquire_host("t", host("long.test"), None).await.unwrap();
    tokio::time::sleep(5 * ttl / 4).await;
    let renewed = zscores();
    drop(held);
    // The acquire, and the renewal due at 100 ms of holding (another is
    // due at 200 ms).
    assert!(
        renewed >= 2,
        "a held permit was not renewed: {renewed} ZSCOREs"
    );
}

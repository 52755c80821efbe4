//! What an admitted acquire and a release cost Redis, from `INFO
//! commandstats`: commands per operation and server microseconds per call,
//! against a plain INCR (the floor) and a minimal one-round-trip GCRA
//! script (the peer), and again with 1,000 live leases on one host.

use std::collections::BTreeMap;
use std::time::Duration;

use redislimit::{HostKey, Limiter, Pacing, Permit, RedisLimiter, RedisPool, RedisTimeouts};
use redislimit_tests::RedisServer;
use serde_json::json;

use crate::Figure;

const N: usize = 2000;

/// A minimal GCRA limiter: one key, one script, one round trip.
const GCRA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
if tat - now > 0 then return tat - now end
redis.call('SET', KEYS[1], string.format('%.0f', tat + interval), 'PX', math.ceil(interval / 1000) + 1000)
return 0
"#;

/// name -> (calls, usec).
fn stats(server: &RedisServer) -> BTreeMap<String, (f64, f64)> {
    server
        .command(&["INFO", "commandstats"])
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.parse::<f64>().ok())
            };
            Some((name.to_owned(), (field("calls=")?, field("usec=")?)))
        })
        .collect()
}

/// Server µs per call of `command` and client commands per operation,
/// over what `ops` operations sent since the last reset.
fn per_call(server: &RedisServer, command: &str, ops: usize) -> (f64, f64) {
    let s = stats(server);
    let (calls, usec) = s.get(command).copied().unwrap_or((0.0, 0.0));
    let sent: f64 = s
        .iter()
        .filter(|(name, _)| {
            ["evalsha", "eval", "incr", "ping", "script|load"].contains(&name.as_str())
        })
        .map(|(_, (c, _))| c)
        .sum();
    (usec / calls.max(1.0), sent / ops as f64)
}

/// Whether `ours` calls per operation are one script call (a few more
/// from heartbeats landing in the same count are allowed) like `baseline`.
fn ratio_ok(ours: f64, baseline: f64) -> bool {
    ours <= baseline * 1.05
}

/// Admissions counted for the quota-state figure.
const QUOTA_OPS: usize = 10_000;

fn host(i: usize) -> HostKey {
    HostKey::parse(&format!("http://h{i}.example/")).unwrap()
}

pub(crate) async fn run() -> Vec<Figure> {
    let server = RedisServer::start();
    let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
    let limiter = RedisLimiter::builder(pool, "bench")
        .pacing(Pacing::builder().max_concurrent(4000).build().unwrap())
        .cluster_concurrency(4000)
        .build()
        .unwrap();
    drop(
        limiter
            .acquire_host("bench", host(usize::MAX), None)
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(50)).await;

    // Admitted acquires on free hosts, permits kept so no release interferes.
    server.command(&["CONFIG", "RESETSTAT"]);
    let mut held: Vec<Permit> = Vec::with_capacity(N);
    for i in 0..N {
        held.push(limiter.acquire_host("bench", host(i), None).await.unwrap());
    }
    let (acquire_us, acquire_cmds) = per_call(&server, "evalsha", N);
    server.command(&["CONFIG", "RESETSTAT"]);
    held.clear();
    tokio::time::sleep(Duration::from_millis(500)).await; // the spawned releases land
    let (release_us, release_cmds) = per_call(&server, "evalsha", N);

    // 1,000 live leases on one host, then more acquires on that host.
    let busy = host(usize::MAX - 1);
    let mut leases: Vec<Permit> = Vec::new();
    for _ in 0..1000 {
        leases.push(
            limiter
                .acquire_host("bench", busy.clone(), None)
                .await
                .unwrap(),
        );
    }
    server.command(&["CONFIG", "RESETSTAT"]);
    for _ in 0..500 {
        leases.push(
            limiter
                .acquire_host("bench", busy.clone(), None)
                .await
                .unwrap(),
        );
    }
    let (crowded_us, _) = per_call(&server, "evalsha", 500);
    drop(leases);

    // The floor: a plain INCR.
    server.command(&["CONFIG", "RESETSTAT"]);
    for _ in 0..N {
        server.command(&["INCR", "bench:floor"]);
    }
    let (incr_us, _) = per_call(&server, "incr", N);

    // The peer: a minimal GCRA script, one EVALSHA per check.
    let sha = server.command(&["SCRIPT", "LOAD", GCRA]);
    let sha = sha.lines().last().unwrap_or_default().trim().to_owned();
    server.command(&["CONFIG", "RESETSTAT"]);
    for i in 0..N {
        server.command(&["EVALSHA", &sha, "1", &format!("bench:gcra:{i}"), "1000"]);
    }
    let (gcra_us, gcra_cmds) = per_call(&server, "evalsha", N);

    // Quota state: a host allowed a million an hour, after QUOTA_OPS
    // admissions (their releases landed).
    let quota = RedisLimiter::builder(
        RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap(),
        "bench-quota",
    )
    .pacing(
        Pacing::builder()
            .max_concurrent(4000)
            .quota(1_000_000)
            .window(Duration::from_secs(3600))
            .build()
            .unwrap(),
    )
    .cluster_concurrency(4000)
    .build()
    .unwrap();
    let counted = host(usize::MAX - 2);
    for _ in 0..QUOTA_OPS {
        drop(
            quota
                .acquire_host("bench", counted.clone(), None)
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let keys = quota.keys(&counted);
    let state_bytes: f64 = [&keys.gate, &keys.leases, &keys.admits, &keys.void]
        .iter()
        .map(|key| server.memory_usage(key) as f64)
        .sum();

    let params =
        json!({ "operations": N, "redis": "standalone, loopback", "mode": "lease, cap 4000" });
    vec![
        Figure::new(
            "redis_acquire_commands_per_op",
            acquire_cmds,
            gcra_cmds,
            "GCRA script",
            "commands",
            params.clone(),
        ).held_to("one script call per operation (at most 1.05: heartbeats land in the count)", ratio_ok(acquire_cmds, gcra_cmds)),
        Figure::new(
            "redis_acquire_server_us",
            acquire_us,
            gcra_us,
            "GCRA script",
            "µs/call",
            params.clone(),
        ).at_most(1.5),
        Figure::new(
            "redis_acquire_server_us_vs_floor",
            acquire_us,
            incr_us,
            "INCR",
            "µs/call",
            params.clone(),
        ).informative("the cost of the cheapest command, to read the others by"),
        Figure::new(
            "redis_release_commands_per_op",
            release_cmds,
            gcra_cmds,
            "GCRA script",
            "commands",
            params.clone(),
        ).held_to("one script call per operation (at most 1.05: heartbeats land in the count)", ratio_ok(release_cmds, gcra_cmds)),
        Figure::new(
            "redis_release_server_us",
            release_us,
            gcra_us,
            "GCRA script",
            "µs/call",
            params.clone(),
        ).at_most(1.5),
        Figure::new(
            "redis_acquire_server_us_1000_leases",
            crowded_us,
            acquire_us,
            "same acquire on a free host",
            "µs/call",
            json!({ "live_leases": 1000, "acquires": 500 }),
        ).at_most(1.1),
        Figure::new(
            "redis_quota_state_bytes_per_host",
            state_bytes,
            1024.0,
            "1 KiB per host, for any quota",
            "bytes",
            json!({ "quota": 1_000_000, "window_s": 3600, "admissions": QUOTA_OPS, "bytes_per_admission": state_bytes / QUOTA_OPS as f64 }),
        )
        .at_most(1.0),
    ]
}

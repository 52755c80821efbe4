//! What an admitted acquire and a release cost Redis, from `INFO
//! commandstats`: commands per operation and server microseconds per call,
//! against a plain INCR (the floor) and a minimal one-round-trip GCRA
//! script (the peer) called the same way (`FCALL` of a function library,
//! and `EVALSHA` for servers without functions), and again with 1,000 live
//! leases on one host.

use std::collections::BTreeMap;
use std::time::Duration;

use redislimit::{HostKey, Limiter, Pacing, Permit, RedisLimiter, RedisPool, RedisTimeouts};
use redislimit_tests::RedisServer;
use redislimit_tests::keys::HostKeys;
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

/// The same GCRA as a function library of its own.
pub(crate) fn gcra_library() -> String {
    format!(
        "#!lua name=bench_gcra\nredis.register_function('bench_gcra', function(KEYS, ARGV)\n{GCRA}\nend)"
    )
}

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

/// What blocks of operations cost the server, summed over the blocks.
#[derive(Debug, Default)]
struct Tally {
    /// Calls of the command measured, and the server µs they took.
    calls: f64,
    usec: f64,
    /// Commands a client sent (script calls and the like), and operations.
    sent: f64,
    ops: usize,
}

impl Tally {
    /// Adds what `ops` operations cost since the last `CONFIG RESETSTAT`,
    /// counting the calls of `command`; then resets the counts.
    fn add(&mut self, server: &RedisServer, command: &str, ops: usize) {
        let s = stats(server);
        let (calls, usec) = s.get(command).copied().unwrap_or((0.0, 0.0));
        self.calls += calls;
        self.usec += usec;
        self.sent += s
            .iter()
            .filter(|(name, _)| {
                [
                    "fcall",
                    "function|load",
                    "evalsha",
                    "eval",
                    "incr",
                    "ping",
                    "script|load",
                    // A lease-mode release (no script runs a `ZREM` here).
                    "zrem",
                ]
                .contains(&name.as_str())
            })
            .map(|(_, (c, _))| c)
            .sum::<f64>();
        self.ops += ops;
        server.command(&["CONFIG", "RESETSTAT"]);
    }

    /// Server µs per call.
    fn per_call(&self) -> f64 {
        self.usec / self.calls.max(1.0)
    }

    /// Commands sent per operation.
    fn per_op(&self) -> f64 {
        self.sent / self.ops.max(1) as f64
    }
}

/// Whether `ours` calls per operation are one script call (a few more
/// from heartbeats landing in the same count are allowed) like `baseline`.
fn ratio_ok(ours: f64, baseline: f64) -> bool {
    ours <= baseline * 1.05
}

/// Acquires measured on the host with 1,000 leases (and on hosts with one).
const CROWDED: usize = 500;

/// Admissions counted for the quota-state figure.
const QUOTA_OPS: usize = 10_000;

/// Blocks that the operations compared are measured in, taking turns, so
/// that the machine's slow moments (other processes on its two cores)
/// fall on each alike.
const ROUNDS: usize = 10;

fn host(i: usize) -> HostKey {
    HostKey::parse(&format!("http://h{i}.example/")).unwrap()
}

/// An admission on `host`, its permit for the caller to keep.
async fn admitted(limiter: &RedisLimiter, host: HostKey) -> Permit {
    limiter.acquire_host("bench", host, None).await.unwrap()
}

/// Acquires on `count` free hosts from `from` on (permits kept in
/// `held`, so no release interferes), in turns with as many GCRA checks
/// (`gcra`: the command and the function's name or the script's SHA-1) and
/// INCRs, block by block; `command` is what the limiter's calls are counted
/// as.
#[allow(clippy::too_many_arguments)]
async fn measure_acquires(
    server: &RedisServer,
    limiter: &RedisLimiter,
    command: &str,
    gcra: [&str; 2],
    from: usize,
    count: usize,
    held: &mut Vec<Permit>,
) -> (Tally, Tally, Tally) {
    let (mut acquire, mut peer, mut floor) = (Tally::default(), Tally::default(), Tally::default());
    let block = count / ROUNDS;
    server.command(&["CONFIG", "RESETSTAT"]);
    for round in 0..ROUNDS {
        let hosts = from + round * block..from + (round + 1) * block;
        for i in hosts.clone() {
            held.push(admitted(limiter, host(i)).await);
        }
        acquire.add(server, command, block);
        for i in hosts {
            server.command(&[gcra[0], gcra[1], "1", &format!("bench:gcra:{i}"), "1000"]);
        }
        peer.add(server, &gcra[0].to_ascii_lowercase(), block);
        for _ in 0..block {
            server.command(&["INCR", "bench:floor"]);
        }
        floor.add(server, "incr", block);
    }
    (acquire, peer, floor)
}

pub(crate) async fn run() -> Vec<Figure> {
    let server = RedisServer::start();
    let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
    let limiter = RedisLimiter::builder(pool, "bench")
        .pacing(Pacing::builder().max_concurrent(4000).build().unwrap())
        .cluster_concurrency(4000)
        .build()
        .unwrap();
    drop(admitted(&limiter, host(usize::MAX)).await);
    // The same limiter for a user not allowed functions (neither to load
    // nor to call them): it runs the scripts with EVALSHA, as on a server
    // without functions.
    let url = server.url_for_user("nofunctions", "bench", &["-function", "-fcall"]);
    let scripted = RedisLimiter::builder(
        RedisPool::standalone(&url, RedisTimeouts::default()).unwrap(),
        "bench",
    )
    .pacing(Pacing::builder().max_concurrent(4000).build().unwrap())
    .cluster_concurrency(4000)
    .build()
    .unwrap();
    drop(admitted(&scripted, host(usize::MAX - 3)).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let sha = server.command(&["SCRIPT", "LOAD", GCRA]);
    let sha = sha.lines().last().unwrap_or_default().trim().to_owned();
    server.command(&["FUNCTION", "LOAD", "REPLACE", &gcra_library()]);

    let mut held: Vec<Permit> = Vec::with_capacity(N);
    let (acquire, gcra, floor) = measure_acquires(
        &server,
        &limiter,
        "fcall",
        ["FCALL", "bench_gcra"],
        0,
        N,
        &mut held,
    )
    .await;
    let mut scripted_held: Vec<Permit> = Vec::with_capacity(N);
    let (scripted_acquire, scripted_gcra, _) = measure_acquires(
        &server,
        &scripted,
        "evalsha",
        ["EVALSHA", &sha],
        N * 10,
        N,
        &mut scripted_held,
    )
    .await;
    // The EVALSHA limiter's releases land first, out of the count.
    scripted_held.clear();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.command(&["CONFIG", "RESETSTAT"]);
    held.clear();
    tokio::time::sleep(Duration::from_millis(500)).await; // the spawned releases land
    // Lease mode: a release is one `ZREM` (serialized mode runs the script).
    let mut release = Tally::default();
    release.add(&server, "zrem", N);

    // 1,000 live leases on one host, then more acquires on that host, in
    // turns with acquires on hosts holding one lease each: the same work
    // but for the number of leases. (A host with none is cheaper still: an
    // empty lease set is neither trimmed nor has an expiry to read.)
    let busy = host(usize::MAX - 1);
    let one = |i: usize| host(N + i);
    let mut leases: Vec<Permit> = Vec::new();
    for _ in 0..1000 {
        leases.push(admitted(&limiter, busy.clone()).await);
    }
    for i in 0..CROWDED {
        leases.push(admitted(&limiter, one(i)).await);
    }
    let (mut crowded, mut single) = (Tally::default(), Tally::default());
    let block = CROWDED / ROUNDS;
    server.command(&["CONFIG", "RESETSTAT"]);
    for round in 0..ROUNDS {
        for _ in 0..block {
            leases.push(admitted(&limiter, busy.clone()).await);
        }
        crowded.add(&server, "fcall", block);
        for i in round * block..(round + 1) * block {
            leases.push(admitted(&limiter, one(i)).await);
        }
        single.add(&server, "fcall", block);
    }
    drop(leases);
    let (acquire_us, acquire_cmds) = (acquire.per_call(), acquire.per_op());
    let (release_us, release_cmds) = (release.per_call(), release.per_op());
    let (gcra_us, gcra_cmds) = (gcra.per_call(), gcra.per_op());
    let incr_us = floor.per_call();

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
    let keys = HostKeys::of("bench-quota", counted.as_str());
    let state_bytes: f64 = [&keys.gate, &keys.leases, &keys.admits, &keys.void]
        .iter()
        .map(|key| server.memory_usage(key) as f64)
        .sum();

    let params = json!({ "operations": N, "rounds": ROUNDS, "redis": "standalone, loopback", "mode": "lease, cap 4000", "called_as": "FCALL" });
    let scripted_params = json!({ "operations": N, "rounds": ROUNDS, "redis": "standalone, loopback", "mode": "lease, cap 4000", "called_as": "EVALSHA" });
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
            "redis_acquire_server_us_evalsha",
            scripted_acquire.per_call(),
            scripted_gcra.per_call(),
            "GCRA script",
            "µs/call",
            scripted_params,
        ).informative("the same acquire on a server without functions, against GCRA called with EVALSHA too"),
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
        ).held_to("one call per operation (at most 1.05: heartbeats land in the count)", ratio_ok(release_cmds, gcra_cmds)),
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
            crowded.per_call(),
            single.per_call(),
            "same acquire on a host with one lease, in turns with these",
            "µs/call",
            json!({ "live_leases": 1000, "acquires": CROWDED, "rounds": ROUNDS }),
        ).at_most(1.1),
        Figure::new(
            "redis_acquire_server_us_1000_leases_vs_free_host",
            crowded.per_call(),
            acquire_us,
            "same acquire on a host with no lease (redis_acquire_server_us)",
            "µs/call",
            json!({ "live_leases": 1000, "acquires": CROWDED }),
        ).informative("a trim of lapsed leases and a read of the set's expiry, which a host with no lease in flight skips"),
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

//! What an acquire costs Redis, read from `INFO commandstats`.

use std::collections::BTreeMap;
use std::time::Duration;

use redislimit::Limiter;
use redislimit_tests::RedisServer;

use crate::{MS, host, limiter, standalone};

/// `cmdstat_<name>:calls=N,...` lines, as name -> calls.
fn command_calls(server: &RedisServer) -> BTreeMap<String, u64> {
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
                    .max_lateness(Duration::MAX)
            },
        );
        // Warm up: the connection is made and the script cached.
        drop(l.acquire_host("t", host("warm.test"), None).await.unwrap());
        tokio::time::sleep(50 * MS).await; // let the release land
        server.command(&["CONFIG", "RESETSTAT"]);
        let permit = l.acquire_host("t", host("free.test"), None).await.unwrap();
        let calls = command_calls(&server);
        drop(permit);
        assert_eq!(calls.get("evalsha"), Some(&1), "cap {cap}: {calls:?}");
        for (name, n) in &calls {
            let expected = name == "evalsha"
                || name == "config|resetstat"
                || in_script.contains(&name.as_str());
            assert!(
                expected,
                "cap {cap}: an acquire also sent {name} ({n} calls): {calls:?}"
            );
        }
        // The release is one script call, sent off the caller's path.
        tokio::time::sleep(50 * MS).await;
        let after = command_calls(&server);
        assert_eq!(after.get("evalsha"), Some(&2), "cap {cap}: {after:?}");
    }
}

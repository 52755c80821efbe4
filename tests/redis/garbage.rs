//! Garbage in the limiter's keys: a typed `Unavailable` error, never a panic.

use redislimit::{Error, Limiter};
use redislimit_tests::RedisServer;

use crate::{MS, host, limiter, standalone};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_the_keys_is_an_unavailable_error() {
    let server = RedisServer::start();
    for cap in [0u32, 2] {
        let l = limiter(
            standalone(&server.url()),
            |p| p.min_delay(10 * MS).quota(5).window(1000 * MS),
            // One key space per mode: replicas of one scope must agree.
            |b| b.cluster_concurrency(cap).prefix(format!("cap{cap}")),
        );
        let keys = l.keys(&host("a.test"));
        let corruptions: Vec<Vec<&str>> = vec![
            vec!["SET", &keys.gate, "not a hash"],
            vec!["HSET", &keys.gate, "next", "soon"],
            vec!["HSET", &keys.gate, "next", "inf"],
            vec!["HSET", &keys.gate, "next", "nan"],
            vec!["HSET", &keys.gate, "busy", "-"],
            vec!["SET", &keys.leases, "not a zset"],
            vec!["LPUSH", &keys.admits, "not a zset"],
        ];
        for corruption in corruptions {
            // A lease-mode limiter never reads `busy`.
            if cap > 0 && corruption[2] == "busy" {
                continue;
            }
            // A serialized limiter never reads the leases key.
            if cap == 0 && corruption[1] == keys.leases {
                continue;
            }
            server.command(&["DEL", &keys.gate, &keys.leases, &keys.admits]);
            server.command(&corruption);
            let err = l.acquire_host("t", host("a.test"), None).await.unwrap_err();
            assert!(
                matches!(err, Error::Unavailable { .. }),
                "cap {cap}, {corruption:?}: {err:?}"
            );
            // Penalize reads the gate's `next` only.
            if corruption[1] == keys.gate && corruption[2] != "busy" {
                let err = l.penalize_host(host("a.test"), 100 * MS).await.unwrap_err();
                assert!(
                    matches!(err, Error::Unavailable { .. }),
                    "{corruption:?}: {err:?}"
                );
            }
        }
        server.command(&["DEL", &keys.gate, &keys.leases, &keys.admits]);
        drop(l.acquire_host("t", host("a.test"), None).await.unwrap());
    }
}

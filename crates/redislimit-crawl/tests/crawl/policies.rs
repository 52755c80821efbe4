//! `--policy FILE` and `--key-by`: crawl replicas sharing Redis pace each
//! host by its own rule and key hosts as asked (by host, domain, address);
//! judged at the upstream.

use redislimit_tests::record::{Request, assert_serialized};
use redislimit_tests::{RedisServer, Upstream};

use crate::{MS, finish, spawn_all, tempdir, urls};

const POLICY: &str = r#"
[default]
min_delay = "40ms"

[[rule]]
match = "a.test"
min_delay = "300ms"

[[rule]]
match = "*.b.test"
min_delay = "120ms"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_pace_each_host_by_its_rule_from_the_policy_file() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    // Five hosts, so that `deal` gives each replica some of every host.
    let hosts = ["a.test", "x.b.test", "b.test", "c.test", "h.test"];
    let list = urls(&upstream, &hosts, 6, "/");
    let policy = policy.to_str().unwrap();
    let args = ["--redis", &server.url(), "--policy", policy];
    finish(spawn_all(dir.path(), &upstream, &list, 2, &args)).await;
    let gaps: Vec<_> = hosts
        .iter()
        .map(|h| {
            let seen = upstream.recorder().host(h);
            assert_eq!(seen.len(), 6, "{h}");
            assert!(
                seen.iter().any(|r| r.replica == 0) && seen.iter().any(|r| r.replica == 1),
                "{h}: both replicas fetched it"
            );
            (*h, seen)
        })
        .collect();
    for (host, seen) in &gaps {
        let gap = match *host {
            "a.test" => 300,
            "x.b.test" => 120,
            _ => 40,
        };
        let smallest = assert_serialized(seen, gap * MS);
        // The default hosts were not held to a rule's gap.
        if gap == 40 {
            assert!(smallest < 120 * MS, "{host}: gaps of {smallest:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_by_domain_two_hosts_share_one_pace_across_replicas() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let hosts = ["a.example.co.uk", "b.example.co.uk"];
    let list = urls(&upstream, &hosts, 5, "/");
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        "80ms",
        "--key-by",
        "domain",
    ];
    let lines = finish(spawn_all(dir.path(), &upstream, &list, 2, &args)).await;
    let mut both: Vec<Request> = hosts
        .iter()
        .flat_map(|h| upstream.recorder().host(h))
        .collect();
    both.sort_by_key(|r| r.send);
    assert_eq!(both.len(), 10);
    assert_serialized(&both, 80 * MS);
    // The report names the key.
    assert!(
        lines.iter().all(|l| l["host"] == "example.co.uk"),
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_by_ip_names_on_one_address_share_one_pace_across_replicas() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    // Two machines: `a.test` and `b.test` on 127.0.0.1 (the harness's
    // `--resolve`), the names under `two.test` on 127.0.0.2 (a pattern).
    let one = Upstream::start().await;
    let two = Upstream::start_on("127.0.0.2".parse().unwrap()).await;
    let dir = tempdir();
    let mut list = urls(&one, &["a.test", "b.test"], 5, "/");
    list.extend(urls(&two, &["c.two.test", "d.two.test"], 5, "/"));
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        "80ms",
        "--key-by",
        "ip",
        "--resolve",
        "*.two.test:127.0.0.2",
    ];
    let lines = finish(spawn_all(dir.path(), &one, &list, 3, &args)).await;
    let mut all = Vec::new();
    for (upstream, hosts, ip) in [
        (&one, ["a.test", "b.test"], "127.0.0.1"),
        (&two, ["c.two.test", "d.two.test"], "127.0.0.2"),
    ] {
        let mut both: Vec<Request> = hosts
            .iter()
            .flat_map(|h| upstream.recorder().host(h))
            .collect();
        both.sort_by_key(|r| r.send);
        assert_eq!(both.len(), 10, "{hosts:?}");
        for replica in 0..3 {
            assert!(
                both.iter().any(|r| r.replica == replica),
                "{hosts:?}: replica {replica} fetched some"
            );
        }
        // One machine, one pace, whichever name and replica sent.
        assert_serialized(&both, 80 * MS);
        // The report names the address.
        let named: Vec<_> = lines
            .iter()
            .filter(|l| hosts.iter().any(|h| l["url"].as_str().unwrap().contains(h)))
            .map(|l| l["host"].as_str().unwrap())
            .collect();
        assert_eq!(named, [ip; 10], "{hosts:?}");
        all.extend(both);
    }
    // Two machines, two paces: between them, sends closer than the gap.
    all.sort_by_key(|r| r.send);
    assert!(
        all.windows(2)
            .any(|p| p[1].send < p[0].end || p[1].send - p[0].end < 80 * MS),
        "the two addresses were paced as one: {all:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_policy_file_is_refused_naming_the_rule() {
    let dir = tempdir();
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        "[[rule]]\nmatch = \"a.test\"\n\n[[rule]]\nmatch = \"a.*.test\"\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(crate::crawl_binary())
        .args(["--policy", policy.to_str().unwrap(), "http://a.test/"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("rule 2 (\"a.*.test\")"), "{stderr}");
}

//! `--queue`: replicas taking their URLs from one queue in Redis, one of
//! them SIGKILLed mid-crawl and one started late; judged by what the
//! upstream served.

use std::collections::BTreeMap;
use std::time::Duration;

use redislimit_tests::record::assert_serialized;
use redislimit_tests::{RedisServer, Upstream};

use crate::{MS, Replica, exit, signal, spawn, tempdir};

/// The URLs of a report, each with how many lines name it (a line cut
/// short by a kill is left out).
fn reported(report: &std::path::Path) -> BTreeMap<String, usize> {
    let mut urls = BTreeMap::new();
    for line in std::fs::read_to_string(report).unwrap_or_default().lines() {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            *urls
                .entry(v["url"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    urls
}

/// How many items of `queue` the replica with process id `pid` holds
/// (`XPENDING`'s summary, by consumer).
fn pending_of(server: &RedisServer, queue: &str, pid: u32) -> i64 {
    use redislimit_tests::resp::Reply;
    let reply = server.query(&["XPENDING", queue, "workers"]);
    let Some([_, _, _, Reply::Array(Some(consumers))]) = reply.as_array() else {
        return 0;
    };
    let prefix = format!("crawl-{pid}-");
    consumers
        .iter()
        .filter_map(|c| match c.as_array()? {
            [name, count] if name.as_str()?.starts_with(&prefix) => {
                count.as_str()?.parse::<i64>().ok()
            }
            _ => None,
        })
        .sum()
}

/// Fills the queue of `server` with the lines of `text` (`crawl enqueue`,
/// a file in `dir`); what it printed.
async fn enqueue(server: &RedisServer, dir: &std::path::Path, text: &str) -> String {
    let file = dir.join("queue.txt");
    std::fs::write(&file, text).unwrap();
    let out = tokio::process::Command::new(crate::crawl_binary())
        .args(["enqueue", file.to_str().unwrap(), "--queue", &server.url()])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A crawl replica's arguments taking URLs from the queue in `server`
/// (and pacing through it): batches of `batch`, items taken over after
/// `claim_after`; leases of 2 s, 60 ms apart, 4 at once.
fn queue_args(server: &RedisServer, batch: &str, claim_after: &str) -> Vec<String> {
    let url = server.url();
    [
        "--queue",
        &url,
        "--redis",
        &url,
        "--queue-batch",
        batch,
        "--claim-after",
        claim_after,
        "--lease-ttl",
        "2s",
        "--min-delay",
        "60ms",
        "--concurrency",
        "4",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Three replicas share one queue; replica 0 is SIGKILLed mid-crawl and a
/// fourth starts after it. Every URL is fetched; none twice but those the
/// killed replica had taken and not finished (at most one batch); the
/// late replica takes a share; each host keeps its pace throughout; the
/// survivors exit 0 and leave the queue empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_queue_through_a_kill_and_a_late_start() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let hosts = [
        "a.test", "b.test", "c.test", "r1.test", "r2.test", "r3.test",
    ];
    let list = crate::urls(&upstream, &hosts, 25, "/q");
    // Filled by `crawl enqueue`, which reports the bad line and skips it.
    let stdout = enqueue(
        &server,
        dir.path(),
        &format!("{}\nnot a url\n", list.join("\n")),
    )
    .await;
    assert!(
        stdout.contains("150 URLs added to the queue (1 lines skipped)"),
        "{stdout}"
    );

    let args = queue_args(&server, "6", "1s");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let start = |n| spawn(dir.path(), n, &upstream, &[], &args);
    let mut replicas: Vec<Replica> = (0..3).map(start).collect();
    // Mid-crawl: replica 0 has sent some, and most are still to come.
    let seen = |replica: Option<usize>| {
        upstream
            .recorder()
            .all()
            .iter()
            .filter(|r| replica.is_none_or(|n| r.replica == n))
            .count()
    };
    let queue = redislimit_tests::keys::queue("domain", "urls");
    let mut killed = replicas.remove(0);
    let pid = killed.child.id().unwrap();
    // Replica 0's URLs taken and not acknowledged.
    let pending = || pending_of(&server, &queue, pid);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen(Some(0)) < 5 || seen(None) < 30 || pending() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the crawl did not start"
        );
        tokio::time::sleep(5 * MS).await;
    }
    signal(pid, "KILL");
    killed.child.wait().await.unwrap();
    let left = pending();
    assert!(seen(None) < 120, "the kill came too late to matter");
    replicas.push(start(3));
    let reports: Vec<_> = replicas.iter().map(|r| r.report.clone()).collect();
    let mut took_over = false;
    for replica in replicas {
        let (code, stderr) = exit(replica).await;
        assert_eq!(code, Some(0), "{stderr}");
        took_over |= stderr.contains("took over URLs another replica left unfinished");
    }
    // What the killed replica held was taken over (unless it was killed
    // in the instant between two batches, holding nothing).
    assert!(took_over || left == 0, "{left} URLs left behind");

    // What the upstream served, per URL path and host.
    let all = upstream.recorder().all();
    let mut served: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for r in &all {
        served
            .entry((r.host.clone(), r.path.clone()))
            .or_default()
            .push(r.replica);
    }
    assert_eq!(served.len(), 150, "every URL fetched");
    let twice: Vec<_> = served.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(
        twice.iter().all(|(_, by)| by[0] == 0 && by.len() == 2),
        "only the killed replica's URLs twice, once more: {twice:?}"
    );
    assert!(twice.len() <= 6, "at most its batch: {twice:?}");
    assert!(
        all.iter().any(|r| r.replica == 3),
        "the late replica took a share"
    );
    for host in hosts {
        assert_serialized(&upstream.recorder().host(host), 60 * MS);
    }
    // The survivors reported each URL once, and between all four reports
    // every URL is there.
    let mut lines: BTreeMap<String, usize> = BTreeMap::new();
    for report in &reports {
        for (url, n) in reported(report) {
            *lines.entry(url).or_default() += n;
        }
    }
    assert!(lines.values().all(|&n| n == 1), "{lines:?}");
    for (url, _) in reported(&killed.report) {
        lines.entry(url).or_default();
    }
    assert_eq!(lines.len(), 150);
    assert_eq!(
        server.query(&["XLEN", &queue]),
        redislimit_tests::resp::Reply::Integer(0),
        "the queue is empty"
    );
    // The survivors left the queue's group; the killed replica may still
    // be in it (it is removed once idle past `--claim-after` when another
    // looks for stale URLs, which the survivors may have stopped doing).
    let killed_prefix = format!("crawl-{pid}-");
    let left_in = consumers(&server, &queue);
    assert!(
        left_in.iter().all(|name| name.starts_with(&killed_prefix)),
        "{left_in:?}"
    );
}

/// The names of the consumers in `queue`'s group (`XINFO CONSUMERS`).
fn consumers(server: &RedisServer, queue: &str) -> Vec<String> {
    let reply = server.query(&["XINFO", "CONSUMERS", queue, "workers"]);
    let Some(list) = reply.as_array() else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|c| match c.as_array()? {
            [field, name, ..] if field.as_str()? == "name" => Some(name.as_str()?.to_owned()),
            _ => None,
        })
        .collect()
}

/// Regression: Redis down mid-crawl (SIGKILLed, then started again from
/// its append-only file) for longer than a replica tried to acknowledge
/// the URLs it reported meanwhile: they stayed in the queue unkept, and
/// were taken over and fetched again once Redis was back. Now they are
/// kept until acknowledged, and with the outage shorter than
/// `--claim-after`, no URL is fetched twice. (A Redis that is only frozen
/// runs the acknowledgements it was sent once it thaws.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_down_for_a_while_has_no_url_fetched_twice() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let hosts = ["a.test", "b.test", "c.test", "r1.test"];
    let list = crate::urls(&upstream, &hosts, 20, "/q");
    let stdout = enqueue(&server, dir.path(), &list.join("\n")).await;
    assert!(stdout.contains("80 URLs added"), "{stdout}");
    // Half the queue each: both are still fetching their batch when Redis
    // goes (between batches a replica would wait for Redis).
    let args = queue_args(&server, "40", "20s");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let replicas: Vec<Replica> = (0..2)
        .map(|n| spawn(dir.path(), n, &upstream, &[], &args))
        .collect();
    let seen = || upstream.recorder().all().len();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen() < 12 {
        assert!(
            std::time::Instant::now() < deadline,
            "the crawl did not start"
        );
        tokio::time::sleep(5 * MS).await;
    }
    server.kill();
    let before = seen();
    assert!(before < 60, "the outage came too late to matter");
    // Past the first 2.5 s, when the replicas send nothing, and the 2 s
    // for which an acknowledgement used to be tried.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let during = seen() - before;
    server.restart();
    assert!(during > 0, "nothing was fetched while Redis was down");
    let reports: Vec<_> = replicas.iter().map(|r| r.report.clone()).collect();
    for replica in replicas {
        let (code, stderr) = exit(replica).await;
        assert_eq!(code, Some(0), "{stderr}");
    }
    let mut served: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in upstream.recorder().all() {
        *served.entry((r.host.clone(), r.path.clone())).or_default() += 1;
    }
    assert_eq!(served.len(), 80, "every URL fetched");
    let twice: Vec<_> = served.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "fetched twice: {twice:?}");
    let mut lines: BTreeMap<String, usize> = BTreeMap::new();
    for report in &reports {
        for (url, n) in reported(report) {
            *lines.entry(url).or_default() += n;
        }
    }
    assert_eq!(lines.len(), 80);
    assert!(lines.values().all(|&n| n == 1), "{lines:?}");
    let queue = redislimit_tests::keys::queue("domain", "urls");
    assert_eq!(
        server.query(&["XLEN", &queue]),
        redislimit_tests::resp::Reply::Integer(0),
        "the queue is empty"
    );
}

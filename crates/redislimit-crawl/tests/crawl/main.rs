//! Many `crawl` processes against a recording upstream on loopback: the
//! invariants of docs/DESIGN.md checked from what the upstream saw, alone and
//! through Redis (standalone and Cluster), and with faults: Redis killed or
//! frozen mid-crawl, a replica killed mid-request, a 429 with Retry-After.
//! Every URL must end exactly once, with a status or a reported error.

mod backoff;
mod budgets;
mod bytes;
mod cli;
mod failover;
mod faults;
mod lateness;
mod lifecycle;
mod live;
mod metrics;
mod modes;
mod nginx;
mod partial;
mod policies;
mod queue;
mod resume;
mod robots;
mod skew;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use redislimit_tests::Upstream;
use tempfile::TempDir;
use tokio::process::{Child, Command};

/// The `crawl` binary these tests run: this package's (the one `cargo
/// install --path crates/redislimit-crawl` installs), or the one
/// `REDISLIMIT_CRAWL` names, such as an installed copy.
pub(crate) fn crawl_binary() -> PathBuf {
    std::env::var_os("REDISLIMIT_CRAWL")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_crawl")), PathBuf::from)
}

pub(crate) const MS: Duration = Duration::from_millis(1);
pub(crate) const HOSTS: [&str; 3] = ["a.test", "b.test", "c.test"];

/// Every host name a test may use, resolved to the upstream by `spawn`.
pub(crate) const RESOLVED: [&str; 14] = [
    "a.test",
    "b.test",
    "c.test",
    "r1.test",
    "r2.test",
    "r3.test",
    "r4.test",
    "r5.test",
    "t.test",
    "p.test",
    "h.test",
    "x.b.test",
    "a.example.co.uk",
    "b.example.co.uk",
];

/// Sends are spaced where they are admitted, in Redis; the upstream sees
/// them after the answer travels back and the request goes out, which on a
/// loaded 2-core machine running several processes varies by a few
/// milliseconds (a fresh connection costs more than a reused one).
/// Spacing and window checks on the upstream's record allow this much.
pub(crate) const SLACK: Duration = Duration::from_millis(15);

/// Several crawl processes per test keep both cores busy; tests that ran
/// beside another such test saw a request's way from the crawl to the
/// upstream vary by 10 ms, more than the spacing checks allow. The tests
/// of this binary therefore take turns.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits for this test's turn; the turn lasts as long as the guard.
pub(crate) async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    TURN.lock().await
}

/// One `crawl` process.
pub(crate) struct Replica {
    pub(crate) child: Child,
    pub(crate) report: PathBuf,
    pub(crate) urls: Vec<String>,
    /// Its stderr, read as it comes: a pipe nobody reads fills up, and then
    /// the replica's log writes block its runtime's threads mid-request,
    /// which no terminal or log collector does to a crawl in use.
    pub(crate) stderr: tokio::task::JoinHandle<Vec<u8>>,
}

/// Starts replica `n` fetching `urls` from `upstream`, with `extra` args
/// (and `--concurrency 8` unless they set it).
pub(crate) fn spawn(
    dir: &Path,
    n: usize,
    upstream: &Upstream,
    urls: &[String],
    extra: &[&str],
) -> Replica {
    spawn_with_env(dir, n, upstream, urls, extra, &[])
}

/// [`spawn`], with `env` added to the replica's environment.
pub(crate) fn spawn_with_env(
    dir: &Path,
    n: usize,
    upstream: &Upstream,
    urls: &[String],
    extra: &[&str],
    env: &[(&str, &str)],
) -> Replica {
    spawn_resolving(dir, n, upstream, urls, extra, env, &[])
}

/// [`spawn_with_env`], with `hosts` resolved to the upstream's address
/// beside [`RESOLVED`].
pub(crate) fn spawn_resolving(
    dir: &Path,
    n: usize,
    upstream: &Upstream,
    urls: &[String],
    extra: &[&str],
    env: &[(&str, &str)],
    hosts: &[&str],
) -> Replica {
    let list = dir.join(format!("urls-{n}.txt"));
    std::fs::write(&list, urls.join("\n")).unwrap();
    let report = dir.join(format!("report-{n}.jsonl"));
    let mut cmd = Command::new(crawl_binary());
    // A replica of a shared queue takes its URLs from Redis.
    if !extra.contains(&"--queue") {
        cmd.arg("--urls").arg(&list);
    }
    cmd.arg("--report").arg(&report);
    cmd.args(["--header", &format!("x-replica:{n}")]);
    if !extra.contains(&"--concurrency") {
        cmd.args(["--concurrency", "8"]);
    }
    for host in RESOLVED.iter().chain(hosts) {
        cmd.args(["--resolve", &format!("{host}:{}", upstream.addr().ip())]);
    }
    cmd.envs(env.iter().copied());
    cmd.args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("start the crawl binary");
    let mut pipe = child.stderr.take().expect("stderr is piped");
    let stderr = tokio::spawn(async move {
        let mut text = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut pipe, &mut text).await;
        text
    });
    Replica {
        child,
        report,
        urls: urls.to_vec(),
        stderr,
    }
}

/// Waits for every replica to run to its end, then checks that each of its
/// URLs ended exactly once with a status or an error, and that its exit
/// code says whether some got no HTTP response (4) or all did (0). Returns
/// every report line.
pub(crate) async fn finish(replicas: Vec<Replica>) -> Vec<serde_json::Value> {
    let mut all = Vec::new();
    for replica in replicas {
        let mut child = replica.child;
        let status = tokio::time::timeout(Duration::from_secs(90), child.wait())
            .await
            .expect("a crawl did not finish")
            .unwrap();
        let stderr = replica.stderr.await.unwrap_or_default();
        let stderr = String::from_utf8_lossy(&stderr);
        let lines = read_report(&replica.report);
        let unanswered = lines
            .iter()
            .any(|l| l["error"].is_string() && l["status"].is_null());
        assert_eq!(
            status.code(),
            Some(if unanswered { 4 } else { 0 }),
            "crawl failed or its exit code does not say what its report holds\n{stderr}"
        );
        let mut ended: BTreeMap<String, usize> = BTreeMap::new();
        for line in &lines {
            assert!(
                line["status"].is_u64() || line["error"].is_string() || line["skipped"].is_string(),
                "a URL ended with neither a status, an error nor a reason to skip it: {line}"
            );
            assert_eq!(
                line["not_started"], false,
                "a URL of a crawl that ran to its end is reported not started: {line}"
            );
            *ended
                .entry(line["url"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
        for url in &replica.urls {
            assert_eq!(
                ended.get(url),
                Some(&1),
                "{url} ended {:?} times\n{stderr}",
                ended.get(url)
            );
        }
        assert_eq!(ended.len(), replica.urls.len());
        all.extend(lines);
    }
    all
}

/// Sends signal `name` (`TERM`, `INT`) to the process `pid`.
pub(crate) fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// Waits (at most 90 s) for `replica` to exit, without the checks of
/// [`finish`]; its exit code and stderr.
pub(crate) async fn exit(replica: Replica) -> (Option<i32>, String) {
    let mut child = replica.child;
    let status = tokio::time::timeout(Duration::from_secs(90), child.wait())
        .await
        .expect("a crawl did not exit")
        .unwrap();
    let stderr = replica.stderr.await.unwrap_or_default();
    (status.code(), String::from_utf8_lossy(&stderr).into_owned())
}

pub(crate) fn read_report(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `count` distinct URLs per host in `hosts`, at `path` (which may carry a query).
pub(crate) fn urls(upstream: &Upstream, hosts: &[&str], count: usize, path: &str) -> Vec<String> {
    let sep = if path.contains('?') { '&' } else { '?' };
    (0..count)
        .flat_map(|i| hosts.iter().map(move |h| (i, *h)))
        .map(|(i, h)| upstream.url(h, &format!("{path}{sep}i={i}")))
        .collect()
}

/// Deals `urls` out to `n` replicas, rotating so that every replica gets
/// some of every host's URLs.
pub(crate) fn deal(urls: &[String], n: usize) -> Vec<Vec<String>> {
    let mut hands = vec![Vec::new(); n];
    for (i, url) in urls.iter().enumerate() {
        hands[(i + i / n) % n].push(url.clone());
    }
    hands
}

/// Deals `urls` out to `n` replicas and starts them with `args`.
pub(crate) fn spawn_all(
    dir: &Path,
    upstream: &Upstream,
    urls: &[String],
    n: usize,
    args: &[&str],
) -> Vec<Replica> {
    spawn_all_resolving(dir, upstream, urls, n, args, &[])
}

/// [`spawn_all`], with `hosts` resolved to the upstream's address beside
/// [`RESOLVED`].
pub(crate) fn spawn_all_resolving(
    dir: &Path,
    upstream: &Upstream,
    urls: &[String],
    n: usize,
    args: &[&str],
    hosts: &[&str],
) -> Vec<Replica> {
    deal(urls, n)
        .iter()
        .enumerate()
        .map(|(i, hand)| spawn_resolving(dir, i, upstream, hand, args, &[], hosts))
        .collect()
}

pub(crate) fn tempdir() -> TempDir {
    tempfile::tempdir().unwrap()
}

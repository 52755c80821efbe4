//! One crawl replica at scale: 1,000,000 URLs over 100,000 hosts, read
//! from a generated file of more than 100 MB (every host's first URL,
//! then every host's second, ...), against nginx answering `200` itself,
//! whose access log records every request. Paced in-process by a
//! `--min-delay` that never binds (a host's next URL comes far later).
//!
//! Two figures: the replica's peak resident memory (`VmHWM`, read from
//! `/proc` while it runs), held to 300 MB; and its requests a second
//! against a bare reqwest loop fetching the same file with the same
//! concurrency and idle-connection timeout (goal >= 0.9).

use std::io::{BufRead, BufWriter, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redislimit_tests::{Nginx, NginxConfig};
use serde_json::json;
use tokio::process::Command;

use crate::Figure;

const HOSTS: usize = 100_000;
const PER_HOST: usize = 10;
const CONCURRENCY: usize = 64;
/// The crawl's own idle-connection timeout, given to the bare loop too.
const IDLE: Duration = Duration::from_secs(15);
/// The goal for the peak resident memory.
const MOST_MB: f64 = 300.0;

fn host(i: usize) -> String {
    format!("h{i}.mem.test")
}

/// Writes the URL file; returns its size in bytes.
fn write_urls(path: &Path, nginx: &Nginx) -> u64 {
    let file = std::fs::File::create(path).expect("create the URL file");
    let mut out = BufWriter::new(file);
    for i in 0..PER_HOST {
        for h in 0..HOSTS {
            let path = format!(
                "/archive/2026/articles/{i:04}/a-path-as-long-as-a-real-crawl-frontier-carries/index.html?host={h}&page={i}"
            );
            writeln!(out, "{}", nginx.url(&host(h), &path)).expect("write the URL file");
        }
    }
    out.flush().expect("write the URL file");
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// The peak resident set of process `pid` so far, in KiB (`VmHWM`).
fn peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Runs the crawl over `urls`; its requests a second (from nginx's log)
/// and peak resident memory in KiB.
async fn crawl(dir: &Path, urls: &Path, nginx: &Nginx, logged_before: usize) -> (f64, u64, bool) {
    let exe = std::env::current_exe().expect("the bench binary's path");
    let log = dir.join("crawl-stderr.log");
    let start = Instant::now();
    let mut child = Command::new(exe.with_file_name("crawl"))
        .arg("--urls")
        .arg(urls)
        .args(["--resolve", "*.mem.test:127.0.0.1"])
        .args([
            "--min-delay",
            "1ms",
            "--no-backoff",
            "--progress-every",
            "60s",
        ])
        .args(["--concurrency", &CONCURRENCY.to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).map_or_else(|_| Stdio::null(), Stdio::from))
        .kill_on_drop(true)
        .spawn()
        .expect("start the crawl binary");
    let pid = child.id().expect("the crawl's pid");
    let mut peak = 0;
    let status = loop {
        if let Some(kib) = peak_kib(pid) {
            peak = peak.max(kib);
        }
        tokio::select! {
            status = child.wait() => break status.expect("wait for the crawl"),
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(1_800),
            "the crawl did not finish in 30 minutes"
        );
    };
    let elapsed = start.elapsed();
    let sent = nginx.access_log(logged_before + HOSTS * PER_HOST).len() - logged_before;
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        println!("  crawl_memory: the crawl exited {status}: {tail:?}");
    }
    (sent as f64 / elapsed.as_secs_f64(), peak, status.success())
}

/// Every name to nginx's address.
#[derive(Debug)]
struct Loopback;

impl reqwest::dns::Resolve for Loopback {
    fn resolve(&self, _: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async {
            let addr: SocketAddr = ([127, 0, 0, 1], 0).into();
            let addrs: reqwest::dns::Addrs = Box::new(std::iter::once(addr));
            Ok(addrs)
        })
    }
}

/// A bare reqwest loop: `CONCURRENCY` tasks taking the file's lines in
/// turn; its requests a second (from nginx's log).
async fn bare(urls: &Path, nginx: &Nginx, logged_before: usize) -> f64 {
    let client = reqwest::Client::builder()
        .dns_resolver(Arc::new(Loopback))
        .pool_idle_timeout(IDLE)
        .build()
        .expect("a client");
    let file = std::fs::File::open(urls).expect("open the URL file");
    let lines = Arc::new(Mutex::new(std::io::BufReader::new(file).lines()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (client, lines) = (client.clone(), Arc::clone(&lines));
        tasks.push(tokio::spawn(async move {
            loop {
                let next = lines.lock().expect("the lines").next();
                let Some(Ok(url)) = next else { break };
                if let Ok(response) = client.get(&url).send().await {
                    drop(response.bytes().await);
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a bare loop task");
    }
    let elapsed = start.elapsed();
    let sent = nginx.access_log(logged_before + HOSTS * PER_HOST).len() - logged_before;
    sent as f64 / elapsed.as_secs_f64()
}

pub(crate) async fn run() -> Vec<Figure> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let nginx = Nginx::start(NginxConfig {
        hosts: None,
        rate: 1_000,
        conns: 1_000,
        upstream: None,
    });
    let urls = dir.path().join("urls.txt");
    let bytes = write_urls(&urls, &nginx);
    let before = nginx.access_log(0).len();
    let baseline = bare(&urls, &nginx, before).await;
    let before = nginx.access_log(0).len();
    let (ours, peak_kib, finished) = crawl(dir.path(), &urls, &nginx, before).await;
    let peak_mb = peak_kib as f64 / 1024.0;
    println!(
        "  crawl_memory: {} URLs over {HOSTS} hosts ({:.0} MB file): peak resident {peak_mb:.0} MB (goal <= {MOST_MB} MB)",
        HOSTS * PER_HOST,
        bytes as f64 / 1e6,
    );
    let params = json!({
        "urls": HOSTS * PER_HOST,
        "hosts": HOSTS,
        "url_file_bytes": bytes,
        "concurrency": CONCURRENCY,
        "min_delay_ms": 1,
        "crawl_finished": finished,
    });
    vec![
        Figure::new(
            "crawl_peak_resident_mb_1m_urls_100k_hosts",
            peak_mb,
            MOST_MB,
            "the goal",
            "MB",
            params.clone(),
        )
        .held_to(
            &format!("ours <= {MOST_MB} MB"),
            finished && peak_mb <= MOST_MB,
        ),
        Figure::new(
            "crawl_requests_per_sec_vs_bare_reqwest",
            ours,
            baseline,
            "a bare reqwest loop over the same file, same concurrency",
            "requests/s",
            params,
        )
        .at_least(0.9),
    ]
}

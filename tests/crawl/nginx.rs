//! nginx as the judge: crawl replicas fetch through a real nginx whose
//! `limit_req` and `limit_conn` stand between them and the upstream, so
//! whether the crawl was polite is decided by a server we did not write.
//!
//! nginx keys both limits by `$host`, so every virtual host (`a.test`,
//! `b.test`, `c.test`, one `server` block each) has its own:
//! - `limit_req` at [`RATE`] requests a second with no burst: a request
//!   that arrives less than 100 ms after the last one nginx accepted for
//!   its host (measured in whole milliseconds of nginx's clock) gets `429`;
//! - `limit_conn` at the test's cap: a request while that many of its
//!   host's are in progress gets `503`.
//!
//! The crawl paces at [`PACE`], 150 ms more than nginx's interval, so that
//! only impoliteness trips the judge and not a request that travelled
//! longer than the one before it on a loaded machine (on two shared cores
//! a request was seen arriving 50 ms late). Bodies ([`SLOW`]) take 320 ms,
//! longer than both: two requests that overlap are refused by `limit_conn`
//! instead of being hidden behind `limit_req`, which nginx checks first,
//! and lease mode has two requests in flight at times.
//!
//! Each test fails on any `429` or `503`, read both from the crawl's
//! reports and from nginx's access log, which must also show every URL
//! once, answered `200`. Two tests show that the judge can fail: replicas
//! that do not share their pace get `429`s, and a replica that lets two
//! requests to a host overlap gets `503`s.
//!
//! nginx runs in the foreground (`-g 'daemon off;'`, `master_process off`,
//! so killing the child leaves no worker behind) on a free loopback port,
//! with its configuration, pid file, logs and temp paths in a fresh temp
//! directory. A single process never switches to another user, so no
//! `user` directive is needed when the tests run as root. Test host names
//! resolve to `127.0.0.1` (see [`crate::spawn`]), where nginx listens.

use std::collections::BTreeMap;
use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redislimit_tests::record::max_in_flight;
use redislimit_tests::{RedisServer, Upstream};
use serde_json::Value;
use tempfile::TempDir;

use crate::{HOSTS, finish, spawn_all};

/// nginx's `limit_req` rate per host, requests a second (no burst).
const RATE: u32 = 10;

/// The crawl's `--min-delay`: comfortably above nginx's `1 s / RATE`.
const PACE: &str = "250ms";

/// What the upstream behind nginx serves: 4 chunks 80 ms apart (320 ms).
const SLOW: &str = "/slow?chunks=4&every=80";

/// How long nginx gets to listen.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How many fresh ports a start tries when another process takes the port first.
const PORT_ATTEMPTS: usize = 5;

/// Where nginx is looked for after `PATH`.
const SBIN_DIRS: [&str; 4] = [
    "/usr/sbin",
    "/usr/local/sbin",
    "/sbin",
    "/usr/local/nginx/sbin",
];

/// What to install when nginx is missing.
const INSTALL_HINT: &str = "install it with `apt-get install nginx-light` (Debian/Ubuntu), \
                            or run `cargo xtask test`, which installs it";

/// A real nginx on `127.0.0.1` and a free port, proxying every test host
/// to `upstream` through `limit_req` and `limit_conn`; killed when dropped.
struct Nginx {
    child: Child,
    dir: TempDir,
    port: u16,
}

/// One line of nginx's access log.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Logged {
    status: u16,
    host: String,
    /// Path and query, as requested.
    uri: String,
}

/// Why a start did not produce a listening nginx.
enum StartError {
    /// Someone else bound the port first: worth another port.
    PortTaken(String),
    /// Anything else, with nginx's log.
    Failed(String),
}

impl Nginx {
    /// Starts nginx in front of `upstream`, letting at most `conns`
    /// requests per host be in progress at once. Panics with nginx's log
    /// when it does not come up: the test fails, it never skips.
    fn start(upstream: &Upstream, conns: u32) -> Self {
        let program = nginx_binary();
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let dir = tempfile::tempdir().expect("a temp dir for nginx");
            let port = free_port();
            fs::write(
                dir.path().join("nginx.conf"),
                config(dir.path(), port, upstream, conns),
            )
            .unwrap();
            let output = fs::File::create(dir.path().join("output.log")).unwrap();
            let child = Command::new(&program)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(dir.path().join("nginx.conf"))
                .arg("-e")
                .arg(dir.path().join("error.log"))
                .args(["-g", "daemon off;"])
                .stdin(Stdio::null())
                .stdout(output.try_clone().unwrap())
                .stderr(output)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot run {}: {e}; {INSTALL_HINT}", program.display())
                });
            let mut nginx = Self { child, dir, port };
            match nginx.wait_ready() {
                Ok(()) => return nginx,
                Err(StartError::PortTaken(log)) => last = log,
                Err(StartError::Failed(log)) => panic!("nginx did not start:\n{log}"),
            }
        }
        panic!(
            "nginx did not start: {PORT_ATTEMPTS} free ports were each taken first; \
             last log:\n{last}"
        )
    }

    /// Waits until nginx wrote its pid file (it does once it has bound the
    /// port) and accepts connections, or exited.
    fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let pid_file = self.dir.path().join("nginx.pid");
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let log = self.logs();
                return Err(if log.contains("Address already in use") {
                    StartError::PortTaken(log)
                } else {
                    StartError::Failed(format!("exited with {status}\n{log}"))
                });
            }
            let written = fs::read_to_string(&pid_file)
                .is_ok_and(|pid| pid.trim() == self.child.id().to_string());
            if written && TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StartError::Failed(format!(
                    "not listening on port {} after {READY_TIMEOUT:?}\n{}",
                    self.port,
                    self.logs()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// nginx's output and error log.
    fn logs(&self) -> String {
        let read = |name: &str| fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "output:\n{}\nerror.log:\n{}",
            read("output.log"),
            read("error.log")
        )
    }

    /// `http://{host}:{port}{path}`, through nginx.
    fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.port)
    }

    /// `count` distinct URLs per host in `hosts`, at `path` (which carries a query).
    fn urls(&self, hosts: &[&str], count: usize, path: &str) -> Vec<String> {
        (0..count)
            .flat_map(|i| {
                hosts
                    .iter()
                    .map(move |h| self.url(h, &format!("{path}&i={i}")))
            })
            .collect()
    }

    /// The access log, once it holds at least `expected` lines (nginx
    /// writes a line when it is done with a request, which may be a moment
    /// after the client read the response); at most 5 s.
    fn access_log(&self, expected: usize) -> Vec<Logged> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
            let lines: Vec<Logged> = text.lines().map(parse_log_line).collect();
            if lines.len() >= expected || Instant::now() >= deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `nginx` on `PATH`, else in the usual `sbin` directories (Debian's
/// `/usr/sbin` is not on a non-root user's `PATH`), where `cargo xtask
/// test` looks for it too.
fn nginx_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(SBIN_DIRS.map(PathBuf::from))
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("nginx not found on PATH or in {SBIN_DIRS:?}; {INSTALL_HINT}"))
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// The configuration: one `server` per test host, proxying to `upstream`
/// (the `Host` header and `x-replica` passed on), both limits keyed by
/// `$host`, and a default server answering `421` to any other name.
fn config(dir: &Path, port: u16, upstream: &Upstream, conns: u32) -> String {
    let dir = dir.display();
    let servers: String = HOSTS
        .iter()
        .map(|host| {
            format!(
                "    server {{
        listen 127.0.0.1:{port};
        server_name {host};
        limit_req zone=pace;
        limit_conn perhost {conns};
        location / {{
            proxy_pass http://{upstream};
            proxy_set_header Host $http_host;
            proxy_http_version 1.1;
            proxy_buffering off;
        }}
    }}
",
                upstream = upstream.addr()
            )
        })
        .collect();
    format!(
        "worker_processes 1;
master_process off;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{
    worker_connections 512;
}}
http {{
    log_format judge '$status $host $request_uri';
    access_log {dir}/access.log judge;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    limit_req_zone $host zone=pace:1m rate={RATE}r/s;
    limit_req_status 429;
    limit_conn_zone $host zone=perhost:1m;
    limit_conn_status 503;
{servers}    server {{
        listen 127.0.0.1:{port} default_server;
        server_name _;
        return 421;
    }}
}}
"
    )
}

fn parse_log_line(line: &str) -> Logged {
    let mut fields = line.split(' ');
    let mut next = || {
        fields
            .next()
            .unwrap_or_else(|| panic!("short access log line: {line}"))
            .to_owned()
    };
    Logged {
        status: next()
            .parse()
            .unwrap_or_else(|_| panic!("bad status in: {line}")),
        host: next(),
        uri: next(),
    }
}

/// What nginx and the crawl said about one run.
struct Judged {
    /// Per (host, path and query): the status in nginx's log.
    nginx: BTreeMap<(String, String), u16>,
    /// How many of nginx's answers had each status.
    counts: BTreeMap<u16, usize>,
}

/// Runs `replicas` crawls with `args` over `urls` through `nginx`, then
/// checks that nginx's log and the crawl's reports agree: one log line per
/// URL, with the status the report has.
async fn crawl_through(
    nginx: &Nginx,
    upstream: &Upstream,
    urls: &[String],
    replicas: usize,
    args: &[&str],
) -> Judged {
    let dir = crate::tempdir();
    let reports = finish(spawn_all(dir.path(), upstream, urls, replicas, args)).await;
    let log = nginx.access_log(urls.len());
    let mut judged = Judged {
        nginx: BTreeMap::new(),
        counts: BTreeMap::new(),
    };
    for line in &log {
        *judged.counts.entry(line.status).or_default() += 1;
        let again = judged
            .nginx
            .insert((line.host.clone(), line.uri.clone()), line.status);
        assert!(again.is_none(), "nginx saw {line:?} twice");
    }
    assert_eq!(
        log.len(),
        urls.len(),
        "nginx logged {} requests for {} URLs: {log:?}",
        log.len(),
        urls.len()
    );
    let reported = reported_statuses(&reports);
    assert_eq!(
        reported, judged.nginx,
        "the crawl's reports and nginx's log disagree"
    );
    judged
}

/// Per (host, path and query): the status each report line has.
fn reported_statuses(reports: &[Value]) -> BTreeMap<(String, String), u16> {
    reports
        .iter()
        .map(|line| {
            let url = url::Url::parse(line["url"].as_str().unwrap()).unwrap();
            let status = line["status"]
                .as_u64()
                .unwrap_or_else(|| panic!("no response: {line}"));
            let uri = match url.query() {
                Some(query) => format!("{}?{query}", url.path()),
                None => url.path().to_owned(),
            };
            (
                (url.host_str().unwrap().to_owned(), uri),
                u16::try_from(status).unwrap(),
            )
        })
        .collect()
}

/// nginx answered every request `200`: no `429` (too early) and no `503`
/// (too many at once). A failure shows nginx's error log, which says which
/// limit refused each one.
fn assert_polite(nginx: &Nginx, judged: &Judged) {
    let refused: Vec<_> = judged
        .nginx
        .iter()
        .filter(|(_, status)| **status != 200)
        .collect();
    assert!(
        refused.is_empty(),
        "nginx's answers by status: {:?} (429: too early, 503: too many at once); \
         refused: {refused:?}\n{}",
        judged.counts,
        nginx.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_accepts_one_replica_pacing_in_process() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let nginx = Nginx::start(&upstream, 1);
    let urls = nginx.urls(&HOSTS, 6, SLOW);
    let judged = crawl_through(&nginx, &upstream, &urls, 1, &["--min-delay", PACE]).await;
    assert_polite(&nginx, &judged);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_accepts_replicas_serialized_through_redis() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let nginx = Nginx::start(&upstream, 1);
    let urls = nginx.urls(&HOSTS, 6, SLOW);
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        PACE,
        "--max-concurrent",
        "4",
        "--lease-ttl",
        "5s",
    ];
    let judged = crawl_through(&nginx, &upstream, &urls, 3, &args).await;
    assert_polite(&nginx, &judged);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_accepts_replicas_leasing_through_redis() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let nginx = Nginx::start(&upstream, 2);
    let hosts = &HOSTS[..2];
    let urls = nginx.urls(hosts, 10, SLOW);
    let args = [
        "--redis",
        &server.url(),
        "--min-delay",
        PACE,
        "--cluster-concurrency",
        "2",
    ];
    let judged = crawl_through(&nginx, &upstream, &urls, 3, &args).await;
    assert_polite(&nginx, &judged);
    // nginx's cap of 2 was put to the test: the crawl used both slots.
    let peak = hosts
        .iter()
        .map(|host| max_in_flight(&upstream.recorder().host(host)))
        .max();
    assert_eq!(peak, Some(2), "lease mode never used its second slot");
}

/// The judge can fail: three replicas that pace alone, each at a polite
/// [`PACE`] (4 a second), send each host 12 requests a second together,
/// more than nginx's [`RATE`], and those that come sooner than 100 ms
/// after another replica's are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_refuses_replicas_that_do_not_share_a_pace() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let nginx = Nginx::start(&upstream, 1);
    let urls = nginx.urls(&HOSTS, 15, "/?fast=1");
    let judged = crawl_through(
        &nginx,
        &upstream,
        &urls,
        3,
        &["--min-delay", PACE, "--no-backoff"],
    )
    .await;
    let early = judged.counts.get(&429).copied().unwrap_or(0);
    assert!(
        early > 0,
        "nginx refused nothing as too early: {:?}",
        judged.counts
    );
}

/// The judge can fail: one replica that lets two requests to a host be in
/// flight, each sent a polite [`PACE`] after the one before, overlaps
/// bodies that take longer than that, and nginx's cap of one refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_refuses_overlapping_requests() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let nginx = Nginx::start(&upstream, 1);
    let urls = nginx.urls(&HOSTS[..1], 6, SLOW);
    let judged = crawl_through(
        &nginx,
        &upstream,
        &urls,
        1,
        &["--min-delay", PACE, "--max-concurrent", "2", "--no-backoff"],
    )
    .await;
    let crowded = judged.counts.get(&503).copied().unwrap_or(0);
    assert!(
        crowded > 0,
        "nginx refused nothing as too many at once: {:?}",
        judged.counts
    );
}

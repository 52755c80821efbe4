//! [`Nginx`]: a real nginx on loopback whose `limit_req` and `limit_conn`
//! judge whether the clients in front of it were polite, and what it
//! logged of each request.
//!
//! Both limits are keyed by `$host`: `limit_req` at [`NginxConfig::rate`]
//! requests a second with no burst (a request that arrives sooner than
//! `1 s / rate` after the last one nginx accepted for its host, in whole
//! milliseconds of nginx's clock, gets `429`), and `limit_conn` at
//! [`NginxConfig::conns`] (a request while that many of its host's are in
//! progress gets `503`). It serves named hosts (one `server` each, any
//! other name answered `421`) or any host name, and proxies to an upstream
//! (passing on `Host` and `x-replica`) or answers `200 ok` itself.
//!
//! nginx runs in the foreground (`-g 'daemon off;'`, `master_process off`,
//! so killing the child leaves no worker behind) on a free loopback port,
//! with its configuration, pid file, logs and temp paths in a fresh temp
//! directory. A single process never switches to another user, so no
//! `user` directive is needed when the tests run as root.

use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

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

/// What an [`Nginx`] serves and how it judges.
#[derive(Debug, Clone, Copy)]
pub struct NginxConfig<'a> {
    /// The host names it serves, one `server` each (any other is answered
    /// `421`); `None`: any host name, with both limits per name all the same.
    pub hosts: Option<&'a [&'a str]>,
    /// `limit_req`: requests a second per host, no burst.
    pub rate: u32,
    /// `limit_conn`: requests of one host in progress at once.
    pub conns: u32,
    /// Where requests go on to; `None`: nginx answers `200 ok` itself.
    pub upstream: Option<SocketAddr>,
}

/// A real nginx on a free port of every address, loopback among them (a
/// crawl may spread its hosts over `127.0.0.0/8`; see the module docs);
/// killed when dropped.
#[derive(Debug)]
pub struct Nginx {
    child: Child,
    dir: TempDir,
    port: u16,
}

/// One line of nginx's access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// The status nginx answered.
    pub status: u16,
    /// The `Host` asked for.
    pub host: String,
    /// Path and query, as requested.
    pub uri: String,
    /// When nginx logged it (the request's end), Unix epoch milliseconds.
    pub at_ms: u64,
    /// The `x-replica` header, if any.
    pub replica: Option<usize>,
}

/// Why a start did not produce a listening nginx.
enum StartError {
    /// Someone else bound the port first: worth another port.
    PortTaken(String),
    /// Anything else, with nginx's log.
    Failed(String),
}

impl Nginx {
    /// Starts nginx as `config` says. Panics with nginx's log when it does
    /// not come up: the test fails, it never skips.
    pub fn start(config: NginxConfig<'_>) -> Self {
        let program = nginx_binary();
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let dir = tempfile::tempdir().expect("a temp dir for nginx");
            let port = free_port();
            fs::write(
                dir.path().join("nginx.conf"),
                configuration(dir.path(), port, &config),
            )
            .unwrap();
            let output = fs::File::create(dir.path().join("output.log")).unwrap();
            let child = judge_command(&program)
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

    /// nginx's output and error log (which says which limit refused what).
    pub fn logs(&self) -> String {
        let read = |name: &str| fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "output:\n{}\nerror.log:\n{}",
            read("output.log"),
            read("error.log")
        )
    }

    /// The port it listens on (on every address, `127.0.0.1` among them;
    /// it answers only loopback clients, others with `403`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://{host}:{port}{path}`, through nginx.
    pub fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.port)
    }

    /// `count` distinct URLs per host in `hosts`, at `path` (which carries a
    /// query): every host's first, then every host's second, and so on.
    pub fn urls(&self, hosts: &[&str], count: usize, path: &str) -> Vec<String> {
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
    pub fn access_log(&self, expected: usize) -> Vec<Logged> {
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

/// A port that was free on every address a moment ago.
fn free_port() -> u16 {
    TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// Every `server` listens on every address (a bench's hosts are spread
/// over `127.0.0.0/8`) and answers this machine's loopback clients alone,
/// before any `return` of its own (the access module's `deny` comes after
/// those).
const LOOPBACK_ONLY: &str = r#"if ($remote_addr !~ "^(127\.|::1$)") { return 403; }"#;

/// The configuration: a `server` per host named (and a default one
/// answering `421` to any other name), or one for any name; both limits
/// keyed by `$host`.
fn configuration(dir: &Path, port: u16, config: &NginxConfig<'_>) -> String {
    let dir = dir.display();
    let conns = config.conns;
    let content = match config.upstream {
        Some(upstream) => format!(
            "location / {{
            proxy_pass http://{upstream};
            proxy_set_header Host $http_host;
            proxy_http_version 1.1;
            proxy_buffering off;
        }}"
        ),
        None => "location / {
            default_type text/plain;
            return 200 \"ok\\n\";
        }"
        .to_owned(),
    };
    let server = |name: &str, default: bool| {
        format!(
            "    server {{
        listen {port}{default};
        server_name {name};
        {loopback_only}
        limit_req zone=pace;
        limit_conn perhost {conns};
        {content}
    }}
",
            default = if default { " default_server" } else { "" },
            loopback_only = LOOPBACK_ONLY,
        )
    };
    let servers: String = match config.hosts {
        Some(hosts) => {
            let mut servers: String = hosts.iter().map(|host| server(host, false)).collect();
            servers.push_str(&format!(
                "    server {{
        listen {port} default_server;
        server_name _;
        {LOOPBACK_ONLY}
        return 421;
    }}
"
            ));
            servers
        }
        None => server("_", true),
    };
    // A zone of 1 MB holds about 8,000 hosts' states for `limit_req`.
    let zone = 1 + config.hosts.map_or(16, |h| h.len() / 4_000);
    format!(
        "worker_processes 1;
master_process off;
worker_rlimit_nofile 20000;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{
    worker_connections 16384;
}}
http {{
    log_format judge '$status $host $request_uri $msec $http_x_replica';
    access_log {dir}/access.log judge;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 100000;
    limit_req_zone $host zone=pace:{zone}m rate={rate}r/s;
    limit_req_status 429;
    limit_conn_zone $host zone=perhost:{zone}m;
    limit_conn_status 503;
{servers}}}
",
        rate = config.rate,
    )
}

/// nginx, at a higher priority than the crawls it judges where the harness
/// may raise it (as root; elsewhere `nice` says it cannot and runs nginx as
/// is). nginx stamps the requests of one wake-up with one time: descheduled
/// for 70 ms by eight replicas on two cores, it once stamped a request that
/// had waited in its socket with the time it woke, so the next request to
/// that host looked 70 ms early. The judge's own delays are not the
/// crawl's; the limits it applies are the same.
fn judge_command(program: &Path) -> Command {
    let nice = Path::new("/usr/bin/nice");
    if nice.exists() {
        let mut cmd = Command::new(nice);
        cmd.args(["-n", "-10"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
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
        at_ms: next()
            .replace('.', "")
            .parse()
            .unwrap_or_else(|_| panic!("bad time in: {line}")),
        replica: next().parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::{Nginx, NginxConfig};

    /// The status nginx on `port` of `to` answers a GET sent from `from`.
    async fn status_from(from: IpAddr, to: IpAddr, port: u16) -> String {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(from, 0)).unwrap();
        let mut stream = socket.connect(SocketAddr::new(to, port)).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.unwrap();
        reply
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned()
    }

    /// This machine's address toward the outside, if it has one (no packet
    /// is sent: a UDP socket's connect only picks the route).
    fn outside_address() -> Option<IpAddr> {
        let socket = UdpSocket::bind("0.0.0.0:0").ok()?;
        socket.connect("203.0.113.1:9").ok()?;
        let ip = socket.local_addr().ok()?.ip();
        (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
    }

    /// It listens on every address, and answers this machine's loopback
    /// clients alone: a client from another address is refused (`403`).
    #[tokio::test]
    async fn it_answers_loopback_clients_alone() {
        let nginx = Nginx::start(NginxConfig {
            hosts: None,
            rate: 100,
            conns: 10,
            upstream: None,
        });
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert_eq!(status_from(loopback, loopback, nginx.port()).await, "200");
        let outside = outside_address()
            .expect("an address besides loopback to send from (a route out of this machine)");
        assert_eq!(status_from(outside, outside, nginx.port()).await, "403");
    }
}

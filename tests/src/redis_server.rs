//! [`RedisServer`]: one real `redis-server` (or `redis-sentinel`) process on a free loopback port.

use std::{
    fs::{self, File},
    io,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    thread,
    time::{Duration, Instant},
};

use tempfile::TempDir;

use crate::{
    TestCa,
    port::free_port,
    resp::{self, DEFAULT_TIMEOUT, Reply},
    tls::{CA_FILE, CERT_FILE, KEY_FILE},
};

/// The environment variable naming the server binary the tests start (a
/// path, or a name on `PATH`), e.g. a `valkey-server`; `redis-server` when
/// unset. Sentinels run as that binary with `--sentinel`.
pub const SERVER_ENV: &str = "REDISLIMIT_REDIS_SERVER";

/// The server binary [`SERVER_ENV`] names, if it names one.
fn server_override() -> Option<String> {
    std::env::var(SERVER_ENV).ok().filter(|s| !s.is_empty())
}

/// How long a started process gets to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How many fresh ports a start tries when another process takes the port first.
const PORT_ATTEMPTS: usize = 5;

/// Redis's own log, inside the server's directory.
const LOG_FILE: &str = "redis.log";

/// stdout and stderr of the process (startup errors land here before the log is open).
const OUTPUT_FILE: &str = "output.log";

/// The config file written for launches that need one (Sentinel rewrites its own).
const CONFIG_FILE: &str = "redis.conf";

/// What to install when the binaries are missing.
const INSTALL_HINT: &str = "install Redis with `apt-get install redis-server redis-tools \
                            redis-sentinel` (or from redis.io), or run `cargo xtask test`, \
                            which installs it";

/// A real Redis process on `127.0.0.1` and a free port, with persistence off and a fresh
/// temporary directory; killed when dropped.
///
/// Startup waits (at most 10 s) until the process itself answers `PING`; past that it
/// panics with the server's log, so a test that needs Redis fails rather than skips.
/// Every method takes `&self`, so one server can be shared (e.g. in an `Arc`) by the
/// code under test and the test that kills, pauses or restarts it.
#[derive(Debug)]
pub struct RedisServer {
    launch: Launch,
    port: u16,
    dir: TempDir,
    /// `None` after [`RedisServer::kill`].
    child: Mutex<Option<Child>>,
}

/// How to start the process; kept so that [`RedisServer::restart`] starts the same thing.
#[derive(Debug)]
pub(crate) struct Launch {
    program: String,
    /// Run as a Sentinel (`--sentinel` after the config file).
    sentinel: bool,
    /// Written to [`CONFIG_FILE`] once and passed as the first argument.
    pub(crate) config: Option<String>,
    /// `--save '' --appendonly no` (not for Sentinel, which persists nothing anyway).
    persistence_off: bool,
    /// Extra command-line configuration, after the harness's own.
    args: Vec<String>,
    /// Extra environment variables of the process (on top of the test's own).
    envs: Vec<(String, String)>,
    /// The port must leave room for a Cluster bus port (`port + 10000`).
    cluster_bus: bool,
    /// Serve TLS only (`--tls-port`, `--port 0`) with a certificate of this CA.
    pub(crate) tls: Option<Arc<TestCa>>,
}

impl Launch {
    /// A `redis-server` with extra command-line configuration such as
    /// `["--replicaof", "127.0.0.1", "6379"]`.
    pub(crate) fn server(args: &[&str]) -> Self {
        let args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
        let cluster_bus = args
            .windows(2)
            .any(|w| w[0] == "--cluster-enabled" && w[1] == "yes");
        Self {
            program: server_override().unwrap_or_else(|| "redis-server".to_owned()),
            sentinel: false,
            config: None,
            persistence_off: true,
            args,
            envs: Vec::new(),
            cluster_bus,
            tls: None,
        }
    }

    /// A `redis-sentinel` reading (and rewriting) a config file holding `config`.
    pub(crate) fn sentinel(config: String) -> Self {
        let (program, sentinel) = match server_override() {
            Some(server) => (server, true),
            None => ("redis-sentinel".to_owned(), false),
        };
        Self {
            program,
            sentinel,
            config: Some(config),
            persistence_off: false,
            args: Vec::new(),
            envs: Vec::new(),
            cluster_bus: false,
            tls: None,
        }
    }
}

/// Why a start did not produce a ready process.
enum StartError {
    /// The port was taken by someone else: worth retrying on another port.
    PortTaken(String),
    /// Anything else; the text says what and carries the logs.
    Failed(String),
}

impl RedisServer {
    /// Starts a standalone `redis-server`.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a `redis-server` with extra command-line configuration appended to the
    /// harness's own, e.g. `&["--replicaof", "127.0.0.1", "6379"]` or
    /// `&["--maxmemory", "1mb"]`.
    pub fn start_with(args: &[&str]) -> Self {
        Self::launch(Launch::server(args))
    }

    /// Like [`RedisServer::start_with`], with extra environment variables for the process
    /// (kept across [`RedisServer::restart`]), e.g. libfaketime's `LD_PRELOAD` and
    /// `FAKETIME=+2s` for a server whose clock runs ahead. (A `redis-server` linked with
    /// jemalloc hangs under libfaketime alone; preloading glibc after it avoids that, see
    /// the Redis test `clock_ahead`.)
    pub fn start_with_env(args: &[&str], envs: &[(&str, &str)]) -> Self {
        let mut launch = Launch::server(args);
        launch.envs = envs
            .iter()
            .map(|&(name, value)| (name.to_owned(), value.to_owned()))
            .collect();
        Self::launch(launch)
    }

    /// Starts a `redis-server` that speaks TLS only, with a certificate of a fresh
    /// [`TestCa`] made for this server: its port is a `--tls-port` (the plain port is off),
    /// clients need no certificate of their own, [`RedisServer::url`] is `rediss://`, and
    /// clients must trust [`RedisServer::tls`]'s CA.
    ///
    /// Panics, with the server's log, when the installed `redis-server` was built without
    /// TLS.
    pub fn start_tls() -> Self {
        let mut launch = Launch::server(&[]);
        launch.tls = Some(Arc::new(TestCa::new()));
        Self::launch(launch)
    }

    /// Like [`RedisServer::start_tls`], with a certificate of `ca` (which other servers
    /// may share: a Cluster's nodes, a master and its replica) and extra command-line
    /// configuration, e.g. `&["--tls-replication", "yes"]`.
    pub fn start_tls_with(args: &[&str], ca: &Arc<TestCa>) -> Self {
        let mut launch = Launch::server(args);
        launch.tls = Some(Arc::clone(ca));
        Self::launch(launch)
    }

    /// Starts the process `launch` describes on a free port, retrying on port races.
    pub(crate) fn launch(launch: Launch) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("redislimit-redis-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir for {}: {e}", launch.program));
        if let Some(ca) = &launch.tls {
            ca.write_to(dir.path())
                .unwrap_or_else(|e| panic!("cannot write the TLS certificates: {e}"));
        }
        if let Some(config) = &launch.config {
            fs::write(dir.path().join(CONFIG_FILE), config)
                .unwrap_or_else(|e| panic!("cannot write the {} config: {e}", launch.program));
        }
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port(launch.cluster_bus);
            match start_process(&launch, dir.path(), port) {
                Ok(child) => {
                    return Self {
                        launch,
                        port,
                        dir,
                        child: Mutex::new(Some(child)),
                    };
                }
                Err(StartError::PortTaken(logs)) => last = logs,
                Err(StartError::Failed(why))
                    if launch.tls.is_some() && why.contains("tls-port") =>
                {
                    panic!(
                        "{} did not start with TLS; it may have been built without TLS \
                         (BUILD_TLS=yes): {why}",
                        launch.program
                    )
                }
                Err(StartError::Failed(why)) => panic!("{} did not start: {why}", launch.program),
            }
        }
        panic!(
            "{} did not start: {PORT_ATTEMPTS} free ports were each taken before it could bind \
             them; last log:\n{last}",
            launch.program
        )
    }

    /// The TCP port the server listens on (kept across [`RedisServer::restart`]); for a
    /// [`RedisServer::start_tls`] server, its TLS port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:PORT/`, or `rediss://127.0.0.1:PORT/` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.launch.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Creates the ACL user `name` with password `password`, allowed every key and every
    /// command but those `denied` names (`-function` style rules, e.g. `&["-fcall"]`), and
    /// returns [`RedisServer::url`] with its credentials.
    pub fn url_for_user(&self, name: &str, password: &str, denied: &[&str]) -> String {
        let pass = format!(">{password}");
        let mut acl = vec!["ACL", "SETUSER", name, "on", &pass, "~*", "+@all"];
        acl.extend_from_slice(denied);
        let reply = self.command(&acl);
        assert!(reply.starts_with("+OK"), "ACL SETUSER {name}: {reply}");
        let url = self.url();
        let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
        format!("{scheme}://{name}:{password}@{rest}")
    }

    /// The CA whose certificate a [`RedisServer::start_tls`] server presents; `None` for a
    /// plain server.
    pub fn tls(&self) -> Option<&TestCa> {
        self.launch.tls.as_deref()
    }

    /// The server's working directory (`--dir`), a temp dir removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id, or `None` after [`RedisServer::kill`].
    pub fn pid(&self) -> Option<u32> {
        self.child().as_ref().map(Child::id)
    }

    /// Whether the process is alive (a paused process is alive).
    pub fn is_running(&self) -> bool {
        self.child()
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Sends one command on a fresh connection and returns the raw reply text, e.g.
    /// `"+PONG\r\n"` or `":0\r\n"`; an error reply comes back as text (`"-ERR ...\r\n"`).
    ///
    /// Panics when the server cannot be reached within 5 s; use [`resp::command`] to see
    /// the I/O error instead. A TLS server is spoken to over TLS.
    pub fn command(&self, args: &[&str]) -> String {
        self.exchange(args).0
    }

    /// How many bytes `key` takes in the server (`MEMORY USAGE`); 0 when it
    /// does not exist.
    pub fn memory_usage(&self, key: &str) -> u64 {
        self.command(&["MEMORY", "USAGE", key])
            .trim()
            .trim_start_matches(':')
            .parse()
            .unwrap_or(0)
    }

    /// Like [`RedisServer::command`], but parses the reply.
    pub fn query(&self, args: &[&str]) -> Reply {
        self.exchange(args).1
    }

    fn exchange(&self, args: &[&str]) -> (String, Reply) {
        let tls = self.launch.tls.as_ref().map(|ca| ca.client_config());
        resp::exchange_over(self.addr(), args, DEFAULT_TIMEOUT, tls.as_ref())
            .unwrap_or_else(|e| panic!("{}: `{}` failed: {e}", self.name(), args.join(" ")))
    }

    /// Kills the process with SIGKILL and reaps it: no shutdown, no save, connections
    /// refused from now on. Does nothing if it is already killed.
    pub fn kill(&self) {
        stop(&mut self.child());
    }

    /// Freezes the process with SIGSTOP: connections are still accepted by the kernel,
    /// but nothing is answered until [`RedisServer::resume`].
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Lets a paused process run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Kills the process (if running) and starts a fresh one on the same port and
    /// directory: an empty dataset (nothing is persisted) and an empty script cache.
    ///
    /// Panics if the process does not come back within 10 s, e.g. because another
    /// process took the port in between.
    pub fn restart(&self) {
        let mut child = self.child();
        stop(&mut child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match start_process(&self.launch, self.dir.path(), self.port) {
                Ok(fresh) => {
                    *child = Some(fresh);
                    return;
                }
                Err(StartError::PortTaken(_)) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(100));
                }
                Err(StartError::PortTaken(logs) | StartError::Failed(logs)) => {
                    panic!("{} did not restart: {logs}", self.name())
                }
            }
        }
    }

    /// The tail of the process's log and output, for failure messages.
    pub fn logs(&self) -> String {
        logs(self.dir.path())
    }

    fn name(&self) -> String {
        format!("{} on {}", self.launch.program, self.addr())
    }

    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `kill -SIG pid` (no `unsafe` signal calls in this workspace).
    fn signal(&self, signal: &str) {
        let pid = self.pid().unwrap_or_else(|| {
            panic!(
                "{}: cannot send SIG{signal}, the process was killed",
                self.name()
            )
        });
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .unwrap_or_else(|e| panic!("cannot run `kill -{signal} {pid}`: {e}"));
        assert!(
            status.success(),
            "`kill -{signal} {pid}` exited with {status}"
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        stop(&mut self.child());
    }
}

/// SIGKILL and reap (works on a stopped process too).
fn stop(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Spawns the process and waits until it answers `PING` itself.
fn start_process(launch: &Launch, dir: &Path, port: u16) -> Result<Child, StartError> {
    let mut child = spawn(launch, dir, port);
    watch_parent(child.id());
    let tls = launch.tls.as_ref().map(|ca| ca.client_config());
    match wait_ready(&mut child, dir, port, tls.as_ref()) {
        Ok(()) => Ok(child),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

fn spawn(launch: &Launch, dir: &Path, port: u16) -> Child {
    let output = File::options()
        .create(true)
        .append(true)
        .open(dir.join(OUTPUT_FILE))
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", dir.join(OUTPUT_FILE).display()));
    let mut cmd = Command::new(&launch.program);
    if launch.config.is_some() {
        cmd.arg(dir.join(CONFIG_FILE));
    }
    if launch.sentinel {
        cmd.arg("--sentinel");
    }
    if launch.tls.is_some() {
        cmd.args(["--port", "0", "--tls-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(dir.join(CERT_FILE))
            .arg("--tls-key-file")
            .arg(dir.join(KEY_FILE))
            .arg("--tls-ca-cert-file")
            .arg(dir.join(CA_FILE))
            .args(["--tls-auth-clients", "no"]);
    } else {
        cmd.args(["--port", &port.to_string()]);
    }
    cmd.args([
        "--bind",
        "127.0.0.1",
        "--protected-mode",
        "no",
        "--daemonize",
        "no",
    ])
    .arg("--dir")
    .arg(dir)
    .arg("--logfile")
    .arg(dir.join(LOG_FILE));
    if launch.persistence_off {
        cmd.args(["--save", "", "--appendonly", "no"]);
    }
    cmd.args(&launch.args);
    cmd.envs(launch.envs.iter().map(|(name, value)| (name, value)));
    let stderr = output.try_clone().expect("duplicate the output log handle");
    cmd.stdin(Stdio::null()).stdout(output).stderr(stderr);
    cmd.spawn().unwrap_or_else(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            panic!("`{}` is not on PATH: {INSTALL_HINT}", launch.program)
        }
        panic!("cannot start `{}`: {e}", launch.program)
    })
}

/// Starts a shell that SIGKILLs the server if this test process dies without running
/// `Drop` (an abort, a signal), so no Redis outlives the tests. It exits by itself once
/// the server is gone.
fn watch_parent(server_pid: u32) {
    // The `comm` check keeps a pid reused by an unrelated process from being killed.
    let script = r#"while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
case "$(cat "/proc/$2/comm" 2>/dev/null)" in redis*) kill -9 "$2" 2>/dev/null ;; esac"#;
    let _ = Command::new("sh")
        .args(["-c", script, "redislimit-redis-watch"])
        .arg(std::process::id().to_string())
        .arg(server_pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(|mut watcher| {
            // Reap it in the background so it never lingers as a zombie.
            thread::spawn(move || watcher.wait());
        });
}

/// Polls until the process answers `PING` and `INFO` shows it is ours (not another
/// server that won a race for the port), until it exits, or for at most 10 s.
fn wait_ready(
    child: &mut Child,
    dir: &Path,
    port: u16,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<(), StartError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => {
                let logs = logs(dir);
                return Err(if logs.contains("Address already in use") {
                    StartError::PortTaken(logs)
                } else {
                    StartError::Failed(format!(
                        "exited with {status} before answering PING on {addr}\n{logs}"
                    ))
                });
            }
            Err(e) => return Err(StartError::Failed(format!("cannot poll the process: {e}"))),
        }
        let reason = match answers_as(addr, child.id(), tls) {
            Ok(()) => return Ok(()),
            Err(reason) => reason,
        };
        if Instant::now() >= deadline {
            return Err(StartError::Failed(format!(
                "no PONG from {addr} within {READY_TIMEOUT:?} (last: {reason})\n{}",
                logs(dir)
            )));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// `PING` answers `+PONG` and `INFO server` reports `process_id:<pid>` (over TLS with
/// `tls`).
fn answers_as(
    addr: SocketAddr,
    pid: u32,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<(), String> {
    let timeout = Duration::from_millis(500);
    let (pong, _) =
        resp::exchange_over(addr, &["PING"], timeout, tls).map_err(|e| e.to_string())?;
    if pong != "+PONG\r\n" {
        return Err(format!("PING answered {pong:?}"));
    }
    let (_, info) =
        resp::exchange_over(addr, &["INFO", "server"], timeout, tls).map_err(|e| e.to_string())?;
    let info = info.as_str().unwrap_or_default();
    let theirs = info_field(info, "process_id").unwrap_or_default();
    if theirs == pid.to_string() {
        Ok(())
    } else {
        Err(format!(
            "{addr} is answered by another process (pid {theirs:?}, ours {pid})"
        ))
    }
}

/// The value of `name:value` in an `INFO` reply.
pub(crate) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// The last lines of the Redis log and of the process output.
fn logs(dir: &Path) -> String {
    [LOG_FILE, OUTPUT_FILE]
        .iter()
        .filter_map(|name| {
            let path: PathBuf = dir.join(name);
            let text = fs::read_to_string(&path)
                .ok()
                .filter(|text| !text.trim().is_empty())?;
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            Some(format!(
                "--- {} (last 40 lines) ---\n{tail}",
                path.display()
            ))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::{Launch, info_field};

    #[test]
    fn reads_info_fields() {
        let info = "# Server\r\nredis_version:7.0.15\r\nprocess_id:4242\r\n";
        assert_eq!(info_field(info, "process_id"), Some("4242"));
        assert_eq!(info_field(info, "redis_version"), Some("7.0.15"));
        assert_eq!(info_field(info, "process"), None);
    }

    #[test]
    fn cluster_nodes_need_a_bus_port() {
        assert!(Launch::server(&["--cluster-enabled", "yes"]).cluster_bus);
        assert!(!Launch::server(&["--cluster-enabled", "no"]).cluster_bus);
        assert!(!Launch::server(&[]).cluster_bus);
    }
}

//! `RedisServer`: start, kill, pause/resume, restart and drop of a standalone server.

use std::{
    io::ErrorKind,
    net::TcpStream,
    time::{Duration, Instant},
};

use redislimit_tests::{RedisServer, resp};

/// Connecting to `server`'s port is refused (nothing listens there any more).
fn assert_refused(addr: std::net::SocketAddr) {
    match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Err(e) => assert_eq!(
            e.kind(),
            ErrorKind::ConnectionRefused,
            "unexpected error: {e}"
        ),
        Ok(_) => panic!("{addr} still accepts connections"),
    }
}

#[test]
fn starts_on_loopback_and_answers_ping() {
    let server = RedisServer::start();
    assert_eq!(server.command(&["PING"]), "+PONG\r\n");
    assert_eq!(
        server.addr().to_string(),
        format!("127.0.0.1:{}", server.port())
    );
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert!(server.is_running());
    let info = server.command(&["INFO", "server"]);
    let pid = server.pid().expect("running server has a pid");
    assert!(
        info.contains(&format!("process_id:{pid}\r\n")),
        "INFO server: {info}"
    );
}

#[test]
fn persistence_is_off_and_the_dir_is_private() {
    let server = RedisServer::start();
    assert_eq!(
        server.command(&["CONFIG", "GET", "save"]),
        "*2\r\n$4\r\nsave\r\n$0\r\n\r\n"
    );
    assert_eq!(
        server.command(&["CONFIG", "GET", "appendonly"]),
        "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n"
    );
    let dir = server.command(&["CONFIG", "GET", "dir"]);
    let expected = server.dir().canonicalize().expect("dir exists");
    assert!(
        dir.contains(&*expected.to_string_lossy()),
        "CONFIG GET dir: {dir:?}"
    );
}

#[test]
fn start_with_passes_extra_configuration() {
    let server = RedisServer::start_with(&["--maxmemory", "1mb"]);
    assert_eq!(
        server.command(&["CONFIG", "GET", "maxmemory"]),
        "*2\r\n$9\r\nmaxmemory\r\n$7\r\n1048576\r\n"
    );
}

#[test]
fn servers_started_together_get_their_own_ports() {
    let servers: Vec<RedisServer> = (0..4).map(|_| RedisServer::start()).collect();
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len(), "ports: {ports:?}");
    servers[0].command(&["SET", "only-here", "1"]);
    for other in &servers[1..] {
        assert_eq!(other.command(&["DBSIZE"]), ":0\r\n");
    }
}

#[test]
fn kill_makes_it_refuse_connections() {
    let server = RedisServer::start();
    let addr = server.addr();
    server.kill();
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    assert_refused(addr);
    let err = resp::command(addr, &["PING"], Duration::from_secs(1)).expect_err("server is dead");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    server.kill(); // killing twice is harmless
}

#[test]
fn pause_makes_reads_time_out_and_resume_answers_again() {
    let server = RedisServer::start();
    server.pause();
    assert!(server.is_running(), "a paused server is still alive");
    let started = Instant::now();
    let err = resp::command(server.addr(), &["PING"], Duration::from_millis(200))
        .expect_err("a paused server answers nothing");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "expected a read timeout, got {err}"
    );
    // The kernel counts a socket's read timeout in timer ticks (4 ms at HZ=250) from a
    // tick boundary, so a wait of 200 ms can end a tick short of it: the slack is 10 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(190),
        "gave up too early: {:?}",
        started.elapsed()
    );
    server.resume();
    assert_eq!(
        resp::command(server.addr(), &["PING"], Duration::from_secs(2)).unwrap(),
        "+PONG\r\n"
    );
}

#[test]
fn restart_comes_back_on_the_same_port_with_an_empty_dataset() {
    let server = RedisServer::start();
    let port = server.port();
    let old_pid = server.pid();
    assert_eq!(server.command(&["SET", "key", "value"]), "+OK\r\n");
    assert_eq!(server.command(&["DBSIZE"]), ":1\r\n");
    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid, "restart starts a fresh process");
    assert_eq!(server.command(&["DBSIZE"]), ":0\r\n");
    assert_eq!(server.command(&["PING"]), "+PONG\r\n");
}

#[test]
fn restart_revives_a_killed_or_paused_server() {
    let server = RedisServer::start();
    server.kill();
    server.restart();
    assert_eq!(server.command(&["PING"]), "+PONG\r\n");
    server.pause();
    server.restart();
    assert_eq!(server.command(&["PING"]), "+PONG\r\n");
}

#[test]
fn drop_kills_the_process() {
    let server = RedisServer::start();
    let addr = server.addr();
    let pid = server.pid().expect("running");
    let dir = server.dir().to_path_buf();
    drop(server);
    assert_refused(addr);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "process {pid} survived"
    );
    assert!(!dir.exists(), "temp dir {} was not removed", dir.display());
}

#[test]
#[should_panic(expected = "did not start")]
fn a_server_that_cannot_start_fails_the_test() {
    RedisServer::start_with(&["--no-such-directive", "1"]);
}

//! Telling a misconfigured Redis from an unavailable one.
//!
//! An outage mends itself, so the circuit opens and a fallback paces
//! meanwhile; a refused password, a missing database, a server that does
//! not speak RESP or TLS to a plain port never do, and a silent fallback
//! would hide them for good. These are reported as
//! [`Error::Misconfigured`](crate::Error::Misconfigured) on every call
//! instead, and they do not open the circuit.

use std::error::Error as _;
use std::time::Duration;

use deadpool_redis::redis::{ErrorKind, RedisError, ServerErrorKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::pool::QueryError;
use crate::Misconfiguration;

/// How long the plain-RESP check of a TLS port may take.
const PROBE: Duration = Duration::from_secs(1);

/// What `err` says is wrong with the setup, if it is a misconfiguration
/// rather than an outage.
pub(crate) fn diagnose(err: &QueryError) -> Option<Misconfiguration> {
    match err {
        QueryError::Misconfigured(cause, _) => Some(*cause),
        QueryError::Redis(e) => redis_error(e, false),
        QueryError::Pool(e) => match e.downcast_ref::<deadpool_redis::PoolError>()? {
            deadpool_redis::PoolError::Backend(e) => redis_error(e, true),
            _ => None,
        },
    }
}

/// The misconfiguration a Redis error reports, if any; `connecting` when
/// it came from opening a connection, where a reply that does not parse is
/// a server that does not speak RESP (on an open connection it is a reply
/// of an unexpected shape: unavailable, as any other).
fn redis_error(e: &RedisError, connecting: bool) -> Option<Misconfiguration> {
    match e.kind() {
        ErrorKind::AuthenticationFailed => return Some(Misconfiguration::Authentication),
        ErrorKind::Server(ServerErrorKind::NoPerm) => return Some(Misconfiguration::Permission),
        ErrorKind::Parse if connecting => return Some(Misconfiguration::NotRedis),
        _ => {}
    }
    match e.code() {
        Some("NOAUTH" | "WRONGPASS") => return Some(Misconfiguration::Authentication),
        Some("NOPERM") => return Some(Misconfiguration::Permission),
        _ => {}
    }
    let text = e.to_string();
    // The client's SELECT at connection time: "Redis server refused to
    // switch database - ... DB index is out of range".
    if text.contains("refused to switch database") || text.contains("DB index") {
        return Some(Misconfiguration::Database);
    }
    if e.is_io_error() && untrusted_certificate(e) {
        return Some(Misconfiguration::Tls);
    }
    None
}

/// Whether an I/O error's causes include a certificate the TLS client
/// refused (rustls reports it as an `InvalidData` I/O error).
fn untrusted_certificate(e: &RedisError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = e.source();
    let mut text = e.to_string();
    while let Some(c) = cause {
        text.push_str(&c.to_string());
        cause = c.source();
    }
    let text = text.to_ascii_lowercase();
    text.contains("invalid peer certificate") || text.contains("certificate verify failed")
}

/// Whether the server at `addr` answers a plain `PING` in RESP (a TLS
/// hello sent there waits for an answer that never comes).
pub(crate) async fn speaks_plain_resp(addr: &str) -> bool {
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut reply = [0u8; 1];
        stream.read_exact(&mut reply).await.ok()?;
        // "+PONG", or an error such as "-NOAUTH": either is RESP.
        Some(matches!(reply[0], b'+' | b'-'))
    };
    matches!(tokio::time::timeout(PROBE, ask).await, Ok(Some(true)))
}

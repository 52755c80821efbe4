//! A tiny blocking RESP2 client over `std::net::TcpStream` (or TLS over it), enough to drive
//! the test servers.
//!
//! Each call opens a fresh connection, sends one command and reads exactly one reply, so a
//! paused or dead server costs at most the given timeout and never leaves state behind.

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::Arc,
    time::Duration,
};

use rustls::{ClientConfig, ClientConnection, StreamOwned, pki_types::ServerName};

/// Timeout for connecting, writing and reading used by the harness's own commands.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// One parsed RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`: a simple string.
    Simple(String),
    /// `-ERR ...`: an error reply (the text after `-`).
    Error(String),
    /// `:42`: an integer.
    Integer(i64),
    /// `$3 foo`: a bulk string; `None` for the nil bulk string (`$-1`).
    Bulk(Option<String>),
    /// `*2 ...`: an array; `None` for the nil array (`*-1`).
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The text of a simple or (non-nil) bulk string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Reply::Simple(text) | Reply::Bulk(Some(text)) => Some(text),
            _ => None,
        }
    }

    /// The elements of a non-nil array.
    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(Some(items)) => Some(items),
            _ => None,
        }
    }
}

/// Sends `args` as one command to `addr` and returns the raw reply text, e.g. `"+PONG\r\n"`,
/// `":0\r\n"` or `"$1234\r\n# Server\r\n...\r\n"`.
///
/// `timeout` bounds the connect, the write and each read; an error reply from the server
/// is returned as text (`"-ERR ...\r\n"`), not as an `Err`.
pub fn command(addr: SocketAddr, args: &[&str], timeout: Duration) -> io::Result<String> {
    exchange(addr, args, timeout).map(|(raw, _)| raw)
}

/// Like [`command`], but parses the reply.
pub fn query(addr: SocketAddr, args: &[&str], timeout: Duration) -> io::Result<Reply> {
    exchange(addr, args, timeout).map(|(_, reply)| reply)
}

/// Like [`command`], over TLS with `tls` (verifying the server's certificate for the IP
/// address of `addr`).
pub fn command_tls(
    addr: SocketAddr,
    args: &[&str],
    timeout: Duration,
    tls: &Arc<ClientConfig>,
) -> io::Result<String> {
    exchange_over(addr, args, timeout, Some(tls)).map(|(raw, _)| raw)
}

/// Like [`query`], over TLS with `tls`.
pub fn query_tls(
    addr: SocketAddr,
    args: &[&str],
    timeout: Duration,
    tls: &Arc<ClientConfig>,
) -> io::Result<Reply> {
    exchange_over(addr, args, timeout, Some(tls)).map(|(_, reply)| reply)
}

/// One plain-text connection kept open for many commands, for tests that send thousands
/// (a fresh connection per command would run out of loopback ports).
#[derive(Debug)]
pub struct Connection {
    reader: BufReader<TcpStream>,
}

impl Connection {
    /// Connects to `addr`; `timeout` bounds the connect and every later read and write.
    pub fn open(addr: SocketAddr, timeout: Duration) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            reader: BufReader::new(stream),
        })
    }

    /// Sends `args` as one command and reads its reply; an error reply is a
    /// [`Reply::Error`], not an `Err`.
    pub fn query(&mut self, args: &[&str]) -> io::Result<Reply> {
        let stream = self.reader.get_mut();
        stream.write_all(&encode(args))?;
        stream.flush()?;
        read_reply(&mut self.reader, &mut Vec::new())
    }

    /// Sends every command in `commands` at once, then reads their replies in order:
    /// one round trip for all of them.
    pub fn pipeline(&mut self, commands: &[Vec<&str>]) -> io::Result<Vec<Reply>> {
        let bytes: Vec<u8> = commands.iter().flat_map(|args| encode(args)).collect();
        let stream = self.reader.get_mut();
        stream.write_all(&bytes)?;
        stream.flush()?;
        (0..commands.len())
            .map(|_| read_reply(&mut self.reader, &mut Vec::new()))
            .collect()
    }
}

/// The RESP encoding of one command: an array of bulk strings.
pub fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn exchange(addr: SocketAddr, args: &[&str], timeout: Duration) -> io::Result<(String, Reply)> {
    exchange_over(addr, args, timeout, None)
}

/// One command and its reply, in plain text or, with `tls`, over TLS.
pub(crate) fn exchange_over(
    addr: SocketAddr,
    args: &[&str],
    timeout: Duration,
    tls: Option<&Arc<ClientConfig>>,
) -> io::Result<(String, Reply)> {
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    match tls {
        None => exchange_on(stream, args),
        Some(config) => {
            let name = ServerName::IpAddress(addr.ip().into());
            let connection =
                ClientConnection::new(Arc::clone(config), name).map_err(io::Error::other)?;
            exchange_on(StreamOwned::new(connection, stream), args)
        }
    }
}

fn exchange_on(mut stream: impl Read + Write, args: &[&str]) -> io::Result<(String, Reply)> {
    stream.write_all(&encode(args))?;
    stream.flush()?;
    let mut reader = BufReader::new(stream);
    let mut raw = Vec::new();
    let reply = read_reply(&mut reader, &mut raw)?;
    Ok((String::from_utf8_lossy(&raw).into_owned(), reply))
}

/// Reads one complete reply, appending its bytes to `raw`.
fn read_reply(reader: &mut impl BufRead, raw: &mut Vec<u8>) -> io::Result<Reply> {
    let start = raw.len();
    if reader.read_until(b'\n', raw)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a reply",
        ));
    }
    let line = String::from_utf8_lossy(&raw[start..]);
    let Some(line) = line.strip_suffix("\r\n") else {
        return Err(invalid(format!(
            "reply line not terminated by CRLF: {line:?}"
        )));
    };
    let (kind, rest) = line.split_at(line.chars().next().map_or(0, char::len_utf8));
    let rest = rest.to_owned();
    match kind {
        "+" => Ok(Reply::Simple(rest)),
        "-" => Ok(Reply::Error(rest)),
        ":" => Ok(Reply::Integer(parse_int(&rest)?)),
        "$" => {
            let Ok(len) = usize::try_from(parse_int(&rest)?) else {
                return Ok(Reply::Bulk(None));
            };
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body)?;
            raw.extend_from_slice(&body);
            if !body.ends_with(b"\r\n") {
                return Err(invalid("bulk string not terminated by CRLF".to_owned()));
            }
            body.truncate(len);
            Ok(Reply::Bulk(Some(
                String::from_utf8_lossy(&body).into_owned(),
            )))
        }
        "*" => {
            let Ok(len) = usize::try_from(parse_int(&rest)?) else {
                return Ok(Reply::Array(None));
            };
            let items = (0..len)
                .map(|_| read_reply(reader, raw))
                .collect::<io::Result<_>>()?;
            Ok(Reply::Array(Some(items)))
        }
        _ => Err(invalid(format!("unknown RESP2 reply type in {line:?}"))),
    }
}

fn parse_int(text: &str) -> io::Result<i64> {
    text.parse()
        .map_err(|_| invalid(format!("not an integer: {text:?}")))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::{Reply, encode, read_reply};

    fn parse(raw: &str) -> (Reply, String) {
        let mut reader = Cursor::new(raw.as_bytes().to_vec());
        let mut seen = Vec::new();
        let reply = read_reply(&mut reader, &mut seen).expect("valid reply");
        (reply, String::from_utf8(seen).expect("utf-8"))
    }

    #[test]
    fn encodes_commands_as_bulk_arrays() {
        assert_eq!(
            encode(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn parses_every_reply_type_and_keeps_the_raw_text() {
        let raw = "*6\r\n+OK\r\n-ERR no\r\n:-7\r\n$5\r\na\r\nbc\r\n$-1\r\n*-1\r\n";
        let (reply, seen) = parse(&format!("{raw}+next\r\n"));
        assert_eq!(seen, raw, "reads exactly one reply");
        assert_eq!(
            reply,
            Reply::Array(Some(vec![
                Reply::Simple("OK".into()),
                Reply::Error("ERR no".into()),
                Reply::Integer(-7),
                Reply::Bulk(Some("a\r\nbc".into())),
                Reply::Bulk(None),
                Reply::Array(None),
            ]))
        );
    }

    #[test]
    fn rejects_truncated_replies() {
        let mut reader = Cursor::new(b"$5\r\nab".to_vec());
        assert!(read_reply(&mut reader, &mut Vec::new()).is_err());
        let mut reader = Cursor::new(Vec::new());
        assert!(read_reply(&mut reader, &mut Vec::new()).is_err());
    }
}

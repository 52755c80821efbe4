//! Runnable examples of redislimit; see `examples/examples/` and run one
//! with `cargo run -p examples --example NAME`.
//!
//! The examples need no network: [`local_upstream`] serves every host name
//! on loopback, and each example points its host names at it.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod timeline;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Starts a loopback HTTP server answering for any host name, and returns
/// its address. It prints one line per request it receives (time since it
/// started, host, path) unless `quiet`, so the pacing shows on the server
/// side. What it answers:
///
/// - any path on a host named `slow.*`: `200` after 400 ms;
/// - the first request to a host named `busy.*`, and the first to the path
///   `/busy`: `429 Too Many Requests` with `Retry-After: 1`;
/// - `/flaky`: `503 Service Unavailable` twice, then `200`;
/// - `/to/HOST`: `302 Found` to `/` on `HOST` (same port);
/// - anything else: `200` with a greeting.
pub async fn local_upstream(quiet: bool) -> SocketAddr {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let started = Instant::now();
    let counts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counts = Arc::clone(&counts);
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let host = req
                    .headers()
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("?")
                    .to_owned();
                let name = host.split(':').next().unwrap_or_default().to_owned();
                let path = req.uri().path().to_owned();
                if !quiet {
                    println!(
                        "    server: {:>5} ms  {host}{path}",
                        started.elapsed().as_millis()
                    );
                }
                let seen = |key: String| {
                    let mut counts = counts
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let n = counts.entry(key).or_default();
                    *n += 1;
                    *n - 1
                };
                let mut response = http::Response::builder();
                let mut delay = Duration::ZERO;
                let body = if name.starts_with("busy.") && seen(name.clone()) == 0
                    || path == "/busy" && seen(path.clone()) == 0
                {
                    response = response.status(429).header("retry-after", "1");
                    "slow down"
                } else if path == "/flaky" && seen(path.clone()) < 2 {
                    response = response.status(503);
                    "try again"
                } else if let Some(target) = path.strip_prefix("/to/") {
                    let location = format!("http://{target}:{}/", addr.port());
                    response = response.status(302).header("location", location);
                    "moved"
                } else {
                    if name.starts_with("slow.") {
                        delay = Duration::from_millis(400);
                    }
                    "hello"
                };
                let response = response
                    .body(Full::new(Bytes::from(body)))
                    .unwrap_or_default();
                async move {
                    tokio::time::sleep(delay).await;
                    Ok::<_, Infallible>(response)
                }
            });
            tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
        }
    });
    addr
}

/// The README's examples, compiled (and those that need no network run) as
/// doctests of this package, which depends on every crate they use.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

/// The guide's examples, compiled the same way.
#[cfg(doctest)]
#[doc = include_str!("../../docs/GUIDE.md")]
struct GuideDoctests;

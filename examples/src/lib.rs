//! Runnable examples of redislimit; see `examples/examples/` and run one
//! with `cargo run -p examples --example NAME`.
//!
//! The examples need no network: [`local_upstream`] serves every host name
//! on loopback, and each example points its host names at it.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod crawl;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Starts a loopback HTTP server answering for any host name, and returns
/// its address. It prints one line per request it receives (time since it
/// started, host, path), so the pacing shows on the server side:
///
/// - `/busy`: `429 Too Many Requests` with `Retry-After: 1`, the first time;
/// - `/flaky`: `503 Service Unavailable` twice, then `200`;
/// - anything else: `200` with a greeting.
pub async fn local_upstream() -> SocketAddr {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let started = Instant::now();
    let (busy, flaky) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (busy, flaky) = (Arc::clone(&busy), Arc::clone(&flaky));
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let host = req
                    .headers()
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("?")
                    .to_owned();
                let path = req.uri().path().to_owned();
                println!(
                    "    server: {:>5} ms  {host}{path}",
                    started.elapsed().as_millis()
                );
                let mut response = http::Response::builder();
                let body = match path.as_str() {
                    "/busy" if busy.fetch_add(1, Ordering::SeqCst) == 0 => {
                        response = response.status(429).header("retry-after", "1");
                        "slow down"
                    }
                    "/flaky" if flaky.fetch_add(1, Ordering::SeqCst) < 2 => {
                        response = response.status(503);
                        "try again"
                    }
                    _ => "hello",
                };
                let response = response
                    .body(Full::new(Bytes::from(body)))
                    .unwrap_or_default();
                async move { Ok::<_, Infallible>(response) }
            });
            tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
        }
    });
    addr
}

/// The README's examples, compiled (and the in-process one run) as doctests
/// of this package, which depends on every crate they use.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

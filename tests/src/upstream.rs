//! [`Upstream`]: a recording HTTP/1.1 server on loopback, for checking pacing
//! where it matters: at the server.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body::{Body, Frame};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::record::{Recorder, Request};

/// A real HTTP server on `127.0.0.1` and a free port that answers for any
/// host name (point names such as `a.test` at it with the client's resolve
/// override) and records, per request, the host, the `x-replica` header, the
/// instant it arrived and the instant its response body ended (was fully
/// written, or dropped).
///
/// What it answers, by path:
/// - `/slow?chunks=N&every=MS`: a body of `N` chunks, one every `MS` ms;
/// - `/bytes?size=N`: a body of `N` bytes (see [`body_size`]);
/// - `/status?code=C&retry_after=V`: status `C` with `Retry-After: V`;
/// - `/status?code=C&retry_in=S`: status `C` with `Retry-After` an HTTP-date
///   `S` seconds from now and a `Date` header;
/// - `/status?code=C&retry_in=S&date_skew=K`: the same, with the `Date`
///   header (and the `Retry-After` date) shifted `K` seconds into the past,
///   as a server with a wrong clock would send;
/// - `/redirect?code=C&to=URL`: status `C` (a 3xx) with `Location: URL`
///   (percent-encoded in the query; see [`Upstream::redirect_url`]);
/// - `/robots.txt`: what [`Upstream::set_robots`] set for the host, else `404`;
/// - `/outage?until=MS`: `503` without `Retry-After` until the Unix time `MS` (ms);
/// - `/headers?set=NAME:VALUE&...`: `200` with those headers (see [`Upstream::headers_url`]);
/// - `/budget?style=S&limit=N&window=MS`: a rate limit of `N` requests per
///   host per fixed window of `MS` ms (aligned to the Unix clock), told in
///   headers of style `S` (`ietf`: `RateLimit` and `RateLimit-Policy`;
///   `github`: `X-RateLimit-*` with an epoch `X-RateLimit-Reset` and a
///   `Date`); beyond it `429` without `Retry-After` (see [`Upstream::windows`]);
///   with `unit=content-bytes&size=B` (IETF style), `N` bytes of bodies of
///   `B` bytes each (a `Content-Length` told); with
///   `unit=concurrent-requests&chunks=C&every=MS2`, `N` requests in flight
///   at once, each a body of `C` chunks `MS2` ms apart (`qu` names the unit);
/// - anything else: `200 ok`.
///
/// Stops when dropped.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    recorder: Arc<Recorder>,
    arrivals: Arc<AtomicUsize>,
    robots: Robots,
    budgets: Budgets,
    /// Stops the server's thread when sent or dropped.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The `/budget` windows per host: window index -> (admitted, refused).
type Budgets = Arc<Mutex<HashMap<String, std::collections::BTreeMap<u64, (u64, u64)>>>>;

/// The `/robots.txt` answer per host: status and body.
type Robots = Arc<Mutex<HashMap<String, (u16, String)>>>;

impl Upstream {
    /// Starts the server on a thread and a runtime of its own, at a higher
    /// scheduling priority where allowed (`renice -10`, as root): it stamps
    /// each request as it arrives, and a test runtime busy with its own
    /// tasks (or a machine busy with the replicas) once made it stamp a
    /// request 23 ms late, so that two requests sent 82 ms apart arrived
    /// "59 ms" apart. (`async` so that callers keep starting it from their
    /// runtime; it uses none of it.)
    pub async fn start() -> Self {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into()).await
    }

    /// [`start`](Self::start) on address `ip` (such as `127.0.0.2`, another
    /// loopback address: a second machine, to a client keying by address).
    pub async fn start_on(ip: std::net::IpAddr) -> Self {
        let listener = std::net::TcpListener::bind((ip, 0)).expect("bind a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("local address");
        let recorder = Arc::new(Recorder::new());
        let arrivals = Arc::new(AtomicUsize::new(0));
        let robots = Robots::default();
        let budgets = Budgets::default();
        let (rec, arrived, robots_, budgets_) = (
            Arc::clone(&recorder),
            Arc::clone(&arrivals),
            Arc::clone(&robots),
            Arc::clone(&budgets),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("upstream".into())
            .spawn(move || {
                raise_priority();
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the upstream's runtime");
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("a Tokio listener");
                    let serve = async move {
                        loop {
                            let Ok((stream, _)) = listener.accept().await else {
                                continue;
                            };
                            // A response's last chunk is a small write of its own: with
                            // Nagle's algorithm it waits for the client's delayed ACK
                            // (40 ms), which capped a crawl over thousands of hosts at
                            // about 900 requests a second.
                            let _ = stream.set_nodelay(true);
                            let (rec, arrived, robots, budgets) = (
                                Arc::clone(&rec),
                                Arc::clone(&arrived),
                                Arc::clone(&robots_),
                                Arc::clone(&budgets_),
                            );
                            tokio::spawn(async move {
                                let service = service_fn(move |req| {
                                    arrived.fetch_add(1, Ordering::SeqCst);
                                    let (rec, robots, budgets) = (
                                        Arc::clone(&rec),
                                        Arc::clone(&robots),
                                        Arc::clone(&budgets),
                                    );
                                    async move {
                                        Ok::<_, Infallible>(answer(req, rec, &robots, &budgets))
                                    }
                                });
                                let _ = http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            });
                        }
                    };
                    // Dropped with the `Upstream` (or its sender): the
                    // runtime ends, and its connections with it.
                    tokio::select! {
                        () = serve => {}
                        _ = stopped => {}
                    }
                });
            })
            .expect("start the upstream's thread");
        Self {
            addr,
            recorder,
            arrivals,
            robots,
            budgets,
            stop: Some(stop),
        }
    }

    /// What `/budget` counted for `host`: per window from the first it
    /// saw a request in to the last (those without any included), the
    /// requests it admitted and those it refused with `429`.
    pub fn windows(&self, host: &str) -> Vec<(u64, u64)> {
        let budgets = self
            .budgets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(windows) = budgets.get(host) else {
            return Vec::new();
        };
        let (Some(first), Some(last)) = (windows.keys().next(), windows.keys().next_back()) else {
            return Vec::new();
        };
        (*first..=*last)
            .map(|i| windows.get(&i).copied().unwrap_or_default())
            .collect()
    }

    /// What `/robots.txt` on `host` answers from now on (by default `404`).
    pub fn set_robots(&self, host: &str, status: u16, body: &str) {
        self.robots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(host.to_owned(), (status, body.to_owned()));
    }

    /// Requests that have arrived so far, finished or not.
    pub fn arrivals(&self) -> usize {
        self.arrivals.load(Ordering::SeqCst)
    }

    /// The address to resolve every test host name to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://{host}:{port}{path}`.
    pub fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.addr.port())
    }

    /// A URL on `host` answering `code` (a 3xx) with `Location: to`.
    pub fn redirect_url(&self, host: &str, to: &str, code: u16) -> String {
        let to: String = url::form_urlencoded::byte_serialize(to.as_bytes()).collect();
        self.url(host, &format!("/redirect?code={code}&to={to}"))
    }

    /// A URL on `host` answering `200` with the response headers `set`.
    pub fn headers_url(&self, host: &str, set: &[(&str, &str)]) -> String {
        let query: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(set.iter().map(|(n, v)| ("set", format!("{n}:{v}"))))
            .finish();
        self.url(host, &format!("/headers?{query}"))
    }

    /// The recorder of every request served.
    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.recorder
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Lowers the calling thread's nice value to -10 when the process may (as
/// root); otherwise leaves it. Linux applies a thread id's priority to that
/// thread alone.
fn raise_priority() {
    let Ok(me) = std::fs::read_link("/proc/thread-self") else {
        return;
    };
    let Some(tid) = me.file_name().and_then(|t| t.to_str()).map(str::to_owned) else {
        return;
    };
    let _ = std::process::Command::new("renice")
        .args(["-n", "-10", "-p", &tid])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

fn query(req: &http::Request<Incoming>, key: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| v.replace("%20", " ").replace("%2C", ","))
    })
}

fn answer(
    req: http::Request<Incoming>,
    recorder: Arc<Recorder>,
    robots: &Robots,
    budgets: &Budgets,
) -> Response<Recorded> {
    let arrived = Instant::now();
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(|h| h.rsplit_once(':').map_or(h, |(name, _)| name).to_owned())
        .unwrap_or_default();
    let replica = req
        .headers()
        .get("x-replica")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse().ok())
        .unwrap_or(0);
    let number = |key| query(&req, key).and_then(|v| v.parse::<u64>().ok());
    let mut response = Response::builder();
    let budgets_handle = budgets;
    let mut release = None;
    let chunks = match req.uri().path() {
        "/slow" => Chunks::new(
            number("chunks").unwrap_or(3),
            Duration::from_millis(number("every").unwrap_or(50)),
        ),
        "/bytes" => Chunks::with_body(Bytes::from(vec![
            b'x';
            number("size").unwrap_or(0) as usize
        ])),
        "/status" => {
            let code = number("code").and_then(|c| StatusCode::from_u16(c as u16).ok());
            response = response.status(code.unwrap_or(StatusCode::OK));
            if let Some(value) = query(&req, "retry_after") {
                response = response.header(header::RETRY_AFTER, value);
            }
            if let Some(secs) = number("retry_in") {
                let skew = Duration::from_secs(number("date_skew").unwrap_or(0));
                let now = SystemTime::now() - skew;
                response = response
                    .header(header::DATE, httpdate::fmt_http_date(now))
                    .header(
                        header::RETRY_AFTER,
                        httpdate::fmt_http_date(now + Duration::from_secs(secs)),
                    );
            }
            Chunks::new(1, Duration::ZERO)
        }
        "/outage" => {
            // `/outage?until=<Unix ms>`: `503` (no Retry-After) until then.
            let now_ms = SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            if number("until").is_some_and(|until| now_ms < until) {
                response = response.status(StatusCode::SERVICE_UNAVAILABLE);
            }
            Chunks::new(1, Duration::ZERO)
        }
        "/robots.txt" => {
            let set = robots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&host)
                .cloned();
            let (status, body) = set.unwrap_or((404, String::new()));
            response =
                response.status(StatusCode::from_u16(status).unwrap_or(StatusCode::NOT_FOUND));
            Chunks::with_body(Bytes::from(body))
        }
        "/headers" => {
            // `/headers?set=<percent-encoded NAME:VALUE>&set=...`: a 200
            // with those response headers (a `code=N` changes the status).
            let pairs: Vec<(String, String)> = req
                .uri()
                .query()
                .map(|q| {
                    url::form_urlencoded::parse(q.as_bytes())
                        .filter(|(k, _)| k == "set")
                        .filter_map(|(_, v)| {
                            let (name, value) = v.split_once(':')?;
                            Some((name.to_owned(), value.to_owned()))
                        })
                        .collect()
                })
                .unwrap_or_default();
            if let Some(code) = number("code").and_then(|c| StatusCode::from_u16(c as u16).ok()) {
                response = response.status(code);
            }
            for (name, value) in pairs {
                response = response.header(name, value);
            }
            Chunks::new(1, Duration::ZERO)
        }
        "/budget" => {
            let limit = number("limit").unwrap_or(5);
            let window = number("window").unwrap_or(2000).max(1);
            let now = SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let now_ms = now.as_millis() as u64;
            let index = now_ms / window;
            let end_ms = (index + 1) * window;
            let unit = query(&req, "unit").unwrap_or_else(|| "requests".into());
            let size = number("size").unwrap_or(3);
            let mut budgets = budgets
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Requests in flight to the host now (concurrent-requests).
            let in_flight = budgets
                .get(&format!("in-flight {host}"))
                .and_then(|w| w.get(&0))
                .map_or(0, |c| c.0);
            let counts = budgets
                .entry(host.clone())
                .or_default()
                .entry(index)
                .or_default();
            // What one more request would use, in the budget's unit.
            let (used, cost) = match unit.as_str() {
                "content-bytes" => (counts.0 * size, size),
                "concurrent-requests" => (in_flight, 1),
                _ => (counts.0, 1),
            };
            let admitted = used + cost <= limit;
            if admitted {
                counts.0 += 1;
            } else {
                counts.1 += 1;
                response = response.status(StatusCode::TOO_MANY_REQUESTS);
            }
            let left = limit - used - if admitted { cost } else { 0 };
            let t = (end_ms - now_ms).div_ceil(1000);
            let w = window.div_ceil(1000);
            match (query(&req, "style").as_deref(), unit.as_str()) {
                (Some("github"), _) => {
                    response = response
                        .header(header::DATE, httpdate::fmt_http_date(SystemTime::now()))
                        .header("x-ratelimit-limit", limit)
                        .header("x-ratelimit-remaining", left)
                        .header("x-ratelimit-used", counts.0)
                        .header("x-ratelimit-reset", end_ms.div_ceil(1000));
                }
                (_, "requests") => {
                    // Whole seconds, rounded up: never before the reset.
                    response = response
                        .header("ratelimit", format!(r#""default";r={left};t={t}"#))
                        .header("ratelimit-policy", format!(r#""default";q={limit};w={w}"#));
                }
                (_, unit) => {
                    response = response
                        .header("ratelimit", format!(r#""default";r={left};t={t}"#))
                        .header(
                            "ratelimit-policy",
                            format!(r#""default";q={limit};qu="{unit}";w={w}"#),
                        );
                }
            }
            match unit.as_str() {
                "content-bytes" if admitted => {
                    response = response.header(header::CONTENT_LENGTH, size);
                    Chunks::with_body(Bytes::from(vec![b'x'; size as usize]))
                }
                "concurrent-requests" if admitted => {
                    budgets
                        .entry(format!("in-flight {host}"))
                        .or_default()
                        .entry(0)
                        .or_default()
                        .0 += 1;
                    release = Some(InFlight(Arc::clone(budgets_handle), host.clone()));
                    Chunks::new(
                        number("chunks").unwrap_or(3),
                        Duration::from_millis(number("every").unwrap_or(100)),
                    )
                }
                _ => Chunks::new(1, Duration::ZERO),
            }
        }
        "/loop" => {
            // Redirects to itself, query and all.
            let own = req.uri().path_and_query().map(|p| p.to_string());
            response = response.status(StatusCode::FOUND);
            if let Some(own) = own {
                response = response.header(header::LOCATION, own);
            }
            Chunks::new(1, Duration::ZERO)
        }
        "/redirect" => {
            // `/redirect?to=<percent-encoded URL>&code=<3xx>`: the whole
            // target, so chains and cross-host hops can be built.
            let to = req.uri().query().and_then(|q| {
                url::form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == "to")
                    .map(|(_, v)| v.into_owned())
            });
            let code = number("code").and_then(|c| StatusCode::from_u16(c as u16).ok());
            response = response.status(code.unwrap_or(StatusCode::FOUND));
            if let Some(to) = to {
                response = response.header(header::LOCATION, to);
            }
            Chunks::new(1, Duration::ZERO)
        }
        _ => Chunks::new(1, Duration::ZERO),
    };
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let body = Recorded {
        chunks,
        release,
        record: Some((
            Request {
                host,
                replica,
                path,
                status: 200,
                send: arrived,
                end: arrived,
            },
            recorder,
        )),
    };
    let mut response = response
        .body(body)
        .unwrap_or_else(|_| Response::new(Recorded::empty()));
    let status = response.status().as_u16();
    if let Some((request, _)) = &mut response.body_mut().record {
        request.status = status;
    }
    response
}

/// The size of the body a request recorded with `path` was served: `N`
/// for `/bytes?size=N`, 0 for anything else.
pub fn body_size(path: &str) -> u64 {
    path.strip_prefix("/bytes?size=")
        .and_then(|n| n.split('&').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A response body that records the request when it ends or is dropped.
#[derive(Debug)]
pub(crate) struct Recorded {
    chunks: Chunks,
    /// A `/budget` request of `concurrent-requests` in flight, let go at the end.
    release: Option<InFlight>,
    record: Option<(Request, Arc<Recorder>)>,
}

/// A request in flight to the host, counted in the budgets under
/// `in-flight <host>`.
#[derive(Debug)]
struct InFlight(Budgets, String);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut budgets = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = budgets
            .get_mut(&format!("in-flight {}", self.1))
            .and_then(|w| w.get_mut(&0))
        {
            count.0 = count.0.saturating_sub(1);
        }
    }
}

impl Recorded {
    fn empty() -> Self {
        Self {
            chunks: Chunks::new(0, Duration::ZERO),
            release: None,
            record: None,
        }
    }

    fn finish(&mut self) {
        self.release.take();
        if let Some((mut request, recorder)) = self.record.take() {
            request.end = Instant::now();
            recorder.add(request);
        }
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Body for Recorded {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.chunks.poll_next(cx) {
            Poll::Ready(None) => {
                self.finish();
                Poll::Ready(None)
            }
            other => other.map(|c| c.map(|bytes| Ok(Frame::data(bytes)))),
        }
    }
}

/// `left` chunks of `ok\n`, one every `every`.
#[derive(Debug)]
struct Chunks {
    left: u64,
    every: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A body of its own instead of `ok` chunks.
    whole: Option<Bytes>,
}

impl Chunks {
    fn new(left: u64, every: Duration) -> Self {
        Self {
            left,
            every,
            timer: None,
            whole: None,
        }
    }

    fn with_body(body: Bytes) -> Self {
        Self {
            left: 0,
            every: Duration::ZERO,
            timer: None,
            whole: Some(body),
        }
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if let Some(whole) = self.whole.take() {
            return Poll::Ready(Some(whole));
        }
        if self.left == 0 {
            return Poll::Ready(None);
        }
        if !self.every.is_zero() {
            let every = self.every;
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.timer = None;
        }
        self.left -= 1;
        Poll::Ready(Some(Bytes::from_static(b"ok\n")))
    }
}

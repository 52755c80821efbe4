//! `Crawler`: fetches URLs through the pacing middleware, with bounded
//! concurrency, interleaving hosts so one slow host does not hold up the rest.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{IsTerminal, LineWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use http::Extensions;
use indicatif::{ProgressBar, ProgressStyle};
use redislimit::http::retry_after;
use redislimit::{HostKey, Limiter};
use redislimit_reqwest::{PacingMiddleware, pacing_error};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use url::Url;

use super::Args;

/// What happened to one URL; one line of the `--report` file.
#[derive(Debug, Clone, Serialize)]
pub struct Fetched {
    /// The URL.
    pub url: String,
    /// Its host key.
    pub host: String,
    /// The response status, when there was a response.
    pub status: Option<u16>,
    /// Why there was no (complete) response.
    pub error: Option<String>,
    /// When the request was sent (Unix epoch milliseconds).
    pub start_ms: u64,
    /// When the body had been read to the end, or the request failed.
    pub end_ms: u64,
    /// How long it waited for its host's turn.
    pub waited_ms: u64,
    /// The delay a `Retry-After` header asked for, if any.
    pub retry_after_ms: Option<u64>,
}

/// When the request left, stamped by a middleware inside the pacing one.
#[derive(Debug, Clone, Copy)]
struct SentAt(SystemTime, Instant);

#[derive(Debug)]
struct Stamp;

#[async_trait::async_trait]
impl Middleware for Stamp {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        extensions.insert(SentAt(SystemTime::now(), Instant::now()));
        next.run(req, extensions).await
    }
}

/// Fetches URLs, paced per host by a shared limiter.
#[derive(Debug, Clone)]
pub struct Crawler {
    client: ClientWithMiddleware,
    concurrency: usize,
    report: Option<Arc<Mutex<LineWriter<File>>>>,
    /// Set when a report line could not be written.
    report_failed: Arc<std::sync::atomic::AtomicBool>,
}

fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Crawler {
    /// A crawler pacing through `limiter`, with the client settings of `args`
    /// (resolve overrides, headers, timeout, engine, concurrency).
    pub fn new(limiter: Arc<dyn Limiter>, args: &Args) -> anyhow::Result<Self> {
        let mut http = reqwest::Client::builder().timeout(args.timeout);
        for (host, ip) in &args.resolve {
            http = http.resolve(host, (*ip, 0).into());
        }
        let mut headers = http::HeaderMap::new();
        for (name, value) in &args.headers {
            headers.append(
                http::HeaderName::from_bytes(name.as_bytes())?,
                value.parse()?,
            );
        }
        let http = http
            .default_headers(headers)
            .build()
            .context("cannot build the HTTP client")?;
        let mut pacing = PacingMiddleware::from_arc(limiter).with_engine(args.engine.clone());
        if let Some(max_wait) = args.max_wait {
            pacing = pacing.with_max_wait(max_wait);
        }
        let client = ClientBuilder::new(http).with(pacing).with(Stamp).build();
        Ok(Self {
            client,
            concurrency: args.concurrency.max(1),
            report: None,
            report_failed: Arc::default(),
        })
    }

    /// Also writes one JSON line per request to `path`.
    pub fn with_report(mut self, path: &Path) -> anyhow::Result<Self> {
        let file =
            File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
        self.report = Some(Arc::new(Mutex::new(LineWriter::new(file))));
        Ok(self)
    }

    /// Fetches every URL once; returns what happened to each, in the order
    /// they finished. `progress` shows a bar on stderr when it is a terminal.
    pub async fn run(&self, urls: Vec<Url>, progress: bool) -> anyhow::Result<Vec<Fetched>> {
        let bar = if progress && std::io::stderr().is_terminal() {
            let style = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            ProgressBar::new(urls.len() as u64).with_style(style)
        } else {
            ProgressBar::hidden()
        };
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let mut tasks = JoinSet::new();
        let mut done = Vec::with_capacity(urls.len());
        for url in interleave_by_host(urls) {
            let slot = Arc::clone(&slots).acquire_owned().await?;
            let this = self.clone();
            tasks.spawn(async move {
                let fetched = this.fetch(url).await;
                drop(slot);
                fetched
            });
            while let Some(finished) = tasks.try_join_next() {
                done.push(self.finish(finished?, &bar));
            }
        }
        while let Some(finished) = tasks.join_next().await {
            done.push(self.finish(finished?, &bar));
        }
        bar.finish_and_clear();
        Ok(done)
    }

    /// An error when any report line could not be written: a crawl whose
    /// report is incomplete must not look like a success.
    pub fn check_report(&self) -> anyhow::Result<()> {
        if self
            .report_failed
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            anyhow::bail!("the report is incomplete: some lines could not be written");
        }
        Ok(())
    }

    fn finish(&self, fetched: Fetched, bar: &ProgressBar) -> Fetched {
        if let Some(report) = &self.report
            && let Ok(line) = serde_json::to_string(&fetched)
        {
            let mut report = report
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(err) = writeln!(report, "{line}") {
                eprintln!("crawl: cannot write the report: {err}");
                self.report_failed
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        bar.set_message(fetched.host.clone());
        bar.inc(1);
        fetched
    }

    async fn fetch(&self, url: Url) -> Fetched {
        let queued = Instant::now();
        let host = HostKey::from_url(&url)
            .map(|h| h.to_string())
            .unwrap_or_default();
        let mut extensions = Extensions::new();
        let mut status = None;
        let mut retry_after_ms = None;
        let result = match self.client.get(url.clone()).build() {
            Ok(request) => {
                self.client
                    .execute_with_extensions(request, &mut extensions)
                    .await
            }
            Err(err) => Err(reqwest_middleware::Error::Reqwest(err)),
        };
        let error = match result {
            Ok(response) => {
                status = Some(response.status().as_u16());
                retry_after_ms = retry_after(response.headers(), SystemTime::now())
                    .map(|d| d.as_millis() as u64);
                response
                    .bytes()
                    .await
                    .err()
                    .map(|e| format!("reading the body: {e}"))
            }
            Err(err) => Some(match pacing_error(&err) {
                Some(pacing) => format!("not sent: {pacing}"),
                None => err.to_string(),
            }),
        };
        let end = SystemTime::now();
        let (start, waited) = match extensions.get::<SentAt>() {
            Some(SentAt(at, instant)) => (*at, instant.saturating_duration_since(queued)),
            None => (end, queued.elapsed()),
        };
        Fetched {
            url: url.to_string(),
            host,
            status,
            error,
            start_ms: epoch_ms(start),
            end_ms: epoch_ms(end),
            waited_ms: waited.as_millis() as u64,
            retry_after_ms,
        }
    }
}

/// Orders `urls` round-robin over their hosts, each host's in input order.
fn interleave_by_host(urls: Vec<Url>) -> Vec<Url> {
    let mut by_host: BTreeMap<String, VecDeque<Url>> = BTreeMap::new();
    let mut order = Vec::new();
    for url in urls {
        let host = url.host_str().unwrap_or_default().to_owned();
        if !by_host.contains_key(&host) {
            order.push(host.clone());
        }
        by_host.entry(host).or_default().push_back(url);
    }
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for host in &order {
            if let Some(url) = by_host.get_mut(host).and_then(VecDeque::pop_front) {
                out.push(url);
            }
        }
        if out.len() == before {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_interleaved_in_input_order() {
        let urls = [
            "http://a/1",
            "http://a/2",
            "http://a/3",
            "http://b/1",
            "http://c/1",
            "http://b/2",
        ]
        .map(|u| Url::parse(u).unwrap())
        .to_vec();
        let out: Vec<_> = interleave_by_host(urls)
            .iter()
            .map(|u| u.to_string())
            .collect();
        assert_eq!(
            out,
            [
                "http://a/1",
                "http://b/1",
                "http://c/1",
                "http://a/2",
                "http://b/2",
                "http://a/3"
            ]
        );
    }
}

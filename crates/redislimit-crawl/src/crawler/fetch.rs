//! One URL's attempts: asking for its host's turn (with or without a slot),
//! sending it through the pacing client, and the report line it becomes; and
//! the robots.txt each host is asked for first.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::Extensions;
use redislimit_reqwest::Redirects;
use url::Url;

use super::slots::{Admitted, Ask, CrawlDelay, SentAt, SlotGate, Slots};
use super::*;

impl Crawler {
    /// The robots.txt rules of `first`'s origin: kept (for the fleet with
    /// Redis, else for the process), or fetched through the pacing client
    /// (a request to the host like any other) by one replica while the
    /// others wait, asked again after `retry` when there is no answer or a
    /// 5xx, up to [`ROBOTS_ATTEMPTS`] times. `None` when the crawl was
    /// stopped.
    pub(super) async fn robots_rules(
        &self,
        robots: &RobotsOptions,
        first: &Url,
        slots: &Arc<Slots>,
        stop: &mut watch::Receiver<StopLevel>,
    ) -> Option<Rules> {
        let url = robots_url(first);
        let origin = url.origin().ascii_serialization();
        let fetch = |before: Option<Record>| self.fetch_robots(robots, url, slots, before);
        let record = tokio::select! {
            record = robots.cache.get_or_fetch(&origin, robots.wait, fetch) => record,
            () = stopped(stop, StopLevel::Graceful) => return None,
        };
        Some(record.rules(&robots.agent))
    }

    /// Fetches robots.txt at `url`: the record of its first answer that
    /// decides, or unavailable after [`ROBOTS_ATTEMPTS`] (`before`: what
    /// was kept, counting failures in a row).
    async fn fetch_robots(
        &self,
        robots: &RobotsOptions,
        url: Url,
        slots: &Arc<Slots>,
        before: Option<Record>,
    ) -> Record {
        let mut why = String::new();
        for attempt in 0..ROBOTS_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(robots.retry).await;
            }
            let answer = self.get_small(&url, slots).await;
            if let Some(record) = answer
                .as_ref()
                .ok()
                .and_then(|(status, body)| Record::from_status(*status, body.clone()))
            {
                return record;
            }
            why = match answer {
                Ok((status, _)) => format!("status {status}"),
                Err(err) => err,
            };
            tracing::warn!(url = %redact(&url), attempt = attempt + 1, "robots.txt unavailable: {why}");
        }
        Record::unavailable(before.as_ref(), why)
    }

    /// GETs `url` (taking a slot to send, as every request), and reads at
    /// most [`ROBOTS_MAX_BYTES`] of its body.
    pub(super) async fn get_small(
        &self,
        url: &Url,
        slots: &Arc<Slots>,
    ) -> Result<(u16, Vec<u8>), String> {
        let mut slot = None;
        loop {
            let mut asking = None;
            if slot.is_none() {
                match slots.ask().await {
                    Some(Ask::Free(free)) => asking = Some(free),
                    Some(Ask::Holding(held)) => slot = Some(held),
                    None => return Err("the crawl's slots are closed".to_owned()),
                }
            }
            let gate = SlotGate::new(&slots.free, slot.take());
            let mut extensions = Extensions::new();
            extensions.insert(gate.clone());
            let request = self
                .client
                .get(url.clone())
                .build()
                .map_err(|e| error_chain(&e))?;
            let result = self
                .client
                .execute_with_extensions(request, &mut extensions)
                .await;
            drop(asking);
            let response = match result {
                Ok(response) => response,
                Err(err) if NotSent::is(&err) => {
                    slot = Arc::clone(&slots.free).acquire_owned().await.ok();
                    continue;
                }
                Err(err) => return Err(error_chain(&err)),
            };
            let status = response.status().as_u16();
            let mut body = Vec::new();
            let mut response = response;
            while let Some(chunk) = response.chunk().await.map_err(|e| error_chain(&e))? {
                body.extend_from_slice(&chunk);
                if body.len() >= ROBOTS_MAX_BYTES {
                    body.truncate(ROBOTS_MAX_BYTES);
                    break;
                }
            }
            gate.free();
            return Ok((status, body));
        }
    }

    /// One try at `url`: waits for its host's turn (at most what
    /// `--max-wait` leaves, counted from `queued`; at most [`SLOT_WAIT`]
    /// when `probe`, as it holds a slot), then sends and reads the body,
    /// unless the crawl is aborted.
    pub(super) async fn attempt(
        self,
        url: Url,
        queued: Instant,
        gate: SlotGate,
        probe: bool,
        crawl_delay: Option<CrawlDelay>,
        admitted: oneshot::Sender<()>,
    ) -> Attempt {
        let left = self.max_wait.map(|m| m.saturating_sub(queued.elapsed()));
        let budget = match (probe, left) {
            (true, Some(left)) => Some(SLOT_WAIT.min(left)),
            (true, None) => Some(SLOT_WAIT),
            (false, left) => left,
        };
        let mut extensions = Extensions::new();
        if let Some(budget) = budget {
            extensions.insert(MaxWait(budget));
        }
        extensions.insert(gate.clone());
        extensions.insert(Admitted(Arc::new(Mutex::new(Some(admitted)))));
        if let Some(delay) = crawl_delay {
            extensions.insert(delay);
        }
        let mut stop = self.stop.watch();
        let attempt = tokio::select! {
            attempt = self.fetch(url.clone(), queued, left, &mut extensions) => attempt,
            () = stopped(&mut stop, StopLevel::Abort) => {
                let sent = extensions.get::<SentAt>().copied();
                let error = Some("aborted: the crawl was stopped".to_owned());
                Attempt::Done(Box::new(self.fetched(&url, queued, sent, None, error)))
            }
        };
        gate.free();
        attempt
    }

    /// Sends `url` and reads its body. `left` is what `--max-wait` leaves.
    pub(super) async fn fetch(
        &self,
        url: Url,
        queued: Instant,
        left: Option<Duration>,
        extensions: &mut Extensions,
    ) -> Attempt {
        if let Some(&priority) = self.priorities.get(&url) {
            extensions.insert(RequestPacing::new().with_priority(priority));
        }
        let result = match self.client.get(url.clone()).build() {
            Ok(request) => {
                self.client
                    .execute_with_extensions(request, extensions)
                    .await
            }
            Err(err) => Err(reqwest_middleware::Error::Reqwest(err)),
        };
        let sent = extensions.get::<SentAt>().copied();
        let response = match result {
            Ok(response) => response,
            Err(err) if sent.is_none() && NotSent::is(&err) => return Attempt::NoSlot,
            Err(err) => {
                let error = match pacing_error(&err) {
                    // A wait longer than the slot's budget but within
                    // `--max-wait`: come back when the host is due.
                    Some(Error::WaitBudget { wait, .. })
                        if sent.is_none() && left.is_none_or(|left| *wait < left) =>
                    {
                        return Attempt::NotYet(*wait);
                    }
                    Some(pacing) => {
                        self.stop_on_fatal(pacing);
                        format!("not sent: {}", error_chain(pacing))
                    }
                    None => error_chain(&err),
                };
                let mut fetched = self.fetched(&url, queued, sent, None, Some(error));
                fetched.redirects = redirects(extensions);
                return Attempt::Done(Box::new(fetched));
            }
        };
        let status = response.status();
        // Only a redirect moves it (reqwest drops credentials from the URL
        // it reports, which is no move).
        let final_url = extensions
            .get::<Redirects>()
            .is_some()
            .then(|| redact(response.url()));
        let retry_after = retry_after(response.headers(), SystemTime::now());
        // What the middleware applied for it.
        let signal = response.extensions().get::<ServerSignal>().copied();
        let error = response
            .bytes()
            .await
            .err()
            .map(|e| format!("reading the body: {}", error_chain(&e)));
        let mut fetched = self.fetched(&url, queued, sent, Some(status.as_u16()), error);
        fetched.retry_after_ms = retry_after.map(millis);
        fetched.hold_ms = signal.map(|s| millis(s.hold().min(self.max_penalty)));
        fetched.asked = signal.map(|s| s.cause().to_owned());
        fetched.redirects = redirects(extensions);
        fetched.final_url = final_url;
        Attempt::Done(Box::new(fetched))
    }

    pub(super) fn priority(&self, url: &Url) -> u8 {
        self.priorities
            .get(url)
            .copied()
            .unwrap_or(RequestPacing::DEFAULT_PRIORITY)
    }

    pub(super) fn fetched(
        &self,
        url: &Url,
        queued: Instant,
        sent: Option<SentAt>,
        status: Option<u16>,
        error: Option<String>,
    ) -> Fetched {
        let host = HostKey::from_url(url)
            .map(|h| self.keys.key(&h).to_string())
            .unwrap_or_default();
        fetched_on(host, url, queued, sent, status, error)
    }

    /// What becomes of `url` when the crawl stops before its turn.
    pub(super) fn unstarted(&self, url: &Url) -> Fetched {
        let mut fetched = self.fetched(url, Instant::now(), None, None, None);
        fetched.not_started = true;
        fetched
    }

    /// Reports each URL of `queue` as not started.
    pub(super) fn not_started(
        &self,
        queue: VecDeque<Kept>,
        lines: &Lines,
        tx: &mpsc::UnboundedSender<Fetched>,
    ) {
        for url in queue.iter().filter_map(|kept| lines.url(kept)) {
            let _ = tx.send(self.unstarted(&url));
        }
    }

    /// An error when any report line could not be written: a crawl whose
    /// report is incomplete must not look like a success.
    pub fn check_report(&self) -> anyhow::Result<()> {
        if self.report.as_ref().is_some_and(|r| r.failed()) {
            anyhow::bail!("the report is incomplete: some lines could not be written");
        }
        Ok(())
    }

    /// Writes `fetched` to the report, if there is one, and counts it on
    /// the bar. A line that cannot be written stops the crawl: no URL
    /// starts after it, and [`fatal`](Self::fatal) says why.
    pub(super) fn finish(&self, fetched: Fetched, bar: &ProgressBar) -> Fetched {
        if let Some(report) = &self.report
            && let Err(err) = report.write(&fetched)
            && self
                .fatal
                .set(format!("cannot write the report: {err}"))
                .is_ok()
        {
            tracing::error!("cannot write the report: {err}; no more requests start");
            self.stop.graceful();
        }
        bar.set_message(fetched.host.clone());
        bar.inc(1);
        fetched
    }
}

/// The URLs redirected from, as the middleware reported them.
fn redirects(extensions: &Extensions) -> Vec<String> {
    extensions
        .get::<Redirects>()
        .map(|r| r.0.iter().map(redact).collect())
        .unwrap_or_default()
}

/// The report line of `url`, a request to `host` (as the crawl keys it)
/// queued at `queued`.
pub(super) fn fetched_on(
    host: String,
    url: &Url,
    queued: Instant,
    sent: Option<SentAt>,
    status: Option<u16>,
    error: Option<String>,
) -> Fetched {
    let end = SystemTime::now();
    let (start, waited) = match sent {
        Some(SentAt(at, instant)) => (at, instant.saturating_duration_since(queued)),
        None => (end, queued.elapsed()),
    };
    Fetched {
        url: redact(url),
        host,
        status,
        error,
        sent: sent.is_some(),
        start_ms: epoch_ms(start),
        end_ms: epoch_ms(end),
        waited_ms: millis(waited),
        retry_after_ms: None,
        hold_ms: None,
        asked: None,
        redirects: Vec::new(),
        final_url: None,
        skipped: None,
        not_started: false,
    }
}

/// `fetched`, reported as a request whose task failed (it panicked) or
/// ended without an answer.
pub(super) fn task_failed(
    mut fetched: Fetched,
    sent: bool,
    e: Option<tokio::task::JoinError>,
) -> Fetched {
    fetched.sent = sent;
    fetched.error = Some(match e {
        Some(e) => format!("the request's task failed: {e}"),
        None => "the request's task ended without an answer".to_owned(),
    });
    fetched
}

/// Sleeps until `at`; false when the crawl was stopped first.
pub(super) async fn sleep_or_stop(at: Instant, stop: &mut watch::Receiver<StopLevel>) -> bool {
    tokio::select! {
        () = tokio::time::sleep_until(at.into()) => true,
        () = stopped(stop, StopLevel::Graceful) => false,
    }
}

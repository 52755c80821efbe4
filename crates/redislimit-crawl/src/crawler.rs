//! `Crawler`: fetches URLs through the pacing middleware. Each host has a
//! queue of its own, sent in input order; a URL waits for its host's turn
//! without holding one of the `--concurrency` slots, which are taken only
//! to send, so a host held back by a long penalty delays nobody else.

use std::collections::{HashMap, VecDeque};
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use redislimit::error::Causes;
use redislimit::http::{
    Backoff, MaxWait, PaceOptions, RateLimitHeaders, ServerSignal, retry_after,
};
use redislimit::{Error, HostKey, Limiter, Policies, RequestPacing};
use redislimit_reqwest::{NotSent, PacingMiddleware, pacing_error};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot, watch};
use url::Url;

mod fetch;
mod play;
mod progress;
mod report;
mod slots;

use self::play::Play;
use self::progress::{Progress, Waiting, note_hold, note_penalty};
pub use self::report::Fetched;
use self::report::Report;
use self::slots::{Ask, CrawlDelay, SlotGate, Slots, Stamp};
use super::Args;
use super::robots::{ROBOTS_ATTEMPTS, ROBOTS_MAX_BYTES, Record, RobotsOptions, Rules, robots_url};
use super::stop::{Stop, StopLevel};
use crate::Frontier;
use crate::frontier::{Kept, Lines};

/// How long a URL that holds a slot may wait for its host (it took the
/// slot when its host was ready, so this is short unless something
/// changed); a longer wait gives the slot back.
const SLOT_WAIT: Duration = Duration::from_millis(100);

/// Whether pacing is shared right now, for the progress line.
pub type ModeProbe = Arc<dyn Fn() -> String + Send + Sync>;

/// Fetches URLs, paced per host by a shared limiter.
#[derive(Clone)]
pub struct Crawler {
    client: ClientWithMiddleware,
    concurrency: usize,
    max_wait: Option<Duration>,
    max_penalty: Duration,
    progress_every: Duration,
    /// What the report's `host` names (the limiter's key).
    keys: Policies,
    /// The priorities the URL file gave.
    priorities: Arc<HashMap<Url, u8>>,
    report: Option<Arc<Report>>,
    stop: Stop,
    mode: ModeProbe,
    limiter: Arc<dyn Limiter>,
    min_delay: Duration,
    robots: Option<Arc<RobotsOptions>>,
    /// The first pacing error that no waiting mends (another replica's
    /// settings hold the scope, a misconfigured Redis): the crawl stops
    /// starting requests, and exits non-zero.
    fatal: Arc<std::sync::OnceLock<String>>,
}

impl std::fmt::Debug for Crawler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crawler")
            .field("concurrency", &self.concurrency)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `url` with any user name and password replaced, for reports and logs.
pub fn redact(url: &Url) -> String {
    if url.username().is_empty() && url.password().is_none() {
        return url.to_string();
    }
    let mut shown = url.clone();
    let _ = shown.set_password(None);
    let _ = shown.set_username("redacted");
    shown.to_string()
}

/// `err` and its causes, each once: `outer: cause: root cause`.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    Causes(err).to_string()
}

/// What became of one attempt at a URL.
enum Attempt {
    /// It ended (sent or not); report it.
    Done(Box<Fetched>),
    /// Its host is not due for at least this long; come back then, without
    /// a slot.
    NotYet(Duration),
    /// Admitted when no slot was free: taken back; try again with a slot.
    NoSlot,
}

/// How long the crawl keeps an idle connection to a host: twice the
/// `--min-delay` (a host in play sends again about that soon), within 1 to
/// 15 s. A host that has sent its last URL leaves play; its connection
/// is closed soon after, so the crawl holds about one connection per host
/// in play, not one per host it has been to (a connection costs the
/// client about 18 KB besides the socket, and the server a socket).
fn idle_connection(min_delay: Duration) -> Duration {
    (min_delay * 2).clamp(Duration::from_secs(1), Duration::from_secs(15))
}

impl Crawler {
    /// A crawler pacing through `limiter`, with the client settings of `args`
    /// (resolve overrides, headers, timeout, engine, concurrency, penalties).
    pub fn new(limiter: Arc<dyn Limiter>, args: &Args) -> anyhow::Result<Self> {
        // The pacing middleware follows redirects, one paced hop at a time.
        let mut http = reqwest::Client::builder()
            .timeout(args.timeout)
            .user_agent(args.user_agent.clone())
            .redirect(reqwest::redirect::Policy::none())
            // A crawl visits thousands of hosts, a few at a time: an idle connection
            // is kept a little longer than a host's next request takes to come
            // (reqwest keeps it 90 s), so a crawl of 100,000 hosts does not hold a
            // socket for each (and the servers do not hold one for it).
            .pool_idle_timeout(idle_connection(args.min_delay));
        for (host, ip) in args
            .resolve
            .iter()
            .filter(|(host, _)| !host.starts_with('*'))
        {
            // Both spellings a URL may carry reach the same address.
            http = http
                .resolve(host, (*ip, 0).into())
                .resolve(&format!("{host}."), (*ip, 0).into());
        }
        if let Some(patterns) = crate::resolve::Patterns::new(&args.resolve) {
            http = http.dns_resolver(Arc::new(patterns));
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
        let mut options = PaceOptions::default().with_engine(args.engine.clone());
        if let Some(max_wait) = args.max_wait {
            options = options.with_max_wait(max_wait);
        }
        if let Some(penalty) = args.default_penalty {
            options = options.with_default_penalty(penalty);
        }
        let backoff =
            (!args.no_backoff).then(|| Backoff::new(Duration::from_secs(1), args.max_penalty));
        let headers = if args.no_rate_limit_headers {
            RateLimitHeaders::Ignore
        } else {
            RateLimitHeaders::Honor
        };
        options = options
            .with_backoff(backoff)
            .with_rate_limit_headers(headers);
        let pacing = PacingMiddleware::from_arc(Arc::clone(&limiter)).with_options(options);
        let client = ClientBuilder::new(http).with(pacing).with(Stamp).build();
        Ok(Self {
            client,
            concurrency: args.concurrency,
            max_wait: args.max_wait,
            max_penalty: args.max_penalty,
            progress_every: args.progress_every,
            keys: Policies::default().with_key_by(args.key_by.into()),
            priorities: Arc::default(),
            report: None,
            stop: Stop::new(),
            mode: Arc::new(|| "in-process".to_owned()),
            limiter,
            min_delay: args.min_delay,
            robots: args.robots.then(|| {
                Arc::new(RobotsOptions {
                    agent: args.user_agent.clone(),
                    max_crawl_delay: args.max_crawl_delay,
                    retry: args.robots_retry,
                    // A fetch's attempts, and a margin.
                    wait: (args.timeout + args.robots_retry) * ROBOTS_ATTEMPTS
                        + Duration::from_secs(5),
                    cache: Default::default(),
                })
            }),
            fatal: Arc::default(),
        })
    }

    /// Also writes one JSON line per URL to `path` (`-`: standard
    /// output), emptied first when it exists. A line that cannot be written
    /// stops the crawl, as [`fatal`](Self::fatal) says.
    pub fn with_report(mut self, path: &Path) -> anyhow::Result<Self> {
        self.report = Some(Arc::new(Report::open(path, false)?));
        Ok(self)
    }

    /// [`with_report`](Self::with_report), adding to the end of `path`
    /// (a crawl resumed from the report it goes on writing).
    pub fn with_report_appended(mut self, path: &Path) -> anyhow::Result<Self> {
        self.report = Some(Arc::new(Report::open(path, true)?));
        Ok(self)
    }

    /// Sends each host's URLs by `priorities` (higher first, input order
    /// among equals; 128 for a URL without one), and asks the limiter at
    /// that priority.
    pub fn with_priorities(mut self, priorities: HashMap<Url, u8>) -> Self {
        self.priorities = Arc::new(priorities);
        self
    }

    /// Names the pacing mode (shared, in fallback, in-process) in the
    /// progress line.
    pub fn with_mode(mut self, mode: ModeProbe) -> Self {
        self.mode = mode;
        self
    }

    /// Names each URL's host in the report by the key `keys` give it:
    /// the limiter's policies (see [`Pacer::keys`](crate::Pacer::keys)),
    /// so that a report keyed by address names the address the limiter
    /// looked up. By default the crawl's `--key-by`, without lookups.
    pub fn with_keys(mut self, keys: Policies) -> Self {
        self.keys = keys;
        self
    }

    /// With `--robots`, keeps each origin's robots.txt outcome for the
    /// fleet in `cache`: one replica fetches it, the others wait for it.
    /// Applies to this crawler whether or not it was cloned before (a clone
    /// made earlier keeps what it had).
    #[cfg(feature = "redis")]
    pub fn with_shared_robots(mut self, cache: redislimit::redis::SharedCache) -> Self {
        if let Some(robots) = self.robots.take() {
            self.robots = Some(RobotsOptions::with_shared(robots, cache));
        }
        self
    }

    /// The handle that stops this crawl (see [`Stop`]).
    pub fn stop_handle(&self) -> Stop {
        self.stop.clone()
    }

    /// The pacing error that stopped the crawl, if one did: another
    /// replica's settings hold the scope (`ConfigMismatch`), or Redis is
    /// misconfigured. No URL starts after it; the caller exits non-zero.
    pub fn fatal(&self) -> Option<&str> {
        self.fatal.get().map(String::as_str)
    }

    /// Stops the crawl on a pacing error that waiting cannot mend.
    fn stop_on_fatal(&self, err: &Error) {
        if matches!(
            err,
            Error::ConfigMismatch { .. } | Error::Misconfigured { .. }
        ) && self.fatal.set(error_chain(err)).is_ok()
        {
            tracing::error!("{}: no more requests start", Causes(err));
            self.stop.graceful();
        }
    }

    /// Fetches every URL once, each host's in input order; returns what
    /// happened to each URL, in the order they finished. `progress` shows a
    /// bar on stderr when it is a terminal, and a line every
    /// `--progress-every` otherwise. After [`Stop::graceful`] no URL
    /// starts; after [`Stop::abort`] requests in flight end at once. Every
    /// URL comes back: those the stop kept from starting marked
    /// [`not_started`](Fetched::not_started).
    pub async fn run(
        &self,
        urls: impl Into<Frontier>,
        progress: bool,
    ) -> anyhow::Result<Vec<Fetched>> {
        let mut done = Vec::new();
        self.run_each(urls, progress, |fetched| done.push(fetched))
            .await?;
        Ok(done)
    }

    /// [`run`](Self::run), handing what happened to each URL to `each` as
    /// it ends instead of keeping it; returns how many it handed. Hosts come
    /// into play a few at a time: 16 per `--concurrency` slot (at least
    /// 64), the next as one sends its last URL, more while slots sit free
    /// that no URL asks for. So a crawl's memory and connections follow
    /// the hosts in play, not the hosts in its file.
    pub async fn run_each(
        &self,
        urls: impl Into<Frontier>,
        progress: bool,
        mut each: impl FnMut(Fetched),
    ) -> anyhow::Result<usize> {
        let frontier = urls.into();
        let total = frontier.len();
        let terminal = std::io::stderr().is_terminal();
        let bar = if progress && terminal {
            let style = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            ProgressBar::new(total as u64).with_style(style)
        } else {
            ProgressBar::hidden()
        };
        let counters = Arc::new(Progress::default());
        let slots = Slots::new(self.concurrency);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let lines = frontier.lines();
        let mut play = Play::new(frontier.into_hosts(), tx, self.concurrency);
        let mut serve = |host: String, mut queue: VecDeque<Kept>, tx| {
            if !self.priorities.is_empty() {
                queue.make_contiguous().sort_by_cached_key(|kept| {
                    std::cmp::Reverse(
                        lines
                            .url(kept)
                            .map_or(RequestPacing::DEFAULT_PRIORITY, |url| self.priority(&url)),
                    )
                });
            }
            let (this, lines) = (self.clone(), lines.clone());
            let (slots, counters) = (Arc::clone(&slots), Arc::clone(&counters));
            async move {
                this.serve_host(host, queue, lines, slots, tx, counters)
                    .await
            }
        };
        let running = || self.stop.level() == StopLevel::Run;
        play.fill(running(), &mut serve);
        let started = Instant::now();
        let mut ticker = tokio::time::interval(self.progress_every);
        ticker.tick().await;
        let mut feed = tokio::time::interval(play::FEED_EVERY);
        let mut ended = 0;
        loop {
            tokio::select! {
                fetched = rx.recv() => match fetched {
                    Some(fetched) => {
                        counters.done.fetch_add(1, Ordering::Relaxed);
                        counters.sent.fetch_add(usize::from(fetched.sent), Ordering::Relaxed);
                        each(self.finish(fetched, &bar));
                        ended += 1;
                    }
                    None => break,
                },
                () = play.host_done() => play.fill(running(), &mut serve),
                _ = feed.tick() => play.widen(slots.idle(), running(), &mut serve),
                _ = ticker.tick(), if progress && !terminal => {
                    self.progress_line(&counters, total, started);
                }
            }
        }
        // Stopped before these hosts came into play.
        for url in play
            .rest()
            .flat_map(|(_, queue)| queue)
            .filter_map(|kept| lines.url(&kept))
        {
            each(self.finish(self.unstarted(&url), &bar));
            ended += 1;
        }
        bar.finish_and_clear();
        if progress && !terminal {
            self.progress_line(&counters, total, started);
        }
        Ok(ended)
    }

    fn progress_line(&self, counters: &Progress, total: usize, started: Instant) {
        let elapsed = started.elapsed().as_secs_f64().max(0.001);
        let sent = counters.sent.load(Ordering::Relaxed);
        // The limiter's own view: the hosts most waited for.
        let snapshot = self.limiter.snapshot(3);
        let top: Vec<String> = snapshot
            .hosts
            .iter()
            .map(|h| format!("{} {}", h.host, h.queued))
            .collect();
        let top = if top.is_empty() {
            String::new()
        } else {
            format!(" (most: {})", top.join(", "))
        };
        tracing::info!(
            target: "crawl",
            "progress: {}/{total} done, {:.1} sent/s, {} hosts waiting{top}, {} penalized, pacing {}{}",
            counters.done.load(Ordering::Relaxed),
            sent as f64 / elapsed,
            counters.waiting.load(Ordering::Relaxed),
            counters.penalized_now(),
            (self.mode)(),
            match self.stop.level() {
                StopLevel::Run => "",
                StopLevel::Graceful => ", stopping",
                StopLevel::Abort => ", aborting",
            },
        );
    }

    /// Sends `queue` (one host's URLs) in order. A URL waits for its
    /// host's turn holding no slot; once admitted it takes a free slot and
    /// is sent, and the next URL starts waiting. Admitted when every slot
    /// is busy, it gives its admission back, waits for a slot, and asks
    /// again holding it, for at most [`SLOT_WAIT`].
    async fn serve_host(
        self,
        host: String,
        mut queue: VecDeque<Kept>,
        lines: Lines,
        slots: Arc<Slots>,
        tx: mpsc::UnboundedSender<Fetched>,
        counters: Arc<Progress>,
    ) {
        let mut stop = self.stop.watch();
        let mut crawl_delay = None;
        let first = queue.front().and_then(|kept| lines.url(kept));
        let rules = match (&self.robots, first.as_ref()) {
            (Some(robots), Some(first)) => {
                let _waiting = Waiting::new(&counters);
                let Some(rules) = self.robots_rules(robots, first, &slots, &mut stop).await else {
                    self.not_started(queue, &lines, &tx);
                    return;
                };
                if let (Some(delay), Ok(key)) = (
                    rules.crawl_delay(robots.max_crawl_delay),
                    HostKey::from_url(first),
                ) && delay > self.min_delay
                {
                    tracing::info!(host = %key, delay_ms = millis(delay), "robots.txt asks for a crawl delay");
                    crawl_delay = Some(CrawlDelay {
                        host: key,
                        delay,
                        limiter: Arc::clone(&self.limiter),
                    });
                }
                Some(rules)
            }
            _ => None,
        };
        'urls: while let Some(kept) = queue.pop_front() {
            let Some(url) = lines.url(&kept) else {
                tracing::warn!(host = %host, "a line of the URL file no longer reads as the URL it held (the file changed during the crawl): skipped");
                continue;
            };
            if let Some(why) = rules.as_ref().and_then(|r| r.refusal(&url)) {
                let mut fetched = self.fetched(&url, Instant::now(), None, None, None);
                fetched.skipped = Some(why);
                let _ = tx.send(fetched);
                continue;
            }
            let queued = Instant::now();
            let _waiting = Waiting::new(&counters);
            let mut slot: Option<OwnedSemaphorePermit> = None;
            let mut not_before = None;
            // Left only by `continue 'urls` once the URL ended, or by a
            // break when the crawl stops before it started.
            'attempts: loop {
                if self.stop.level() != StopLevel::Run {
                    break 'attempts;
                }
                if let Some(at) = not_before.take()
                    && !fetch::sleep_or_stop(at, &mut stop).await
                {
                    break 'attempts;
                }
                // Without a slot kept from the last attempt, ask as `Slots`
                // says: holding a slot when they are scarce.
                let mut asking = None;
                if slot.is_none() {
                    let ask = tokio::select! {
                        ask = slots.ask() => ask,
                        () = stopped(&mut stop, StopLevel::Graceful) => break 'attempts,
                    };
                    match ask {
                        Some(Ask::Free(free)) => asking = Some(free),
                        Some(Ask::Holding(held)) => slot = Some(held),
                        None => break 'attempts,
                    }
                }
                let probe = slot.is_some();
                let gate = SlotGate::new(&slots.free, slot.take());
                let (admitted_tx, mut admitted_rx) = oneshot::channel();
                let this = self.clone();
                let attempt_url = url.clone();
                let delay = crawl_delay.clone();
                let mut task = tokio::spawn(async move {
                    this.attempt(attempt_url, queued, gate, probe, delay, admitted_tx)
                        .await
                });
                // Until it is admitted, a stop cancels the attempt (nothing
                // was sent, nothing stays booked).
                let admitted = tokio::select! {
                    biased;
                    sent = &mut admitted_rx => sent.is_ok(),
                    () = stopped(&mut stop, StopLevel::Graceful) => {
                        task.abort();
                        let _ = (&mut task).await;
                        if admitted_rx.try_recv().is_err() {
                            break 'attempts;
                        }
                        // Admitted as the stop came: it may have left, so
                        // it ended (a resumed crawl must not send it again).
                        let mut fetched = self.fetched(&url, queued, None, None, None);
                        (fetched.sent, fetched.error) = (true, Some("stopped as it was sent".into()));
                        let _ = tx.send(fetched);
                        continue 'urls;
                    }
                };
                // Admitted (holding a slot now) or done asking.
                drop(asking);
                if admitted {
                    let (tx, counters) = (tx.clone(), Arc::clone(&counters));
                    let max_penalty = self.max_penalty;
                    let host = host.clone();
                    tokio::spawn(async move {
                        match task.await {
                            Ok(Attempt::Done(fetched)) => {
                                note_penalty(
                                    &counters,
                                    &fetched.host,
                                    fetched.hold_ms,
                                    max_penalty,
                                );
                                let _ = tx.send(*fetched);
                            }
                            // Admitted, so it may have left: reported as
                            // sent (a resumed crawl must not send it again).
                            outcome => {
                                let lost = fetch::fetched_on(host, &url, queued, None, None, None);
                                let _ = tx.send(fetch::task_failed(lost, true, outcome.err()));
                            }
                        }
                    });
                    continue 'urls;
                }
                match task.await {
                    Ok(Attempt::Done(fetched)) => {
                        note_penalty(&counters, &fetched.host, fetched.hold_ms, self.max_penalty);
                        let _ = tx.send(*fetched);
                        continue 'urls;
                    }
                    Ok(Attempt::NotYet(wait)) => {
                        if wait >= Duration::from_secs(1) {
                            note_hold(&counters, &host, wait);
                        }
                        not_before = Some(Instant::now() + wait.saturating_sub(SLOT_WAIT));
                    }
                    Ok(Attempt::NoSlot) => {
                        slot = tokio::select! {
                            slot = Arc::clone(&slots.free).acquire_owned() => slot.ok(),
                            () = stopped(&mut stop, StopLevel::Graceful) => break 'attempts,
                        };
                    }
                    // Not admitted: not sent.
                    Err(e) => {
                        let lost = self.fetched(&url, queued, None, None, None);
                        let _ = tx.send(fetch::task_failed(lost, false, Some(e)));
                        continue 'urls;
                    }
                }
            }
            // Stopped before this URL started.
            queue.push_front(kept);
            break;
        }
        self.not_started(queue, &lines, &tx);
    }
}

/// Resolves once the stop level is at least `level`.
async fn stopped(stop: &mut watch::Receiver<StopLevel>, level: StopLevel) {
    // A dropped sender never stops anything.
    if stop.wait_for(|l| *l >= level).await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_keep_their_input_order() {
        let urls = [
            "http://a/1",
            "http://a/2",
            "http://B./1",
            "http://c/1",
            "http://b/2",
            "http://a/3",
        ]
        .map(|u| Url::parse(u).unwrap())
        .to_vec();
        let queues: Vec<(String, Vec<String>)> = Frontier::from(urls)
            .into_hosts()
            .hosts
            .into_iter()
            .map(|(h, q)| {
                let lines = Frontier::new().lines();
                let paths = q.iter().map(|k| lines.url(k).unwrap().path().to_owned());
                (h, paths.collect())
            })
            .collect();
        let expect =
            |h: &str, p: &[&str]| (h.to_owned(), p.iter().map(|s| (*s).to_owned()).collect());
        assert_eq!(
            queues,
            [
                expect("a", &["/1", "/2", "/3"]),
                expect("b", &["/1", "/2"]),
                expect("c", &["/1"]),
            ]
        );
    }

    /// Regression: the shared cache was set through `Arc::get_mut`, which
    /// did nothing on a crawler that had been cloned.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn shared_robots_apply_to_a_crawler_cloned_before() {
        use clap::Parser;
        use redislimit::redis::{RedisLimiter, RedisPool, RedisTimeouts};
        let url = "redis://127.0.0.1:1/";
        let args = Args::try_parse_from(["crawl", "--robots", "http://a.test/"]).unwrap();
        let local = Arc::new(redislimit::DomainLimiter::new(redislimit::Pacing::default()));
        let crawler = Crawler::new(local, &args).unwrap();
        let clone = crawler.clone();
        let pool = RedisPool::standalone(url, RedisTimeouts::default()).unwrap();
        let redis = RedisLimiter::builder(pool, "robots-test").build().unwrap();
        let crawler = crawler.with_shared_robots(redis.shared_cache("robots"));
        assert!(crawler.robots.as_ref().unwrap().cache.shared.is_some());
        assert!(clone.robots.as_ref().unwrap().cache.shared.is_none());
    }

    #[test]
    fn credentials_are_redacted() {
        let url = Url::parse("https://user:secret@a.test/p?q=1").unwrap();
        let shown = redact(&url);
        assert!(
            !shown.contains("secret") && !shown.contains("user"),
            "{shown}"
        );
        assert_eq!(shown, "https://redacted@a.test/p?q=1");
        let plain = Url::parse("https://a.test/").unwrap();
        assert_eq!(redact(&plain), "https://a.test/");
    }
}

//! Running the command line: building the limiter the flags describe,
//! crawling, closing the limiter, handling signals and printing the summary.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use redislimit::{DomainLimiter, Hooks, Limiter, Policies};

use super::args::Args;
use super::crawler::{Crawler, ModeProbe};
use super::input::{read_urls_into, resume_from};
use super::stop::Stop;
use super::summary::Tally;

impl Args {
    /// The limiter: in-process, or Redis-backed with an in-process fallback
    /// after checking that Redis answers.
    pub async fn limiter(&self) -> anyhow::Result<Arc<dyn Limiter>> {
        Ok(self.pacer().await?.limiter)
    }

    /// The limiter, and a probe naming the pacing mode for progress lines.
    pub async fn pacer(&self) -> anyhow::Result<Pacer> {
        let (default, policies) = self.policies()?;
        let hooks: Arc<dyn Hooks> = match self.metrics_addr {
            #[cfg(feature = "metrics")]
            Some(_) => Arc::new(redislimit::MetricsHooks::new()),
            _ => Arc::new(redislimit::hooks::NoHooks),
        };
        if self.redis.is_named() {
            #[cfg(feature = "redis")]
            return self.shared_pacer(&default, policies, hooks).await;
            #[cfg(not(feature = "redis"))]
            bail!(
                "--redis, --redis-cluster and --redis-sentinel need the crawl built with its \
                 `redis` feature"
            );
        }
        // Only the shared limiter reads the default's cluster settings.
        #[cfg(not(feature = "redis"))]
        let _ = default;
        Ok(Pacer {
            #[cfg(feature = "redis")]
            robots: None,
            keys: policies.clone(),
            limiter: Arc::new(DomainLimiter::with_hooks(policies, hooks)),
            mode: Arc::new(|| "in-process".to_owned()),
        })
    }

    /// Crawls as these arguments say. Returns how it ended (the signal
    /// that stopped it, the URLs without a response).
    pub async fn run(self) -> anyhow::Result<Ended> {
        let start = match &self.resume {
            Some(report) => resume_from(report)?,
            None => super::Input::default(),
        };
        let input = read_urls_into(start, &self.urls, self.urls_file.as_deref())?;
        for problem in &input.skipped {
            tracing::warn!("skipped {problem}");
        }
        if let Some(report) = &self.resume {
            tracing::info!(
                "resuming: {} URLs the report {} holds as ended are left out",
                input.resumed,
                report.display()
            );
            if input.urls.is_empty() && input.resumed > 0 {
                tracing::info!("nothing is left to fetch");
                return Ok(Ended::default());
            }
        }
        if input.urls.is_empty() && self.queue.is_none() {
            bail!("no URLs to fetch");
        }
        let listed = input.urls.len();
        if let Some(addr) = self.metrics_addr {
            serve_metrics(addr)?;
        }
        let pacer = self.pacer().await?;
        let mut crawler = Crawler::new(Arc::clone(&pacer.limiter), &self)?
            .with_mode(Arc::clone(&pacer.mode))
            .with_keys(pacer.keys.clone())
            .with_priorities(input.priorities);
        #[cfg(feature = "redis")]
        if let Some(robots) = pacer.robots.clone() {
            crawler = crawler.with_shared_robots(robots);
        }
        if let Some(path) = &self.report {
            crawler = if self.resume.as_deref().is_some_and(|r| same_file(r, path)) {
                crawler.with_report_appended(path)?
            } else {
                crawler.with_report(path)?
            };
        }
        let signalled = Arc::new(std::sync::OnceLock::new());
        let listener = tokio::spawn(on_signals(
            crawler.stop_handle(),
            self.grace,
            Arc::clone(&signalled),
        ));
        let started = std::time::Instant::now();
        let mut tally = Tally::default();
        let total = match &self.queue {
            #[cfg(feature = "redis")]
            Some(queue) => super::queue::crawl_queue(&self, queue, &crawler, &mut tally).await?,
            #[cfg(not(feature = "redis"))]
            Some(_) => bail!("--queue needs the crawl built with its `redis` feature"),
            None => {
                crawler
                    .run_each(input.urls, true, |fetched| tally.add(&fetched))
                    .await?;
                listed
            }
        };
        let elapsed = started.elapsed();
        // Every permit is back; the releases still on their way land now,
        // so the next replica does not wait out their leases.
        let close_by = tokio::time::Instant::now() + CLOSE_WITHIN;
        if let Err(err) = pacer.limiter.close(Some(close_by)).await {
            tracing::warn!("{}", redislimit::error::Causes(&err));
        }
        let signal = signalled.get().copied();
        if signal.is_none() {
            listener.abort();
        }
        // The report has standard output to itself when it is written there.
        let printed = if self.report.as_deref() == Some(std::path::Path::new("-")) {
            print_summary(&mut std::io::stderr().lock(), &tally, total, elapsed)
        } else {
            print_summary(&mut std::io::stdout().lock(), &tally, total, elapsed)
        };
        if let Err(err) = printed
            && err.kind() != std::io::ErrorKind::BrokenPipe
        {
            return Err(err).context("cannot print the summary");
        }
        // After the summary: what was done before the stop is still shown.
        if let Some(fatal) = crawler.fatal() {
            bail!("the crawl stopped early: {fatal}");
        }
        crawler.check_report()?;
        Ok(Ended {
            signal,
            unanswered: tally.unanswered(),
        })
    }
}

/// How a crawl that ran ended, which its exit code says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ended {
    /// The signal that stopped it, if one did (2 for SIGINT, 15 for
    /// SIGTERM).
    pub signal: Option<i32>,
    /// URLs that failed without an HTTP response.
    pub unanswered: usize,
}

impl Ended {
    /// 128 and the signal's number when a signal stopped the crawl; else 4
    /// when some URL got no HTTP response; else 0 (every URL answered,
    /// whatever the status, or skipped by robots.txt). A crawl that could
    /// not run, or was stopped by an error, exits 2 instead.
    pub fn exit_code(self) -> u8 {
        match self.signal {
            Some(signal) => 128 + u8::try_from(signal).unwrap_or(0),
            None if self.unanswered > 0 => 4,
            None => 0,
        }
    }
}

/// Whether `a` and `b` name one file.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Serves the metrics for Prometheus at `http://ADDR/metrics`, with buckets
/// for the `_seconds` histograms so the waits add up across replicas (a
/// summary's quantiles do not).
#[cfg(feature = "metrics")]
fn serve_metrics(addr: std::net::SocketAddr) -> anyhow::Result<()> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            Matcher::Prefix("redislimit_".into()),
            &redislimit::MetricsHooks::BUCKETS,
        )
        .context("the metrics' buckets")?
        .install()
        .with_context(|| format!("cannot serve metrics on {addr}"))
}

/// Without the `metrics` feature there is nothing to serve.
#[cfg(not(feature = "metrics"))]
fn serve_metrics(addr: std::net::SocketAddr) -> anyhow::Result<()> {
    bail!("--metrics-addr {addr} needs the crawl built with its `metrics` feature")
}

/// How long the releases of a finished crawl may take to land.
const CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// What [`Args::pacer`] built.
#[derive(Clone)]
pub struct Pacer {
    /// The limiter every request goes through.
    pub limiter: Arc<dyn Limiter>,
    /// Names the pacing mode now.
    pub mode: ModeProbe,
    /// The policies the limiter keys hosts by (a clone: keyed by address,
    /// it shares the addresses the limiter looked up).
    pub keys: Policies,
    /// Where robots.txt outcomes are kept for the fleet, with Redis.
    #[cfg(feature = "redis")]
    pub robots: Option<redislimit::redis::SharedCache>,
}

impl std::fmt::Debug for Pacer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pacer")
            .field("limiter", &self.limiter)
            .field("mode", &(self.mode)())
            .finish()
    }
}

/// On the first SIGINT/SIGTERM: stop starting requests, give those in
/// flight `grace`; on the second, or when the grace is over: end them.
async fn on_signals(stop: Stop, grace: Duration, first: Arc<std::sync::OnceLock<i32>>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot listen for SIGINT/SIGTERM: a signal ends the crawl at once");
        return;
    };
    let (number, name) = tokio::select! {
        _ = int.recv() => (2, "SIGINT"),
        _ = term.recv() => (15, "SIGTERM"),
    };
    let _ = first.set(number);
    tracing::warn!(
        "{name}: no new request starts; those in flight have {} to finish (a second signal ends them now)",
        humantime::format_duration(grace)
    );
    stop.graceful();
    tokio::select! {
        () = tokio::time::sleep(grace) => tracing::warn!("the grace is over: ending the requests in flight"),
        _ = int.recv() => tracing::warn!("second signal: ending the requests in flight"),
        _ = term.recv() => tracing::warn!("second signal: ending the requests in flight"),
    }
    stop.abort();
}

/// Writes the per-host summary: requests made, errors, waits, the rate of
/// those sent, statuses; and how many URLs were not tried.
fn print_summary(
    out: &mut impl std::io::Write,
    tally: &Tally,
    total: usize,
    elapsed: Duration,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<28} {:>8} {:>10} {:>12} {:>10}  statuses",
        "host", "requests", "errors", "mean wait", "rate"
    )?;
    for host in tally.hosts() {
        writeln!(out, "{host}")?;
    }
    write!(
        out,
        "{} requests sent, {} URLs ended, in {:.1}s",
        tally.sent(),
        tally.ended(),
        elapsed.as_secs_f64()
    )?;
    let skipped = tally.skipped();
    if skipped > 0 {
        write!(out, "; {skipped} skipped (robots.txt)")?;
    }
    if tally.ended() < total {
        write!(out, "; {} not started (stopped)", total - tally.ended())?;
    }
    if tally.unanswered() > 0 {
        write!(out, "; {} without a response", tally.unanswered())?;
    }
    writeln!(out)
}

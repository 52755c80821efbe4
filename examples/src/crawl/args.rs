//! The `crawl` command line.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use redislimit::{
    DomainLimiter, FallbackPolicy, Limiter, Pacing, RedisLimiter, RedisPool, RedisTimeouts,
    RedisTls,
};

use super::{Crawler, read_urls, summarize};

/// One replica of a polite crawler: fetches URLs, paced per host, alone or
/// sharing one pace per host with other replicas through Redis.
#[derive(Debug, Clone, Parser)]
#[command(name = "crawl", version)]
pub struct Args {
    /// URLs to fetch.
    #[arg(value_name = "URL")]
    pub urls: Vec<String>,
    /// Also fetch the URLs in FILE, one per line (`-` for stdin); blank lines
    /// and `#` comments are skipped, a bad line is reported and skipped.
    #[arg(long = "urls", value_name = "FILE")]
    pub urls_file: Option<PathBuf>,
    /// Share pacing with other replicas through this Redis server
    /// (`redis://host:port/`, or `rediss://host:port/` for TLS); without it,
    /// pacing is in-process.
    #[arg(long, value_name = "URL", conflicts_with = "redis_cluster")]
    pub redis: Option<String>,
    /// Share pacing through a Redis Cluster, seeded from these nodes
    /// (repeatable; `rediss://` for TLS).
    #[arg(long, value_name = "URL")]
    pub redis_cluster: Vec<String>,
    /// With a `rediss://` Redis: trust the CA certificates in FILE (PEM)
    /// instead of the system's certificates, e.g. for a Redis whose
    /// certificate your own CA issued.
    #[arg(long, value_name = "FILE")]
    pub redis_ca: Option<PathBuf>,
    /// The key space this crawl paces in; replicas sharing a scope share a pace.
    #[arg(long, default_value = "domain")]
    pub scope: String,
    /// Requests in flight per host in this process.
    #[arg(long, default_value_t = 1)]
    pub max_concurrent: u32,
    /// Minimum gap between sends to one host (after the previous completion
    /// in serialized mode).
    #[arg(long, value_parser = parse_duration, default_value = "250ms")]
    pub min_delay: Duration,
    /// At most this many requests per host in any `--window`.
    #[arg(long, default_value_t = 0)]
    pub quota: u32,
    /// The sliding window `--quota` counts in.
    #[arg(long, value_parser = parse_duration)]
    pub window: Option<Duration>,
    /// With Redis: requests in flight per host across all replicas (lease
    /// mode); 0 serializes each host cluster-wide.
    #[arg(long, default_value_t = 0)]
    pub cluster_concurrency: u32,
    /// With Redis: how the replicas keep each host's limits while Redis is
    /// unavailable: `share` divides the rate, quota and cap among the live
    /// replicas, `partition` serves each host from one replica, `full` lets
    /// every replica pace at the full limits (N replicas, N x the rate).
    #[arg(long, value_enum, default_value_t = Fallback::Share)]
    pub fallback: Fallback,
    /// With Redis: how long a dead replica's slot stays booked.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub lease_ttl: Duration,
    /// Random extra on every wait, up to this much.
    #[arg(long, value_parser = parse_duration, default_value = "0ms")]
    pub jitter: Duration,
    /// The longest a `Retry-After` may hold a host back.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    pub max_penalty: Duration,
    /// Requests this process keeps in flight overall.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Send requests for HOST to ADDR (an IP address), as curl's `--resolve`
    /// (`HOST:PORT:ADDR` is accepted too; the URL's port is used). Repeatable.
    #[arg(long = "resolve", value_name = "HOST:ADDR", value_parser = parse_resolve)]
    pub resolve: Vec<(String, std::net::IpAddr)>,
    /// An extra request header, `NAME:VALUE`. Repeatable.
    #[arg(long = "header", value_name = "NAME:VALUE", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// Timeout of one request, from connect to the end of its body (time
    /// spent waiting for the host's turn is not counted).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub timeout: Duration,
    /// The longest a request may wait for its host's turn; a longer wait
    /// ends it with an error (reported) instead of holding a slot of
    /// `--concurrency` meanwhile. Unbounded by default.
    #[arg(long, value_parser = parse_duration)]
    pub max_wait: Option<Duration>,
    /// Write one JSON object per request to FILE.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// The engine label reported to the limiter's hooks and logs.
    #[arg(long, default_value = "crawl")]
    pub engine: String,
}

/// `--fallback`: [`FallbackPolicy`] on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fallback {
    /// Divide each host's rate, quota and cap among the live replicas.
    Share,
    /// Serve each host from one live replica; the others' requests wait.
    Partition,
    /// Every replica at the full limits: N replicas send N x the rate.
    Full,
}

impl From<Fallback> for FallbackPolicy {
    fn from(f: Fallback) -> Self {
        match f {
            Fallback::Share => Self::Share,
            Fallback::Partition => Self::Partition,
            Fallback::Full => Self::Full,
        }
    }
}

/// Parses `250ms`, `2s`, `1m30s`, ...
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 250ms or 2s: {e}"))
}

fn parse_resolve(text: &str) -> Result<(String, std::net::IpAddr), String> {
    let bad = || format!("{text:?} is not HOST:ADDR (e.g. a.test:127.0.0.1)");
    let (host, rest) = text.split_once(':').ok_or_else(bad)?;
    // curl's HOST:PORT:ADDR: the port is the URL's business.
    let addr = match rest.split_once(':') {
        Some((port, addr)) if port.bytes().all(|b| b.is_ascii_digit()) && !port.is_empty() => addr,
        _ => rest,
    };
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    let ip = addr.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_ascii_lowercase(), ip))
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not NAME:VALUE"))?;
    let name = name.trim();
    http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a header name"))?;
    http::HeaderValue::from_str(value.trim())
        .map_err(|_| format!("{value:?} is not a header value"))?;
    Ok((name.to_owned(), value.trim().to_owned()))
}

impl Args {
    /// The per-host pacing these arguments describe.
    pub fn pacing(&self) -> anyhow::Result<Pacing> {
        let mut pacing = Pacing::builder()
            .max_concurrent(self.max_concurrent)
            .min_delay(self.min_delay)
            .quota(self.quota)
            .jitter(self.jitter)
            .max_penalty(self.max_penalty);
        if let Some(window) = self.window {
            pacing = pacing.window(window);
        }
        Ok(pacing.build()?)
    }

    /// The limiter: in-process, or Redis-backed with an in-process fallback
    /// after checking that Redis answers.
    pub async fn limiter(&self) -> anyhow::Result<Arc<dyn Limiter>> {
        let pacing = self.pacing()?;
        let tls = self.redis_tls()?;
        let timeouts = RedisTimeouts::default();
        let pool = match (&self.redis, self.redis_cluster.as_slice(), &tls) {
            (None, [], _) => return Ok(Arc::new(DomainLimiter::new(pacing))),
            (Some(url), _, None) => RedisPool::standalone(url, timeouts)?,
            (Some(url), _, Some(tls)) => RedisPool::standalone_tls(url, tls, timeouts)?,
            (None, nodes, tls) => {
                let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
                match tls {
                    None => RedisPool::cluster(&nodes, timeouts)?,
                    Some(tls) => RedisPool::cluster_tls(&nodes, tls, timeouts)?,
                }
            }
        };
        let limiter = RedisLimiter::builder(pool, self.scope.clone())
            .pacing(pacing)
            .cluster_concurrency(self.cluster_concurrency)
            .lease_ttl(self.lease_ttl)
            .fallback_policy(self.fallback.into())
            .build()?;
        limiter.ping().await.context("Redis is unreachable")?;
        // Refuse to start beside replicas that pace this scope otherwise.
        limiter.check_config().await?;
        Ok(Arc::new(limiter.with_fallback()))
    }

    /// The CA that `--redis-ca` names, if any.
    fn redis_tls(&self) -> anyhow::Result<Option<RedisTls>> {
        let Some(path) = &self.redis_ca else {
            return Ok(None);
        };
        if self.redis.is_none() && self.redis_cluster.is_empty() {
            bail!("--redis-ca needs --redis or --redis-cluster");
        }
        Ok(Some(RedisTls::ca_file(path)?))
    }

    /// Crawls as these arguments say.
    pub async fn run(self) -> anyhow::Result<()> {
        let input = read_urls(&self.urls, self.urls_file.as_deref())?;
        for problem in &input.skipped {
            eprintln!("crawl: skipped {problem}");
        }
        if input.urls.is_empty() {
            bail!("no URLs to fetch");
        }
        let limiter = self.limiter().await?;
        let mut crawler = Crawler::new(limiter, &self)?;
        if let Some(path) = &self.report {
            crawler = crawler.with_report(path)?;
        }
        let started = std::time::Instant::now();
        let fetched = crawler.run(input.urls, true).await?;
        crawler.check_report()?;
        let elapsed = started.elapsed();
        println!(
            "{:<28} {:>8} {:>10} {:>12} {:>10}  statuses",
            "host", "requests", "errors", "mean wait", "rate"
        );
        for host in summarize(&fetched) {
            println!("{host}");
        }
        println!(
            "{} requests in {:.1}s",
            fetched.len(),
            elapsed.as_secs_f64()
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_resolves_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("soon").is_err());
        let ip = "127.0.0.1".parse().unwrap();
        assert_eq!(parse_resolve("A.test:127.0.0.1"), Ok(("a.test".into(), ip)));
        assert_eq!(
            parse_resolve("a.test:8080:127.0.0.1"),
            Ok(("a.test".into(), ip))
        );
        assert_eq!(
            parse_resolve("a.test:[::1]").map(|r| r.1),
            Ok("::1".parse().unwrap())
        );
        assert!(parse_resolve("a.test").is_err());
        assert!(parse_resolve(":127.0.0.1").is_err());
        assert!(parse_header("x-replica: 2").is_ok());
        assert!(parse_header("bad header:1").is_err());
    }

    #[test]
    fn a_redis_ca_needs_redis_and_a_readable_file() {
        let args =
            Args::try_parse_from(["crawl", "--redis-ca", "ca.pem", "http://a.test/"]).unwrap();
        let err = args.redis_tls().unwrap_err().to_string();
        assert!(err.contains("needs --redis"), "{err}");
        let args = Args::try_parse_from([
            "crawl",
            "--redis",
            "rediss://127.0.0.1:6380/",
            "--redis-ca",
            "/nonexistent/ca.pem",
            "http://a.test/",
        ])
        .unwrap();
        let err = args.redis_tls().unwrap_err().to_string();
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn a_quota_without_a_window_is_refused() {
        let args = Args::try_parse_from(["crawl", "--quota", "5", "http://a.test/"]).unwrap();
        let err = args.pacing().unwrap_err().to_string();
        assert!(err.contains("no window"), "{err}");
    }
}

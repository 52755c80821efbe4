//! The `crawl` command line.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
#[cfg(feature = "redis")]
use redislimit::FallbackPolicy;
#[cfg(feature = "tls")]
use redislimit::RedisTls;
use redislimit::{HostKey, KeyBy, Pacing, Policies};

use super::policy_file::{Settings, load as load_policy_file, parse_bytes, parse_duration};
use super::resolve::Addresses;

/// One replica of a polite crawler: fetches URLs, paced per host, alone or
/// sharing one pace per host with other replicas through Redis.
#[derive(Debug, Clone, Parser)]
#[command(name = "crawl", version, args_conflicts_with_subcommands = true)]
#[command(group = clap::ArgGroup::new("shared").args(["redis", "redis_cluster", "redis_sentinel"]).multiple(true))]
#[command(
    after_help = "Logs go to stderr; RUST_LOG sets what is shown (default: info). \
On SIGINT or SIGTERM no request starts; those in flight have --grace to finish, every \
permit is released, the report (every URL not started too) and the summary are written, \
and the exit code is 130 or 143. A second signal ends the requests in flight at once. \
Exit codes: 0 every URL ended with an HTTP response (any status) or was skipped by \
robots.txt; 2 bad input, a report that cannot be written, a misconfigured or unreachable \
Redis, settings that lose the scope's agreement; 4 the crawl ran to its end but some URLs \
got no HTTP response (no connection, a timeout, a blown --max-wait); 130/143 a signal."
)]
pub struct Args {
    /// URLs to fetch.
    #[arg(value_name = "URL")]
    pub urls: Vec<String>,
    /// Also fetch the URLs in FILE, one per line (`-` for stdin); blank lines
    /// and `#` comments are skipped, a bad line is reported and skipped.
    #[arg(long = "urls", value_name = "FILE")]
    pub urls_file: Option<PathBuf>,
    /// The Redis the replicas share pacing through (none: pacing is
    /// in-process).
    #[command(flatten)]
    pub redis: RedisTarget,
    /// With Redis: how many replicas to assume when Redis is unavailable
    /// before this one has seen the others (it then paces at 1/N of each
    /// limit). With it, the crawl also starts while Redis is down, and
    /// joins Redis when it answers; without it, it refuses to start.
    #[arg(long, value_name = "N", requires = "shared", value_parser = clap::value_parser!(u32).range(1..))]
    pub expected_replicas: Option<u32>,
    /// With Redis: the key space this crawl paces in; replicas sharing a
    /// scope share a pace.
    #[arg(long, requires = "shared", default_value = "domain")]
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
    #[arg(long, requires = "shared", default_value_t = 0)]
    pub cluster_concurrency: u32,
    /// With Redis: how the replicas keep each host's limits while Redis is
    /// unavailable: `share` divides the rate, quota and cap among the live
    /// replicas, `partition` serves each host from one replica, `full` lets
    /// every replica pace at the full limits (N replicas, N x the rate).
    #[arg(long, requires = "shared", value_enum, default_value_t = Fallback::Share)]
    pub fallback: Fallback,
    /// With Redis: how long a dead replica's slot stays booked.
    #[arg(long, requires = "shared", value_parser = parse_duration, default_value = "30s")]
    pub lease_ttl: Duration,
    /// With Redis: how long after its host's slot a waiter aims to reach
    /// Redis; the pace loses about this much per admission.
    #[arg(long, requires = "shared", value_parser = parse_duration, default_value = "100us")]
    pub slot_margin: Duration,
    /// With Redis: how late an admission may reach this process beyond the
    /// room kept after its slot for this process's recent lateness (lease
    /// mode with a --min-delay, or a --quota); a later one is handed back
    /// and asked for again, not sent late. A long one, such as 1h, turns
    /// this off (and keeps no room).
    #[arg(long, requires = "shared", value_parser = parse_lateness, default_value = "2ms")]
    pub max_lateness: Duration,
    /// With Redis: a waiter within this of its host's slot is booked for
    /// it at once and sends at it (0: never; at most --lease-ttl; never for
    /// hosts with --jitter); for APIs that count requests per window rather
    /// than judge each gap.
    #[arg(long, requires = "shared", value_parser = parse_duration, default_value = "0ms")]
    pub book_ahead: Duration,
    /// Random extra on every wait, up to this much.
    #[arg(long, value_parser = parse_duration, default_value = "0ms")]
    pub jitter: Duration,
    /// The longest a `Retry-After` may hold a host back.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    pub max_penalty: Duration,
    /// At most this many response bytes a second per host (`204800`,
    /// `200KiB`, `1MB`; 0: no limit), shared by every replica through
    /// Redis: each response's bytes hold the host's next request back.
    #[arg(long, value_parser = parse_bytes, default_value = "0")]
    pub max_bytes_per_sec: u64,
    /// Requests this process sends at once, overall (at least 1). A URL
    /// waiting for its host's turn holds none of them.
    #[arg(long, default_value_t = 16, value_parser = parse_concurrency)]
    pub concurrency: usize,
    /// The hold for a 429 or 503 that carries no `Retry-After` (none by
    /// default), capped by `--max-penalty`.
    #[arg(long, value_parser = parse_duration)]
    pub default_penalty: Option<Duration>,
    /// Switch off the adaptive backoff: by default a 429/503 without
    /// `Retry-After`, another 5xx, a timeout or a refused or reset
    /// connection widens the host's gap (1 s, doubling per signal, up to
    /// `--max-penalty`) and successes narrow it back (x0.75 each); with
    /// Redis, one gap per host for every replica.
    #[arg(long)]
    pub no_backoff: bool,
    /// Switch off reading rate limit headers: by default a `RateLimit`
    /// field (with `RateLimit-Policy`) or `X-RateLimit-*` headers saying
    /// the budget is spent hold the host until the reset, and a budget at
    /// most a tenth of its limit is spread up to it. `Retry-After` is read
    /// either way.
    #[arg(long)]
    pub no_rate_limit_headers: bool,
    /// After SIGINT/SIGTERM, how long requests in flight may go on.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub grace: Duration,
    /// How often a progress line is logged when stderr is not a terminal
    /// (more than zero).
    #[arg(long, value_parser = parse_period, default_value = "5s")]
    pub progress_every: Duration,
    /// Send requests for HOST to ADDR (an IP address), as curl's `--resolve`
    /// (`HOST:PORT:ADDR` is accepted too; the URL's port is used). HOST is
    /// matched as the limiter keys hosts: any case, Unicode or punycode,
    /// with or without a trailing dot. `*.SUFFIX` sends every name under
    /// SUFFIX, and `*` every name, to ADDR (an exact HOST is looked up
    /// first, then the patterns in order). Repeatable.
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
    /// Write one JSON object per URL to FILE (`-`: standard output, the
    /// summary then going to stderr). After a signal every URL not started
    /// is written with `"not_started": true`. A line that cannot be
    /// written stops the crawl (exit 2).
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Leave out the URLs the report FILE of an earlier run holds as ended
    /// (fetched, failed, or skipped by robots.txt; those it wrote as
    /// `not_started` are fetched). With `--report` naming the same file,
    /// its lines are added to the end of it.
    #[arg(long, value_name = "FILE")]
    pub resume: Option<PathBuf>,
    /// The `User-Agent` sent, and the agent robots.txt rules are read for.
    #[arg(long, default_value = concat!("redislimit-crawl/", env!("CARGO_PKG_VERSION")))]
    pub user_agent: String,
    /// Fetch each host's /robots.txt (through the same pacing) before its
    /// first URL; skip the URLs it disallows for `--user-agent` (reported
    /// as skipped), and keep its `Crawl-delay` between requests when it is
    /// longer than `--min-delay`. A 4xx allows everything; a 5xx or no
    /// answer disallows the host (asked again twice, `--robots-retry`
    /// apart), as RFC 9309 says. With `--redis` one replica fetches it for
    /// the fleet and the outcome is kept in the scope 24 hours.
    #[arg(long)]
    pub robots: bool,
    /// The longest `Crawl-delay` kept.
    #[arg(long, value_parser = parse_duration, default_value = "30s", requires = "robots")]
    pub max_crawl_delay: Duration,
    /// How long to wait before asking again for a robots.txt that could
    /// not be had.
    #[arg(long, value_parser = parse_duration, default_value = "10s", requires = "robots")]
    pub robots_retry: Duration,
    /// The engine label reported to the limiter's hooks and logs.
    #[arg(long, default_value = "crawl")]
    pub engine: String,
    /// Per-host rules in TOML: an optional `[default]` table and
    /// `[[rule]]` tables with `match` (`api.example.com`, or
    /// `*.example.com` for the hosts below it) and any of `min_delay`,
    /// `max_concurrent`, `cluster_concurrency`, `quota`, `window`,
    /// `jitter`, `max_penalty`, `max_bytes_per_sec` (durations as "250ms",
    /// byte rates as "200KiB"). Without `[default]` the flags form the
    /// default; a rule changes only what it names. With Redis, a policy
    /// published to the scope (`crawl policy push`) takes its place.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// What one paced host is: `host` (the default), `domain` (the
    /// registrable domain, from the public suffix list: a.example.co.uk and
    /// b.example.co.uk share one pace), `host-port` or `ip` (the address
    /// the name resolves to, through `--resolve` or the system's resolver,
    /// kept 60 s; the lowest when it has several: names served by one
    /// machine share one pace). Rules still match each request's own host.
    /// Replicas sharing Redis must agree.
    #[arg(long, value_enum, default_value_t = KeyByArg::Host)]
    pub key_by: KeyByArg,
    /// Serve the limiter's metrics (`redislimit_acquires_total`,
    /// `redislimit_wait_seconds`, `redislimit_holds_total`, ...) for
    /// Prometheus at http://ADDR/metrics while the crawl runs.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Take the URLs from the shared queue in this Redis (`redis://` or
    /// `rediss://`; fill it with `crawl enqueue FILE --queue URL`) instead
    /// of a file: any number of replicas take URLs from it, a few at a
    /// time; a URL leaves it once its report line is written; a replica's
    /// URLs not kept for `--claim-after` (it died) are taken over by
    /// another. The crawl ends when the queue is empty and nothing in it is
    /// being fetched. Its key is under `--scope`.
    #[arg(long, value_name = "URL", conflicts_with_all = ["urls", "urls_file", "resume"])]
    pub queue: Option<String>,
    /// With `--queue`: how long a replica's URLs go without being kept
    /// before another replica takes them over (a replica keeps its own
    /// every quarter of it).
    #[arg(long, value_parser = parse_claim_after, default_value = "30s", requires = "queue")]
    pub claim_after: Duration,
    /// With `--queue`: how many URLs a replica takes at a time (default:
    /// 16 per `--concurrency` slot).
    #[arg(long, value_name = "N", value_parser = parse_batch, requires = "queue")]
    pub queue_batch: Option<usize>,
    /// A task other than crawling.
    #[command(subcommand)]
    pub command: Option<crate::queue::Command>,
}

/// `--key-by`: [`KeyBy`] on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyByArg {
    /// The host.
    Host,
    /// The registrable domain.
    Domain,
    /// The host and its port.
    HostPort,
    /// The host's address, as `--resolve` or the system resolves it.
    Ip,
}

impl From<KeyByArg> for KeyBy {
    fn from(k: KeyByArg) -> Self {
        match k {
            KeyByArg::Host => Self::Host,
            KeyByArg::Domain => Self::RegistrableDomain,
            KeyByArg::HostPort => Self::HostPort,
            KeyByArg::Ip => Self::Ip,
        }
    }
}

/// `--fallback`: `redislimit::FallbackPolicy` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fallback {
    /// Divide each host's rate, quota and cap among the live replicas.
    Share,
    /// Serve each host from one live replica; the others' requests wait.
    Partition,
    /// Every replica at the full limits: N replicas send N x the rate.
    Full,
}

#[cfg(feature = "redis")]
impl From<Fallback> for FallbackPolicy {
    fn from(f: Fallback) -> Self {
        match f {
            Fallback::Share => Self::Share,
            Fallback::Partition => Self::Partition,
            Fallback::Full => Self::Full,
        }
    }
}

/// A duration above zero.
fn parse_period(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err("a period of 0 would never end: give more than zero".into()),
        period => Ok(period),
    }
}

/// A lateness above zero.
fn parse_lateness(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => {
            Err("0 would hand back every admission: give more than zero (1h turns it off)".into())
        }
        lateness => Ok(lateness),
    }
}

fn parse_concurrency(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("0 would send nothing: give at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{text:?} is not a number of requests")),
    }
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
    if let Some(pattern) = crate::resolve::Patterns::parse(host) {
        return pattern.map(|key| (key, ip));
    }
    // The name as URLs to it are keyed: punycode, lower case, no final dot.
    let key = HostKey::parse(&format!("http://{host}/"))
        .map_err(|e| format!("{host:?} is not a host name: {e}"))?;
    Ok((key.as_str().to_owned(), ip))
}

/// `--claim-after`: at least 100 ms, or replicas would keep their URLs
/// in a busy loop and take each other's at once.
fn parse_claim_after(text: &str) -> Result<Duration, String> {
    let claim_after = parse_duration(text)?;
    if claim_after < Duration::from_millis(100) {
        return Err(format!("{text:?} is too short: at least 100ms"));
    }
    Ok(claim_after)
}

/// `--queue-batch`: at least 1.
fn parse_batch(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{text:?} is not a number of URLs from 1 up")),
    }
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
    /// The per-host settings the flags give.
    pub fn settings(&self) -> Settings {
        Settings {
            min_delay: self.min_delay,
            max_concurrent: self.max_concurrent,
            cluster_concurrency: self.cluster_concurrency,
            quota: self.quota,
            window: self.window,
            jitter: self.jitter,
            max_penalty: self.max_penalty,
            max_bytes_per_sec: self.max_bytes_per_sec,
        }
    }

    /// The per-host pacing the flags describe (the default of
    /// [`policies`](Self::policies) without a policy file).
    pub fn pacing(&self) -> anyhow::Result<Pacing> {
        Ok(self.settings().pacing()?)
    }

    /// The default settings and every host's pacing: the flags, the
    /// `--policy` file on top of them, keyed by `--key-by`.
    pub fn policies(&self) -> anyhow::Result<(Settings, Policies)> {
        let flags = self.settings();
        let (default, policies) = match &self.policy {
            Some(path) => load_policy_file(path, &flags)?,
            None => {
                let pacing = flags.pacing()?;
                (flags, Policies::new(pacing))
            }
        };
        let policies = policies.with_key_by(self.key_by.into());
        Ok(match self.key_by {
            // Keyed by the address the client sends to.
            KeyByArg::Ip => (
                default,
                policies.with_address_resolver(Arc::new(Addresses::new(&self.resolve))),
            ),
            _ => (default, policies),
        })
    }
}

/// The Redis replicas share pacing through, as their flags name it: one of
/// `--redis`, `--redis-cluster` or `--redis-sentinel` (with
/// `--redis-master`), and `--redis-ca`. The main command and `crawl policy`
/// take the same flags (a command that flattens it defines the group
/// `shared` over the first three).
#[derive(Debug, Clone, clap::Args)]
#[group(skip)]
pub struct RedisTarget {
    /// Share pacing with other replicas through this Redis server
    /// (`redis://host:port/`, or `rediss://host:port/` for TLS); without
    /// it (or `--redis-cluster`, `--redis-sentinel`), pacing is in-process.
    #[arg(long, value_name = "URL", conflicts_with_all = ["redis_cluster", "redis_sentinel"])]
    pub redis: Option<String>,
    /// Share pacing through a Redis Cluster, seeded from these nodes
    /// (repeatable; `rediss://` for TLS).
    #[arg(long, value_name = "URL", conflicts_with = "redis_sentinel")]
    pub redis_cluster: Vec<String>,
    /// Share pacing through the Redis master these Sentinels know as
    /// `--redis-master` (repeatable; `rediss://` for TLS to the Sentinels
    /// and the master, trusting the system's certificates: point
    /// SSL_CERT_FILE at a CA of your own).
    #[arg(long, value_name = "URL")]
    pub redis_sentinel: Vec<String>,
    /// With `--redis-sentinel`: the name the Sentinels know the master by.
    #[arg(
        long,
        value_name = "NAME",
        requires = "redis_sentinel",
        // `requires` alone lets `--redis` or `--redis-cluster` through: clap
        // counts a required flag that conflicts with a present one as met.
        conflicts_with_all = ["redis", "redis_cluster"],
        default_value = "mymaster"
    )]
    pub redis_master: String,
    /// With a `rediss://` Redis: trust the CA certificates in FILE (PEM)
    /// instead of the system's certificates, e.g. for a Redis whose
    /// certificate your own CA issued.
    #[arg(long, value_name = "FILE", requires = "shared")]
    pub redis_ca: Option<PathBuf>,
}

impl RedisTarget {
    /// Whether a Redis is named at all.
    pub fn is_named(&self) -> bool {
        self.redis.is_some() || !self.redis_cluster.is_empty() || !self.redis_sentinel.is_empty()
    }

    /// The CA that `--redis-ca` names, if any.
    #[cfg(feature = "tls")]
    pub(crate) fn tls(&self) -> anyhow::Result<Option<RedisTls>> {
        let Some(path) = &self.redis_ca else {
            return Ok(None);
        };
        Ok(Some(RedisTls::ca_file(path)?))
    }

    /// These flags, as the replicas' command line takes them.
    #[cfg(feature = "redis")]
    pub(crate) fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        let mut add = |flag: &str, value: &str| {
            flags.push(format!("--{flag}"));
            flags.push(value.to_owned());
        };
        if let Some(url) = &self.redis {
            add("redis", url);
        }
        for url in &self.redis_cluster {
            add("redis-cluster", url);
        }
        for url in &self.redis_sentinel {
            add("redis-sentinel", url);
        }
        if !self.redis_sentinel.is_empty() {
            add("redis-master", &self.redis_master);
        }
        if let Some(ca) = &self.redis_ca {
            add("redis-ca", &ca.display().to_string());
        }
        flags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_settings_are_checked() {
        assert_eq!(parse_claim_after("1s"), Ok(Duration::from_secs(1)));
        assert!(
            parse_claim_after("0s")
                .unwrap_err()
                .contains("at least 100ms")
        );
        assert!(parse_claim_after("soon").is_err());
        assert_eq!(parse_batch("6"), Ok(6));
        assert!(parse_batch("0").is_err() && parse_batch("-1").is_err());
        let bad = Args::try_parse_from(["crawl", "--queue", "redis://x/", "--claim-after", "0s"]);
        assert!(bad.unwrap_err().to_string().contains("at least 100ms"));
    }

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
        assert_eq!(
            parse_resolve("*.Mem.test:127.0.0.1"),
            Ok(("*.mem.test".into(), ip))
        );
        assert_eq!(parse_resolve("*:127.0.0.1"), Ok(("*".into(), ip)));
        assert!(parse_resolve("*x.test:127.0.0.1").is_err());
        assert!(parse_resolve(":127.0.0.1").is_err());
        assert!(parse_header("x-replica: 2").is_ok());
        assert!(parse_header("bad header:1").is_err());
    }

    #[test]
    fn resolve_names_are_keyed_like_urls() {
        let ip = "127.0.0.1".parse().unwrap();
        assert_eq!(
            parse_resolve("a.test.:127.0.0.1"),
            Ok(("a.test".into(), ip))
        );
        assert_eq!(
            parse_resolve("bücher.test:127.0.0.1"),
            Ok(("xn--bcher-kva.test".into(), ip))
        );
        assert_eq!(
            parse_resolve("XN--BCHER-KVA.test:127.0.0.1"),
            Ok(("xn--bcher-kva.test".into(), ip))
        );
        assert!(parse_resolve("a b:127.0.0.1").is_err());
    }

    #[test]
    fn meaningless_combinations_are_refused() {
        let refused = |argv: &[&str]| {
            let err = Args::try_parse_from(argv).unwrap_err();
            assert!(
                matches!(
                    err.kind(),
                    clap::error::ErrorKind::MissingRequiredArgument
                        | clap::error::ErrorKind::ValueValidation
                ),
                "{argv:?}: {err}"
            );
            err.to_string()
        };
        let err = refused(&["crawl", "--concurrency", "0", "http://a.test/"]);
        assert!(err.contains("--concurrency"), "{err}");
        let err = refused(&["crawl", "--progress-every", "0s", "http://a.test/"]);
        assert!(err.contains("--progress-every"), "{err}");
        for flag in [
            ["--cluster-concurrency", "2"],
            ["--lease-ttl", "5s"],
            ["--scope", "other"],
            ["--fallback", "full"],
            ["--expected-replicas", "3"],
            ["--redis-master", "m"],
        ] {
            let err = refused(&["crawl", flag[0], flag[1], "http://a.test/"]);
            assert!(err.contains("--redis"), "{flag:?}: {err}");
        }
        let err = refused(&[
            "crawl",
            "--redis",
            "redis://127.0.0.1/",
            "--expected-replicas",
            "0",
            "http://a.test/",
        ]);
        assert!(err.contains("--expected-replicas"), "{err}");
        // `--redis-master` names a Sentinel master: beside another Redis
        // it is a mistake, not something to ignore.
        for other in ["--redis", "--redis-cluster"] {
            let argv = [
                "crawl",
                other,
                "redis://127.0.0.1/",
                "--redis-master",
                "m",
                "http://a.test/",
            ];
            let err = Args::try_parse_from(argv).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{argv:?}: {err}"
            );
            assert!(err.to_string().contains("--redis-master"), "{err}");
        }
        // With Redis they are meaningful.
        let ok = Args::try_parse_from([
            "crawl",
            "--redis",
            "redis://127.0.0.1/",
            "--lease-ttl",
            "5s",
            "http://a.test/",
        ]);
        assert!(ok.is_ok(), "{ok:?}");
        let ok = Args::try_parse_from([
            "crawl",
            "--redis-cluster",
            "redis://127.0.0.1:7000/",
            "--scope",
            "s",
            "http://a.test/",
        ]);
        assert!(ok.is_ok(), "{ok:?}");
        let ok = Args::try_parse_from([
            "crawl",
            "--redis-sentinel",
            "redis://127.0.0.1:26379/",
            "--redis-master",
            "pacing",
            "--expected-replicas",
            "4",
            "http://a.test/",
        ]);
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    #[cfg(feature = "tls")]
    fn a_redis_ca_needs_redis_and_a_readable_file() {
        let err = Args::try_parse_from(["crawl", "--redis-ca", "ca.pem", "http://a.test/"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--redis"), "{err}");
        let args = Args::try_parse_from([
            "crawl",
            "--redis",
            "rediss://127.0.0.1:6380/",
            "--redis-ca",
            "/nonexistent/ca.pem",
            "http://a.test/",
        ])
        .unwrap();
        let err = args.redis.tls().unwrap_err().to_string();
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn a_quota_without_a_window_is_refused() {
        let args = Args::try_parse_from(["crawl", "--quota", "5", "http://a.test/"]).unwrap();
        let err = args.pacing().unwrap_err().to_string();
        assert!(err.contains("no window"), "{err}");
    }
}

//! The demonstration `cargo xtask demo` runs: three crawler replicas sharing
//! one polite pace per host.
//!
//! Run it with `cargo xtask demo` (in-process: the replicas share one
//! `DomainLimiter`) or `cargo xtask demo -- --redis redis://127.0.0.1:6379/`
//! (each replica has its own `RedisLimiter`, and Redis makes them share).
//!
//! A local server answers for three hosts: `fast.test` at once, `slow.test`
//! after 400 ms, and `busy.test` with a 429 and `Retry-After: 1` the first
//! time. Look at the summary (every host sees sends at least `min_delay`
//! after the previous response ended, whichever replica sent them) and at
//! the timeline picture whose path is printed at the end.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use examples::timeline::{Bar, svg};
use redislimit::{DomainLimiter, Limiter};
use redislimit_crawl::{Args, Crawler, Fetched, summarize};
use url::Url;

/// Three crawler replicas, one pace per host.
#[derive(Debug, Parser)]
struct Demo {
    /// Share pacing through this Redis instead of in-process.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Where to write the timeline picture.
    #[arg(long, default_value = "target/demo/timeline.svg")]
    out: PathBuf,
    /// Requests per host.
    #[arg(long, default_value_t = 6)]
    per_host: usize,
}

const HOSTS: [&str; 3] = ["fast.test", "slow.test", "busy.test"];
const REPLICAS: usize = 3;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let demo = Demo::parse();
    let upstream = examples::local_upstream(true).await;
    let mut argv = vec![
        "replica",
        "--min-delay",
        "250ms",
        "--jitter",
        "20ms",
        "--max-penalty",
        "5s",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>();
    for host in HOSTS {
        argv.extend(["--resolve".into(), format!("{host}:{}", upstream.ip())]);
    }
    if let Some(redis) = &demo.redis {
        argv.extend(["--redis".into(), redis.clone()]);
    }
    let args = Args::parse_from(&argv);
    println!(
        "{} replicas, {} hosts, pacing per host: {} in flight, {:?} between sends and after each response, shared {}",
        REPLICAS,
        HOSTS.len(),
        args.max_concurrent,
        args.min_delay,
        if demo.redis.is_some() {
            "through Redis"
        } else {
            "in-process"
        }
    );

    // In-process, the replicas share one limiter; with Redis, each has its
    // own (with its own connections) and Redis is what they share.
    let shared: Arc<dyn Limiter> = Arc::new(DomainLimiter::new(args.pacing()?));
    let mut replicas = Vec::new();
    let mut limiters = vec![Arc::clone(&shared)];
    for n in 0..REPLICAS {
        let limiter = if demo.redis.is_some() {
            let own = args.limiter().await?;
            limiters.push(Arc::clone(&own));
            own
        } else {
            Arc::clone(&shared)
        };
        // Every replica gets some of every host's pages.
        let urls: Vec<Url> = (0..demo.per_host)
            .flat_map(|i| HOSTS.iter().enumerate().map(move |(h, host)| (i, h, host)))
            .filter(|(i, h, _)| (i + h) % REPLICAS == n)
            .map(|(i, _, host)| Url::parse(&format!("http://{host}:{}/page/{i}", upstream.port())))
            .collect::<Result<_, _>>()?;
        let crawler = Crawler::new(limiter, &args)?;
        replicas.push(tokio::spawn(async move { crawler.run(urls, false).await }));
    }
    let mut fetched: Vec<(usize, Fetched)> = Vec::new();
    for (n, replica) in replicas.into_iter().enumerate() {
        fetched.extend(replica.await??.into_iter().map(|f| (n, f)));
    }
    // The last releases reach Redis before the program ends.
    let by = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    for limiter in limiters {
        limiter.close(Some(by)).await?;
    }

    let all: Vec<Fetched> = fetched.iter().map(|(_, f)| f.clone()).collect();
    println!(
        "\n{:<28} {:>8} {:>10} {:>12} {:>10}  statuses",
        "host", "requests", "errors", "mean wait", "rate"
    );
    for host in summarize(&all) {
        println!("{host}");
    }
    println!("\nthe smallest gap each host saw between a response's end and the next send:");
    for host in HOSTS {
        let mut reqs: Vec<&Fetched> = all.iter().filter(|f| f.host == host).collect();
        reqs.sort_by_key(|f| f.start_ms);
        let gap = reqs
            .windows(2)
            .map(|w| w[1].start_ms as i64 - w[0].end_ms as i64)
            .min();
        let senders: std::collections::BTreeSet<usize> = fetched
            .iter()
            .filter(|(_, f)| f.host == host)
            .map(|(n, _)| n + 1)
            .collect();
        println!(
            "  {host:<10} {:>5} ms  (replicas {senders:?})",
            gap.unwrap_or(0)
        );
    }

    let bars: Vec<Bar> = fetched
        .iter()
        .map(|(n, f)| Bar {
            host: f.host.clone(),
            replica: *n,
            start_ms: f.start_ms,
            end_ms: f.end_ms,
            status: f.status,
            penalty_ms: f.retry_after_ms,
        })
        .collect();
    let title = format!(
        "{REPLICAS} replicas, one pace per host ({}), min_delay {:?}",
        if demo.redis.is_some() {
            "shared through Redis"
        } else {
            "shared in-process"
        },
        args.min_delay
    );
    if let Some(dir) = demo.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&demo.out, svg(&bars, &title))?;
    println!("\ntimeline: {}", demo.out.display());
    Ok(())
}

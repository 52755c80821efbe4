//! The demonstration `cargo xtask demo` runs: per-host pacing in one process.
//!
//! Run it with `cargo xtask demo` (or `cargo run -p examples --example demo`).
//! No Redis is needed. Three workers share one `DomainLimiter` and fetch
//! from three simulated hosts: `fast.test` answers at once, `slow.test`
//! takes 300 ms per response, and `busy.test` answers its second request
//! with a 429 and `Retry-After: 1`, which holds the host back for a second.
//! Look at the `gap` column: sends to one host are never closer than the
//! 200 ms minimum delay, counted from the previous send and from the
//! previous completion, and at most 2 requests are in flight per host.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redislimit::{DomainLimiter, Limiter, Pacing, Url};
use tokio::time::Instant;

const REQUESTS_PER_HOST: usize = 6;

#[derive(Debug, Clone)]
struct Sent {
    host: String,
    worker: usize,
    send: Duration,
    end: Duration,
    waited: Duration,
}

/// How long each simulated host takes to answer, and whether it pushes back.
fn respond(host: &str, nth: usize) -> (Duration, Option<Duration>) {
    match host {
        "slow.test" => (Duration::from_millis(300), None),
        "busy.test" if nth == 1 => (Duration::from_millis(20), Some(Duration::from_secs(1))),
        _ => (Duration::from_millis(20), None),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pacing = Pacing::builder()
        .max_concurrent(2)
        .min_delay(Duration::from_millis(200))
        .jitter(Duration::from_millis(20))
        .build()?;
    println!(
        "pacing per host: at most {} in flight, {:?} between sends and after each completion, up to {:?} jitter\n",
        pacing.max_concurrent(),
        pacing.min_delay(),
        pacing.jitter()
    );
    let limiter = DomainLimiter::new(pacing);

    let mut urls = Vec::new();
    for i in 0..REQUESTS_PER_HOST {
        for host in ["fast.test", "slow.test", "busy.test"] {
            urls.push(Url::parse(&format!("http://{host}/page/{i}"))?);
        }
    }
    let queue = Arc::new(Mutex::new(urls.into_iter()));
    let log = Arc::new(Mutex::new(Vec::<Sent>::new()));
    let counts = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let t0 = Instant::now();

    println!(
        "{:>7}  {:<6}  {:<10}  {:>9}  note",
        "t (ms)", "worker", "host", "waited"
    );
    let mut workers = Vec::new();
    for worker in 1..=3 {
        let (limiter, queue, log, counts) =
            (limiter.clone(), queue.clone(), log.clone(), counts.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let Some(url) = queue.lock().unwrap().next() else {
                    break;
                };
                let permit = match limiter.acquire("demo", &url, None).await {
                    Ok(permit) => permit,
                    Err(err) => {
                        eprintln!("worker {worker}: {err}");
                        continue;
                    }
                };
                let host = permit.host().to_string();
                let send = t0.elapsed();
                let nth = {
                    let mut counts = counts.lock().unwrap();
                    let n = counts.entry(host.clone()).or_default();
                    *n += 1;
                    *n - 1
                };
                let (took, retry_after) = respond(&host, nth);
                let note = match retry_after {
                    Some(d) => format!("429, Retry-After: {}s", d.as_secs()),
                    None => String::new(),
                };
                println!(
                    "{:>7}  {:<6}  {:<10}  {:>7}ms  {note}",
                    send.as_millis(),
                    worker,
                    host,
                    permit.waited().as_millis()
                );
                tokio::time::sleep(took).await;
                if let Some(d) = retry_after {
                    limiter.penalize(&url, d).await.ok();
                }
                let waited = permit.waited();
                drop(permit); // the response is complete
                log.lock().unwrap().push(Sent {
                    host,
                    worker,
                    send,
                    end: t0.elapsed(),
                    waited,
                });
            }
        }));
    }
    for w in workers {
        w.await?;
    }

    let log = log.lock().unwrap();
    println!(
        "\n{:<10}  {:>8}  {:>12}  {:>12}  {:>14}  workers",
        "host", "requests", "min gap", "max in flight", "mean wait"
    );
    let mut hosts: BTreeMap<&str, Vec<&Sent>> = BTreeMap::new();
    for s in log.iter() {
        hosts.entry(&s.host).or_default().push(s);
    }
    for (host, mut sent) in hosts {
        sent.sort_by_key(|s| s.send);
        let min_gap = sent
            .windows(2)
            .map(|w| w[1].send - w[0].send)
            .min()
            .unwrap_or_default();
        let max_in_flight = sent
            .iter()
            .map(|s| {
                sent.iter()
                    .filter(|o| o.send <= s.send && o.end > s.send)
                    .count()
            })
            .max()
            .unwrap_or(0);
        let mean_wait = sent.iter().map(|s| s.waited).sum::<Duration>() / sent.len() as u32;
        let mut workers: Vec<_> = sent.iter().map(|s| s.worker).collect();
        workers.sort();
        workers.dedup();
        println!(
            "{host:<10}  {:>8}  {:>10}ms  {:>12}  {:>12}ms  {workers:?}",
            sent.len(),
            min_gap.as_millis(),
            max_in_flight,
            mean_wait.as_millis()
        );
    }
    println!(
        "\nfinished in {:.1}s; no Redis was needed.",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

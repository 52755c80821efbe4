//! In-process overhead: an uncontended acquire + release, on one host and
//! on 10,000 hosts round-robin, against a baseline built from well-known
//! parts (governor's keyed rate-limiter check plus a tokio Semaphore
//! acquire/release); and the 10,000 hosts again with 1,000 per-host rules
//! (half exact hosts, half suffixes) against the same without rules; and
//! a `snapshot()` of 100,000 hosts with a request in flight each, 1,000
//! of them with an acquire waiting; and a million distinct hosts, each new
//! to the limiter when touched, against governor's keyed check of hosts new
//! to it. Run by `cargo xtask bench`, which reads the results from
//! `target/criterion`.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use redislimit::{DomainLimiter, HostKey, Limiter, Pacing, Policies, Rule};
use tokio::sync::Semaphore;

const HOSTS: usize = 10_000;

/// The hosts of [`million`]; `cargo xtask bench` divides its times by this.
const MILLION: usize = 1_000_000;

fn hosts() -> Vec<HostKey> {
    (0..HOSTS)
        .map(|i| HostKey::parse(&format!("http://h{i}.example/")).unwrap())
        .collect()
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let keys = hosts();
    let names: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    // Pacing that never makes this loop wait: one in flight, released at once.
    let limiter = rt.block_on(async { DomainLimiter::new(Pacing::default()) });
    let quota = Quota::per_second(NonZeroU32::MAX);
    let governor = RateLimiter::keyed(quota);
    let semaphore = Semaphore::new(1);

    let mut group = c.benchmark_group("in_process");
    group
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));

    group.bench_function("ours_one_host", |b| {
        b.to_async(&rt).iter(|| async {
            let permit = limiter
                .acquire_host("bench", keys[0].clone(), None)
                .await
                .unwrap();
            drop(permit);
        })
    });
    group.bench_function("baseline_one_host", |b| {
        b.to_async(&rt).iter(|| async {
            governor.check_key(&names[0]).unwrap();
            drop(semaphore.acquire().await.unwrap());
        })
    });

    let mut i = 0;
    group.bench_function("ours_10k_hosts", |b| {
        b.to_async(&rt).iter(|| {
            i = (i + 1) % HOSTS;
            let key = keys[i].clone();
            let limiter = &limiter;
            async move {
                let permit = limiter.acquire_host("bench", key, None).await.unwrap();
                drop(permit);
            }
        })
    });
    // 1,000 rules: 500 exact hosts (h0 ... h499 match) and 500 suffixes
    // (no host is below one, so every other lookup walks every label).
    let mut policies = Policies::new(Pacing::default());
    for r in 0..500 {
        policies = policies
            .with_rule(Rule::new(format!("h{r}.example"), Pacing::default()))
            .unwrap()
            .with_rule(Rule::new(format!("*.s{r}.example"), Pacing::default()))
            .unwrap();
    }
    let ruled = rt.block_on(async { DomainLimiter::new(policies) });
    let mut k = 0;
    group.bench_function("ours_10k_hosts_1000_rules", |b| {
        b.to_async(&rt).iter(|| {
            k = (k + 1) % HOSTS;
            let key = keys[k].clone();
            let limiter = &ruled;
            async move {
                let permit = limiter.acquire_host("bench", key, None).await.unwrap();
                drop(permit);
            }
        })
    });
    // A snapshot of 100,000 hosts, each with a request in flight, 1,000
    // of them with an acquire waiting behind it.
    let busy = rt.block_on(async { DomainLimiter::new(Pacing::default()) });
    let permits: Vec<_> = rt.block_on(async {
        let mut permits = Vec::with_capacity(100_000);
        for i in 0..100_000 {
            let host = HostKey::parse(&format!("http://s{i}.example/")).unwrap();
            permits.push(busy.acquire_host("bench", host, None).await.unwrap());
        }
        for i in 0..1_000 {
            let host = HostKey::parse(&format!("http://s{i}.example/")).unwrap();
            let busy = busy.clone();
            tokio::spawn(async move { drop(busy.acquire_host("bench", host, None).await) });
        }
        while busy.snapshot(0).queued < 1_000 {
            tokio::task::yield_now().await;
        }
        permits
    });
    group.bench_function("snapshot_100k_hosts", |b| {
        b.iter(|| std::hint::black_box(busy.snapshot(20)))
    });
    drop(permits);
    let mut j = 0;
    group.bench_function("baseline_10k_hosts", |b| {
        b.to_async(&rt).iter(|| {
            j = (j + 1) % HOSTS;
            let (governor, semaphore, name) = (&governor, &semaphore, &names[j]);
            async move {
                governor.check_key(name).unwrap();
                drop(semaphore.acquire().await.unwrap());
            }
        })
    });
    million(&mut group);
    group.finish();
}

/// A crawl's spread: a million hosts, each touched once (acquire and
/// release, a 10 ms gap), on a fresh limiter per iteration and on a
/// multi-thread runtime as a crawl runs (the limiter's sweeper forgets idle
/// hosts on another thread meanwhile). The baseline is governor's keyed
/// check of the same million keys, on a fresh keyed limiter per iteration.
/// One iteration is the whole million; no allocator is instrumented here
/// (`bench`'s `scale` figures measure the memory).
fn million(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let keys: Vec<HostKey> = (0..MILLION)
        .map(|i| HostKey::parse(&format!("http://h{i}.example/")).unwrap())
        .collect();
    let names: Vec<Arc<str>> = keys.iter().map(|k| Arc::from(k.as_str())).collect();
    let delay = Duration::from_millis(10);
    let pacing = Pacing::builder().min_delay(delay).build().unwrap();
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(12))
        .warm_up_time(Duration::from_secs(1));
    group.bench_function("ours_1m_hosts", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (keys, pacing) = (&keys, &pacing);
            async move {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    let limiter = DomainLimiter::new(pacing.clone());
                    let start = Instant::now();
                    for key in keys {
                        let permit = limiter
                            .acquire_host("bench", key.clone(), None)
                            .await
                            .unwrap();
                        drop(permit);
                    }
                    took += start.elapsed();
                }
                took
            }
        })
    });
    let quota = Quota::with_period(delay)
        .unwrap()
        .allow_burst(NonZeroU32::MIN);
    group.bench_function("baseline_1m_hosts", |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                let governor = RateLimiter::keyed(quota);
                let start = Instant::now();
                for name in &names {
                    let _ = std::hint::black_box(governor.check_key(name));
                }
                took += start.elapsed();
            }
            took
        })
    });
}

criterion_group!(benches, overhead);
criterion_main!(benches);

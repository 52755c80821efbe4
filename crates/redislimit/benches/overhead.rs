//! In-process overhead: an uncontended acquire + release, on one host and
//! on 10,000 hosts round-robin, against a baseline built from well-known
//! parts (governor's keyed rate-limiter check plus a tokio Semaphore
//! acquire/release); and the 10,000 hosts again with 1,000 per-host rules
//! (half exact hosts, half suffixes) against the same without rules; and
//! a `snapshot()` of 100,000 hosts with a request in flight each, 1,000
//! of them with an acquire waiting. Run
//! by `cargo xtask bench`, which reads the results from `target/criterion`.

use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use redislimit::{DomainLimiter, HostKey, Limiter, Pacing, Policies, Rule};
use tokio::sync::Semaphore;

const HOSTS: usize = 10_000;

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
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);

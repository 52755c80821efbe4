//! Utilization under saturation: eight replicas (limiters with pools of
//! their own) that together want more than the limit allows, in quota,
//! lease and serialized mode. The figure is the achieved admission rate
//! over the configured limit; the invariants are checked on the same run
//! and any violation is counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redislimit::{HostKey, Limiter, Pacing, RedisLimiter, RedisPool, RedisTimeouts, Tuning};
use redislimit_tests::RedisServer;
use redislimit_tests::record::{Recorder, Request, max_in_flight, max_in_window};
use serde_json::json;

use crate::Figure;

const REPLICAS: usize = 8;
const TASKS: usize = 3;
const RUN: Duration = Duration::from_secs(4);
/// Gaps a run at a slow pace lasts for at least, so that one late
/// admission moves its rate by about a percent, not three.
const GAPS: u32 = 80;
const WARM: Duration = Duration::from_millis(500);

/// Runs every replica's tasks against one host for `RUN`, or `GAPS` times
/// `gap` when longer, each holding its permit for `work`; returns what was
/// admitted.
async fn saturate(replicas: Vec<Arc<dyn Limiter>>, work: Duration, gap: Duration) -> Vec<Request> {
    let recorder = Arc::new(Recorder::new());
    let host = HostKey::parse("http://busy.example/").unwrap();
    let end = Instant::now() + RUN.max(gap * GAPS);
    let mut tasks = Vec::new();
    for (n, limiter) in replicas.into_iter().enumerate() {
        for _ in 0..TASKS {
            let (limiter, recorder, host) =
                (Arc::clone(&limiter), Arc::clone(&recorder), host.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let Ok(permit) = limiter.acquire_host("bench", host.clone(), None).await else {
                        continue;
                    };
                    let send = Instant::now();
                    tokio::time::sleep(work).await;
                    recorder.record("busy.example", n, send, Instant::now());
                    drop(permit);
                }
            }));
        }
    }
    for task in tasks {
        let _ = task.await;
    }
    recorder.all()
}

/// Admissions per second between `WARM` after the first send and the end.
fn rate(reqs: &[Request]) -> f64 {
    let Some(first) = reqs.first() else {
        return 0.0;
    };
    let from = first.send + WARM;
    let counted: Vec<&Request> = reqs.iter().filter(|r| r.send >= from).collect();
    match (counted.first(), counted.last()) {
        (Some(a), Some(b)) if counted.len() > 1 => {
            (counted.len() - 1) as f64 / (b.send - a.send).as_secs_f64()
        }
        _ => 0.0,
    }
}

fn replicas(server: &RedisServer, pacing: &Pacing, cap: u32) -> Vec<Arc<dyn Limiter>> {
    replicas_with(server, pacing, cap, Tuning::DEFAULT_SLOT_MARGIN)
}

/// [`replicas`], aiming `margin` after each slot.
fn replicas_with(
    server: &RedisServer,
    pacing: &Pacing,
    cap: u32,
    margin: Duration,
) -> Vec<Arc<dyn Limiter>> {
    (0..REPLICAS)
        .map(|_| {
            let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
            let limiter = RedisLimiter::builder(pool, "saturation")
                .pacing(pacing.clone())
                .cluster_concurrency(cap)
                .tuning(redislimit::Tuning::default().with_slot_margin(margin))
                .build()
                .unwrap();
            Arc::new(limiter) as Arc<dyn Limiter>
        })
        .collect()
}

/// The lease-mode figure of a run at `delay` apart: the rate against
/// 1 / min_delay, and the gaps the sends kept (any more than `SLACK`
/// short is a violation).
fn lease_figure(name: &str, reqs: &[Request], delay: Duration, margin: Duration) -> Figure {
    let close = reqs
        .windows(2)
        .filter(|w| w[1].send - w[0].send + SLACK < delay)
        .count();
    let violations = close + usize::from(max_in_flight(reqs) > 8);
    let mut gaps: Vec<f64> = reqs
        .windows(2)
        .map(|w| (w[1].send - w[0].send).as_secs_f64() * 1e3)
        .collect();
    gaps.sort_by(f64::total_cmp);
    let min_gap_ms = gaps.first().copied().unwrap_or(f64::NAN);
    let p01_gap_ms = gaps.get(gaps.len() / 100).copied().unwrap_or(f64::NAN);
    // 100 and 200 a second: at least 0.95 of the pace; slower: 0.98.
    let least = if delay < Duration::from_millis(20) {
        0.95
    } else {
        0.98
    };
    let ratio = rate(reqs) * delay.as_secs_f64();
    let figure = Figure::new(
        name,
        rate(reqs),
        1.0 / delay.as_secs_f64(),
        "configured limit: 1 / min_delay",
        "admissions/s",
        json!({
            "replicas": REPLICAS,
            "cluster_concurrency": 8,
            "min_delay_ms": delay.as_secs_f64() * 1e3,
            "slot_margin_us": margin.as_micros() as u64,
            "violations": violations,
            "min_gap_ms": min_gap_ms,
            "p01_gap_ms": p01_gap_ms,
        }),
    );
    judged(
        figure,
        margin,
        &format!("ratio >= {least}"),
        ratio >= least,
        violations,
    )
}

/// Holds `figure`, run with `margin`, to `goal` (`met` or not) and to zero
/// `violations`; with another margin than the default (shown for
/// comparison), to zero violations only.
fn judged(figure: Figure, margin: Duration, goal: &str, met: bool, violations: usize) -> Figure {
    if margin == Tuning::DEFAULT_SLOT_MARGIN {
        figure.held_to(&format!("{goal}, zero violations"), met && violations == 0)
    } else {
        figure.held_to("zero violations (not the default margin)", violations == 0)
    }
}

/// Measured sends trail admissions a little; checks allow this much.
const SLACK: Duration = Duration::from_millis(3);

/// The slot margins a run at `ms` apart is measured with, and the suffix
/// of their figures: the default, and below 100 ms a wide one (1 ms, the
/// default before late admissions were handed back).
fn margins(ms: u64) -> Vec<(&'static str, Duration)> {
    let mut margins = vec![("", Tuning::DEFAULT_SLOT_MARGIN)];
    if ms < 100 {
        margins.push(("_margin_1ms", Duration::from_millis(1)));
    }
    margins
}

pub(crate) async fn run() -> Vec<Figure> {
    let mut figures = Vec::new();

    // (a) Quota: 20 per 500 ms = 40/s, nothing else binding.
    let server = RedisServer::start();
    let window = Duration::from_millis(500);
    let pacing = Pacing::builder()
        .max_concurrent(64)
        .quota(20)
        .window(window)
        .build()
        .unwrap();
    let reqs = saturate(
        replicas(&server, &pacing, 64),
        Duration::from_millis(1),
        Duration::ZERO,
    )
    .await;
    let violations = usize::from(max_in_window(&reqs, window - SLACK) > 20);
    // Whole windows from the first admission: the quota admits in bursts
    // at each window's start, and acquires still waiting when the run ends
    // are admitted after it.
    let span = window * 7;
    let counted = reqs
        .iter()
        .filter(|r| reqs.first().is_some_and(|f| r.send < f.send + span))
        .count();
    let ratio = counted as f64 / span.as_secs_f64() / 40.0;
    figures.push(Figure::new(
        "saturation_quota_utilization",
        counted as f64 / span.as_secs_f64(),
        40.0,
        "configured limit",
        "admissions/s",
        json!({ "replicas": REPLICAS, "quota": 20, "window_ms": 500, "violations": violations }),
    ).held_to(
        "ratio >= 0.98, zero violations",
        ratio >= 0.98 && violations == 0,
    ));

    for ms in [5u64, 10, 25, 100] {
        // (b) Lease mode: sends `ms` apart (200, 100, 40 and 10 a
        // second), cap 8 never binding; with the default slot margin, and
        // with a wide one.
        let delay = Duration::from_millis(ms);
        let pacing = Pacing::builder().min_delay(delay).build().unwrap();
        for (suffix, margin) in margins(ms) {
            let server = RedisServer::start();
            let limiters = replicas_with(&server, &pacing, 8, margin);
            let reqs = saturate(limiters, Duration::from_millis(5), delay).await;
            figures.push(lease_figure(
                &format!("saturation_lease_{ms}ms{suffix}_utilization"),
                &reqs,
                delay,
                margin,
            ));
        }

        if ms < 25 {
            continue;
        }
        // (c) Serialized: 5 ms of work, then `ms` after it ends. The limit
        // is taken from how long requests really held the host (a 5 ms
        // sleep lasts a little longer), so only pacing losses count; with
        // the default slot margin and, at 25 ms, with a wide one.
        for (suffix, margin) in margins(ms) {
            let server = RedisServer::start();
            let work = Duration::from_millis(5);
            let reqs = saturate(replicas_with(&server, &pacing, 0, margin), work, delay).await;
            let violations = reqs
                .windows(2)
                .filter(|w| w[1].send < w[0].end + delay)
                .count();
            let held =
                reqs.iter().map(|r| r.end - r.send).sum::<Duration>() / reqs.len().max(1) as u32;
            let figure = Figure::new(
                &format!("saturation_serialized_{ms}ms{suffix}_utilization"),
                rate(&reqs),
                1.0 / (delay + held).as_secs_f64(),
                "configured limit: 1 / (measured hold + min_delay)",
                "admissions/s",
                json!({ "replicas": REPLICAS, "min_delay_ms": ms, "work_ms": 5, "mean_hold_ms": held.as_secs_f64() * 1e3, "slot_margin_us": margin.as_micros() as u64, "violations": violations }),
            );
            let met = figure.ratio >= 0.98;
            figures.push(judged(figure, margin, "ratio >= 0.98", met, violations));
        }
    }
    figures
}

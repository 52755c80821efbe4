//! Fairness across replicas saturating one host: how evenly the replicas
//! share it, and whether requests waiting at once from different replicas
//! are admitted in the order they started waiting.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redislimit::{HostKey, Limiter, Pacing, RedisLimiter, RedisPool, RedisTimeouts};
use redislimit_tests::RedisServer;
use serde_json::json;

use crate::Figure;

const REPLICAS: usize = 4;
const TASKS: usize = 6;
const RUN: Duration = Duration::from_secs(3);
/// The windows shares are counted in: ten admissions per replica.
const WINDOW: usize = 10 * REPLICAS;

/// One admission: its replica, when its acquire started and when it was
/// admitted.
#[derive(Clone, Copy)]
struct Admission {
    replica: usize,
    asked: Instant,
    admitted: Instant,
}

/// The smallest and largest share of any replica, as a fraction of an
/// equal share, over every `WINDOW` consecutive admissions.
fn shares(admissions: &[Admission]) -> (f64, f64) {
    let equal = (WINDOW / REPLICAS) as f64;
    let (mut least, mut most) = (f64::INFINITY, 0.0f64);
    for window in admissions.windows(WINDOW) {
        let mut counts = [0usize; REPLICAS];
        for a in window {
            counts[a.replica] += 1;
        }
        for &c in &counts {
            least = least.min(c as f64 / equal);
            most = most.max(c as f64 / equal);
        }
    }
    (least, most)
}

/// Of the pairs of requests from different replicas that waited at once,
/// the fraction admitted in the order they started waiting.
fn order_kept(admissions: &[Admission]) -> (f64, usize) {
    let (mut pairs, mut kept) = (0usize, 0usize);
    for a in admissions {
        for b in admissions {
            if a.replica != b.replica && a.asked < b.asked && b.asked < a.admitted {
                pairs += 1;
                kept += usize::from(a.admitted < b.admitted);
            }
        }
    }
    (kept as f64 / pairs.max(1) as f64, pairs)
}

pub(crate) async fn run() -> Vec<Figure> {
    let server = RedisServer::start();
    let delay = Duration::from_millis(5);
    let work = Duration::from_millis(5);
    let pacing = Pacing::builder()
        .max_concurrent(TASKS as u32)
        .min_delay(delay)
        .build()
        .unwrap();
    let host = HostKey::parse("http://fair.example/").unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let end = Instant::now() + RUN;
    let mut tasks = Vec::new();
    for replica in 0..REPLICAS {
        let pool = RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap();
        let limiter: Arc<dyn Limiter> = Arc::new(
            RedisLimiter::builder(pool, "fairness")
                .pacing(pacing.clone())
                .build()
                .unwrap(),
        );
        for _ in 0..TASKS {
            let (limiter, log, host) = (Arc::clone(&limiter), Arc::clone(&log), host.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let asked = Instant::now();
                    let Ok(permit) = limiter.acquire_host("bench", host.clone(), None).await else {
                        continue;
                    };
                    let admitted = Instant::now();
                    log.lock().unwrap().push(Admission {
                        replica,
                        asked,
                        admitted,
                    });
                    tokio::time::sleep(work).await;
                    drop(permit);
                }
            }));
        }
    }
    for task in tasks {
        let _ = task.await;
    }
    let mut admissions = log.lock().unwrap().clone();
    admissions.sort_by_key(|a| a.admitted);
    let (least, most) = shares(&admissions);
    let (kept, pairs) = order_kept(&admissions);
    let params = json!({
        "replicas": REPLICAS,
        "tasks_per_replica": TASKS,
        "mode": "serialized",
        "min_delay_ms": 5,
        "work_ms": 5,
        "admissions": admissions.len(),
        "window": WINDOW,
        "largest_share": most,
        "pairs_waiting_at_once": pairs,
    });
    vec![
        Figure::new(
            "fairness_serialized_smallest_share",
            least,
            1.0,
            "an equal share",
            "fraction",
            params.clone(),
        )
        .held_to(
            "every replica 0.5-1.5 of an equal share in every 40 admissions",
            least >= 0.5 && most <= 1.5,
        ),
        Figure::new(
            "fairness_serialized_order_kept",
            kept,
            1.0,
            "every pair in waiting order",
            "fraction",
            params,
        )
        .at_least(0.9),
    ]
}

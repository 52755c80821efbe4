//! A million hosts, each touched once, then idle: peak memory and memory
//! after eviction, against governor's keyed limiter (whose idle keys are
//! dropped by `retain_recent` + `shrink_to_fit`). Their speed is measured
//! by criterion (`hosts_1m_throughput`), where no allocator counts.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::{Quota, RateLimiter};
use redislimit::{DomainLimiter, HostKey, Pacing};
use serde_json::json;

use crate::{Figure, live_bytes};

const HOSTS: usize = 1_000_000;

/// The heap is sampled for its peak once per this many hosts.
const SAMPLE: usize = 1024;

pub(crate) async fn run() -> Vec<Figure> {
    let keys: Vec<HostKey> = (0..HOSTS)
        .map(|i| HostKey::parse(&format!("http://h{i}.example/")).unwrap())
        .collect();
    let names: Vec<Arc<str>> = keys.iter().map(|k| Arc::from(k.as_str())).collect();
    let delay = Duration::from_millis(10);

    // Ours: acquire + release once per host; eviction is automatic.
    let before = live_bytes();
    let limiter = DomainLimiter::new(Pacing::builder().min_delay(delay).build().unwrap());
    let mut ours_peak = 0;
    for (i, key) in keys.iter().enumerate() {
        drop(
            limiter
                .acquire_host("bench", key.clone(), None)
                .await
                .unwrap(),
        );
        if i % SAMPLE == 0 {
            ours_peak = ours_peak.max(live_bytes() - before);
        }
    }
    let ours_peak = ours_peak.max(live_bytes() - before) as f64;
    tokio::time::sleep(delay + Duration::from_millis(300)).await;
    assert_eq!(limiter.host_count(), 0, "idle hosts were not evicted");
    let ours_after = (live_bytes() - before) as f64;
    drop(limiter);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dropped = (live_bytes() - before) as f64;
    // What the limiter itself still held once idle: the heap at idle less
    // the heap once it is dropped (the runtime keeps what it grew meanwhile).
    let ours_after = ours_after - dropped;

    // Baseline: governor's keyed check (no concurrency, no queue).
    let before = live_bytes();
    let governor = RateLimiter::keyed(
        Quota::with_period(delay)
            .unwrap()
            .allow_burst(NonZeroU32::MIN),
    );
    let mut base_peak = 0;
    for (i, name) in names.iter().enumerate() {
        let _ = governor.check_key(name);
        if i % SAMPLE == 0 {
            base_peak = base_peak.max(live_bytes() - before);
        }
    }
    let base_peak = base_peak.max(live_bytes() - before) as f64;
    tokio::time::sleep(delay + Duration::from_millis(300)).await;
    governor.retain_recent();
    governor.shrink_to_fit();
    let base_after = (live_bytes() - before) as f64;

    let params = json!({
        "hosts": HOSTS,
        "min_delay_ms": delay.as_millis(),
        "peak": format!("the most the heap held, sampled every {SAMPLE} hosts"),
        "note": "ours evicts idle hosts by itself (so its peak is the hosts active within the sweep's grain); governor keeps every key until retain_recent() is called",
        "runtime_growth_bytes": dropped,
    });
    vec![
        Figure::new(
            "hosts_1m_peak_memory",
            ours_peak,
            base_peak,
            "governor keyed state",
            "bytes",
            params.clone(),
        )
        .at_most(1.0),
        Figure::new(
            "hosts_1m_memory_after_idle",
            ours_after.max(0.0),
            base_after.max(0.0),
            "governor after retain_recent",
            "bytes",
            params,
        )
        .held_to("ours <= 4096 bytes", ours_after <= 4096.0),
    ]
}

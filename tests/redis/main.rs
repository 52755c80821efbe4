//! `RedisLimiter` against real Redis servers: the invariants of docs/DESIGN.md
//! measured from what a recording "upstream" saw, on standalone, Cluster and
//! Sentinel deployments, over TLS, with crashed replicas, dead, frozen and
//! failed-over servers, and garbage in the keys; and the values the
//! replicas share (`SharedCache`, `SharedQueue`).

mod agreement;
mod backoff;
mod circuit;
mod clock_ahead;
mod cost;
mod degraded;
mod fairness;
mod faults;
mod garbage;
mod lateness;
mod leases;
mod live;
mod misconfig;
mod modes;
mod policies;
mod queue;
mod renewal;
mod rollout;
mod shared;
mod shutdown;
mod tls;
mod topologies;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redislimit::pacing::PacingBuilder;
use redislimit::redis::RedisLimiterBuilder;
use redislimit::{HostKey, Limiter, Pacing, RedisLimiter, RedisPool, RedisTimeouts};
use redislimit_tests::record::Recorder;

pub(crate) const MS: Duration = Duration::from_millis(1);

pub(crate) fn host(name: &str) -> HostKey {
    HostKey::parse(&format!("http://{name}/")).unwrap()
}

pub(crate) fn standalone(url: &str) -> RedisPool {
    RedisPool::standalone(url, RedisTimeouts::default()).unwrap()
}

/// A limiter over `pool` in scope `test`, with `pacing` and `configure`d.
pub(crate) fn limiter(
    pool: RedisPool,
    pacing: impl FnOnce(PacingBuilder) -> PacingBuilder,
    configure: impl FnOnce(RedisLimiterBuilder) -> RedisLimiterBuilder,
) -> RedisLimiter {
    let pacing = pacing(Pacing::builder()).build().unwrap();
    configure(RedisLimiter::builder(pool, "test").pacing(pacing))
        .build()
        .unwrap()
}

/// Runs `program` on a current-thread runtime of its own, in a thread of
/// its own, as a short program would; the runtime ends with the thread.
pub(crate) fn on_own_runtime<F: Future<Output = ()>>(
    program: impl FnOnce() -> F + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(program());
    })
}

/// Fails the test instead of hanging when `fut` does not finish in `secs`.
pub(crate) async fn bounded<T>(secs: u64, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("did not finish within {secs}s"))
}

/// One replica's traffic: `tasks` tasks each send `per_task` requests,
/// cycling through `hosts`; each request holds its permit for `work` and is
/// recorded as the upstream would see it (sent after admission, ended
/// before release).
pub(crate) async fn drive(
    limiter: Arc<dyn Limiter>,
    replica: usize,
    hosts: &[&str],
    tasks: usize,
    per_task: usize,
    work: Duration,
    recorder: &Arc<Recorder>,
) {
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (limiter, recorder) = (Arc::clone(&limiter), Arc::clone(recorder));
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                let name = &hosts[(task + i) % hosts.len()];
                let permit = limiter
                    .acquire_host("test", host(name), None)
                    .await
                    .unwrap();
                let send = Instant::now();
                tokio::time::sleep(work).await;
                let end = Instant::now();
                drop(permit);
                recorder.record(name, replica, send, end);
            }
        }));
    }
    for handle in handles {
        bounded(60, handle).await.unwrap();
    }
}

/// Runs `drive` for several replicas at once.
pub(crate) async fn drive_all(
    replicas: &[Arc<dyn Limiter>],
    hosts: &[&str],
    tasks: usize,
    per_task: usize,
    work: Duration,
) -> Arc<Recorder> {
    let recorder = Arc::new(Recorder::new());
    let mut all = Vec::new();
    for (i, limiter) in replicas.iter().enumerate() {
        let (limiter, recorder, hosts) = (
            Arc::clone(limiter),
            Arc::clone(&recorder),
            hosts.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>(),
        );
        all.push(tokio::spawn(async move {
            let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
            drive(limiter, i, &hosts, tasks, per_task, work, &recorder).await;
        }));
    }
    for handle in all {
        handle.await.unwrap();
    }
    recorder
}

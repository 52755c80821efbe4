//! Leases: a crashed replica's slot comes back within `lease_ttl`; a live
//! long request keeps its slot by renewing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redislimit::{Limiter, RedisLimiter};
use redislimit_tests::RedisServer;
use redislimit_tests::keys::HostKeys;
use redislimit_tests::record::{Recorder, assert_serialized};

use crate::{MS, bounded, host, limiter, on_own_runtime, standalone};

/// A replica of a host with one slot across replicas, leased for `ttl`.
fn one_slot(server: &RedisServer, ttl: Duration) -> RedisLimiter {
    limiter(
        standalone(&server.url()),
        |p| p,
        |b| {
            b.cluster_concurrency(1)
                .lease_ttl(ttl)
                .tuning(redislimit::Tuning::default().with_concurrency_retry(10 * MS))
        },
    )
}

/// Acquires a permit on a runtime of its own and then "crashes": the permit
/// is leaked and the runtime (with the lease renewal task) is shut down, as
/// when the process dies. Returns the instant just before the acquire.
fn crash_while_holding(l: RedisLimiter) -> Instant {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let before = Instant::now();
        rt.block_on(async {
            let permit = l.acquire_host("t", host("a.test"), None).await.unwrap();
            std::mem::forget(permit);
        });
        drop(rt);
        before
    })
    .join()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_replicas_lease_returns_within_lease_ttl() {
    let server = RedisServer::start();
    let ttl = 400 * MS;
    let make = || one_slot(&server, ttl);
    let before = crash_while_holding(make());
    let survivor = make();
    let permit = bounded(
        10,
        survivor.acquire_host(
            "t",
            host("a.test"),
            Some(tokio::time::Instant::now() + 5 * ttl),
        ),
    )
    .await
    .expect("the dead replica's slot never came back");
    let sent = Instant::now();
    assert!(
        sent >= before + ttl,
        "admitted {:?} after the crash, before the lease ran out",
        sent - before
    );
    drop(permit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serialized_mode_after_a_crash_waits_for_the_lease_and_then_min_delay() {
    let server = RedisServer::start();
    // Both longer than the keys' one second of TTL slack: a gate that lived
    // only max(lease_ttl, min_delay) + 1 s would let the next send in early.
    let (ttl, gap) = (1500 * MS, 1500 * MS);
    let make = || {
        limiter(
            standalone(&server.url()),
            |p| p.min_delay(gap),
            |b| {
                b.lease_ttl(ttl)
                    .tuning(redislimit::Tuning::default().with_concurrency_retry(10 * MS))
            },
        )
    };
    let before = crash_while_holding(make());
    let survivor = make();
    // Arrive after the lease ran out but before the gap did: the state must
    // still say when the host is free.
    tokio::time::sleep_until((before + ttl + gap - 300 * MS).into()).await;
    let permit = bounded(10, survivor.acquire_host("t", host("a.test"), None))
        .await
        .unwrap();
    let sent = Instant::now();
    assert!(
        sent >= before + ttl + gap,
        "sent {:?} after the crash; the host was free only after lease_ttl + min_delay",
        sent - before
    );
    drop(permit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_held_past_the_keys_ttl_keeps_its_slot_by_renewing() {
    let server = RedisServer::start();
    let ttl = 300 * MS;
    for cap in [0, 1] {
        let errors = Arc::new(Errors::default());
        let make = || {
            Arc::new(limiter(
                standalone(&server.url()),
                |p| p,
                |b| {
                    b.cluster_concurrency(cap)
                        .lease_ttl(ttl)
                        .tuning(redislimit::Tuning::default().with_concurrency_retry(10 * MS))
                        .prefix(format!("cap{cap}"))
                        .hooks(errors.clone())
                },
            ))
        };
        let (a, b) = (make(), make());
        let rec = Arc::new(Recorder::new());
        let long = a.acquire_host("t", host("a.test"), None).await.unwrap();
        let send = Instant::now();
        let other = the_other_replica(&b, &rec, 10 * MS);
        // Longer than the keys' own TTL (lease_ttl + 1 s): only renewals
        // keep the slot.
        tokio::time::sleep(8 * ttl).await;
        assert!(
            !other.is_finished(),
            "cap {cap}: the long request's slot was taken"
        );
        assert!(
            errors.0.lock().unwrap().is_empty(),
            "cap {cap}: {:?}",
            errors.0.lock().unwrap()
        );
        rec.record("a.test", 0, send, Instant::now());
        drop(long);
        bounded(10, other).await.unwrap();
        assert_serialized(&rec.host("a.test"), Duration::ZERO);
    }
}

/// The other replica's one request to `a.test`, held for `hold` and
/// recorded as the upstream sees it (sent after admission, ended before
/// release).
fn the_other_replica(
    b: &Arc<RedisLimiter>,
    rec: &Arc<Recorder>,
    hold: Duration,
) -> tokio::task::JoinHandle<()> {
    let (b, rec) = (Arc::clone(b), Arc::clone(rec));
    tokio::spawn(async move {
        let p = b.acquire_host("t", host("a.test"), None).await.unwrap();
        let send = Instant::now();
        tokio::time::sleep(hold).await;
        rec.record("a.test", 1, send, Instant::now());
        drop(p);
    })
}

/// A limiter's first renewals are started by one task, on the runtime of
/// its first permit. When that runtime ends, a permit held on another
/// runtime still renews: another replica never gets the one slot it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_keeps_renewing_after_the_runtime_of_the_first_one_ends() {
    let server = RedisServer::start();
    let ttl = 300 * MS;
    let (a, b) = (
        Arc::new(one_slot(&server, ttl)),
        Arc::new(one_slot(&server, ttl)),
    );
    // The first permit, on a runtime of its own, which then ends.
    let (started, start) = std::sync::mpsc::channel();
    let (end, ended) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let a = Arc::clone(&a);
        on_own_runtime(move || async move {
            drop(a.acquire_host("t", host("first.test"), None).await.unwrap());
            started.send(()).unwrap();
            let _ = ended.await;
        })
    };
    start.recv().unwrap();
    let long = a.acquire_host("t", host("a.test"), None).await.unwrap();
    end.send(()).unwrap();
    first.join().unwrap();
    let rec = Arc::new(Recorder::new());
    let send = Instant::now();
    let other = the_other_replica(&b, &rec, Duration::ZERO);
    // Longer than the keys' own TTL (lease_ttl + 1 s): only renewals keep
    // the slot.
    tokio::time::sleep(8 * ttl).await;
    assert!(!other.is_finished(), "the long request's slot was taken");
    rec.record("a.test", 0, send, Instant::now());
    drop(long);
    bounded(10, other).await.unwrap();
    assert_serialized(&rec.host("a.test"), Duration::ZERO);
}

/// Records every error a limiter reports.
#[derive(Debug, Default)]
struct Errors(std::sync::Mutex<Vec<String>>);

impl redislimit::Hooks for Errors {
    fn on_error(&self, op: redislimit::Op, error: &redislimit::Error) {
        self.0.lock().unwrap().push(format!("{op}: {error:?}"));
    }
}

/// A limiter in lease mode (one slot a host) on `server`, its own tasks
/// (the heartbeat) started on this runtime by a first admission.
async fn lease_mode(server: &RedisServer) -> Arc<RedisLimiter> {
    let l = Arc::new(limiter(
        standalone(&server.url()),
        |p| p,
        |b| b.cluster_concurrency(1),
    ));
    drop(
        bounded(5, l.acquire_host("t", host("warm.test"), None))
            .await
            .unwrap(),
    );
    l
}

/// The hosts of `names` whose lease set still holds a lease after up to
/// 5 s (a release on its way lands in milliseconds on loopback).
async fn still_leased(server: &RedisServer, names: &[String]) -> Vec<String> {
    let leased = |name: &String| {
        server
            .command(&["TYPE", &HostKeys::of("test", name).leases])
            .trim()
            != "+none"
    };
    let start = Instant::now();
    while names.iter().any(leased) && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(50 * MS).await;
    }
    names.iter().filter(|n| leased(n)).cloned().collect()
}

/// A crowd of completions goes back gathered into pipelines: three hundred
/// permits dropped at once all give their leases back, one whose lease set
/// became garbage while it was held among them (its `ZREM` refused in the
/// pipeline, the script replaces the garbage on its own), and `close`
/// waits for every one to land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_completions_gives_every_lease_back() {
    let server = RedisServer::start();
    let l = lease_mode(&server).await;
    let names: Vec<String> = (0..300).map(|i| format!("crowd{i}.test")).collect();
    let mut acquiring = tokio::task::JoinSet::new();
    for name in &names {
        let (l, name) = (Arc::clone(&l), name.clone());
        acquiring.spawn(async move { l.acquire_host("t", host(&name), None).await.unwrap() });
    }
    let permits = bounded(10, acquiring.join_all()).await;
    let keys: Vec<HostKeys> = names.iter().map(|n| HostKeys::of("test", n)).collect();
    for k in &keys {
        assert_eq!(server.command(&["ZCARD", &k.leases]).trim(), ":1", "{k:?}");
    }
    server.command(&["SET", &keys[150].leases, "garbage"]);
    drop(permits);
    bounded(
        10,
        l.close(Some(tokio::time::Instant::now() + Duration::from_secs(5))),
    )
    .await
    .expect("close: every release landed");
    for k in &keys {
        assert_eq!(
            server.command(&["TYPE", &k.leases]).trim(),
            "+none",
            "a lease was not given back: {k:?}"
        );
    }
}

/// A permit of a current-thread runtime releases on a task of that runtime
/// alone, which runs only while something blocks on it: it must not be the
/// one sending the completions gathered from another runtime, which would
/// then wait with it. Here the current-thread runtime is left idle with its
/// release unsent, and the other runtime's completions all land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_of_one_runtime_do_not_wait_for_an_idle_one() {
    let server = RedisServer::start();
    let l = lease_mode(&server).await;
    let idle_runtime = {
        let l = Arc::clone(&l);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let permit = rt
                .block_on(l.acquire_host("t", host("idle.test"), None))
                .unwrap();
            // Dropped outside `block_on`: its release waits for the runtime
            // to run again, which it does not until the end of the test.
            drop(permit);
            rt
        })
        .join()
        .unwrap()
    };
    let idle = HostKeys::of("test", "idle.test");
    let names: Vec<String> = (0..20).map(|i| format!("busy{i}.test")).collect();
    for name in &names {
        drop(
            bounded(5, l.acquire_host("t", host(name), None))
                .await
                .unwrap(),
        );
    }
    let waiting = still_leased(&server, &names).await;
    assert!(
        waiting.is_empty(),
        "completions waited for the idle runtime: {waiting:?}"
    );
    // The idle runtime's own release is still on its way, as before.
    assert_eq!(server.command(&["ZCARD", &idle.leases]).trim(), ":1");
    // A runtime is dropped outside another's context.
    std::thread::spawn(move || drop(idle_runtime))
        .join()
        .unwrap();
}

/// The task sending gathered completions runs on the runtime of the permit
/// that found none sending. When that runtime shuts down with a pipeline on
/// its way (here Redis is frozen, so it hangs), the completions of another
/// runtime queued behind it are handed to their own runtime, and land once
/// Redis answers again (the dead runtime's own release may be lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_queued_behind_a_runtime_that_shuts_down_still_land() {
    let server = RedisServer::start();
    let l = lease_mode(&server).await;
    let (other, other_permit) = {
        let l = Arc::clone(&l);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let permit = rt
                .block_on(l.acquire_host("t", host("other.test"), None))
                .unwrap();
            (rt, permit)
        })
        .join()
        .unwrap()
    };
    let names: Vec<String> = (0..20).map(|i| format!("mine{i}.test")).collect();
    let mut permits = Vec::new();
    for name in &names {
        permits.push(
            bounded(5, l.acquire_host("t", host(name), None))
                .await
                .unwrap(),
        );
    }
    server.pause();
    // The other runtime's completion starts the sending task there; this
    // runtime's queue behind its pipeline, which Redis, frozen, holds.
    drop(other_permit);
    tokio::time::sleep(20 * MS).await;
    drop(permits);
    tokio::time::sleep(20 * MS).await;
    std::thread::spawn(move || drop(other)).join().unwrap();
    server.resume();
    let waiting = still_leased(&server, &names).await;
    assert!(waiting.is_empty(), "completions never landed: {waiting:?}");
}

//! The in-process acquire: the fast path when the host is free and nobody
//! waits, else a place in the host's line until its turn.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::host::{Admission, Decision};
use super::shards::{Inner, LocalAdmission, Place, Waiter, ahead_of, enqueue, lock, place_for};
use crate::hooks::WaitReport;
use crate::pacing::after;
use crate::{Error, HostKey, Permit, RequestPacing, WaitOutcome};

/// What the loop in [`acquire`] does next.
enum Step {
    Admitted(Admission),
    /// Head of the line, host not ready before this instant.
    Sleep(Instant),
    /// Behind others, or the host is full: wait for a wake-up. Carries the
    /// earliest instant a send could happen, for the deadline check.
    Park(Instant),
}

pub(super) async fn acquire(
    inner: &Arc<Inner>,
    engine: &str,
    host: HostKey,
    deadline: Option<Instant>,
    request: RequestPacing,
) -> Result<Permit, Error> {
    if let Some(lookup) = inner.policies.resolving(&host) {
        lookup.await;
    }
    let policy = inner.policies.index(&host);
    let pacing = inner.policies.at(policy);
    // From here on the state's key (the host itself unless keyed otherwise).
    let host = inner.policies.key_of(host);
    let weight = request.check_weight(&host, pacing.max_concurrent(), pacing.quota())?;
    let priority = request.priority();
    inner.sweep.ensure_running(inner);
    let start = Instant::now();
    let report = WaitReport::new(&*inner.hooks, engine, &host, start);
    let shard = inner.shard(&host);

    // Fast path: nobody waiting and the host ready. Otherwise join the line.
    let (id, wake) = {
        let mut guard = lock(shard);
        // Under the shard's lock, which `close` takes after setting the
        // flag: a waiter queued here is either refused or woken by it.
        if inner.closed.load(Ordering::SeqCst) {
            drop(guard);
            report.abandon();
            return Err(Error::Closed);
        }
        let entry = guard.entry(&host, start, policy);
        if entry.queue.is_empty() && entry.state.decide(start, pacing, weight) == Decision::Admit {
            let admission = entry.state.admit(start, pacing, weight);
            entry.policy = inner.policies.longer_lived(entry.policy, policy);
            guard.in_flight += weight as usize;
            if inner.track_in_flight {
                guard.mark(&host, true);
            }
            drop(guard);
            report.finish_waited(WaitOutcome::Acquired, Duration::ZERO);
            return Ok(permit(inner, host, Duration::ZERO, admission, policy));
        }
        if let Some(max) = pacing.max_queued()
            && entry.queue.len() >= max as usize
        {
            let queued = entry.queue.len();
            guard.settle(&host, &inner.policies, &inner.sweep);
            drop(guard);
            return Err(report.queue_full(queued, max));
        }
        if let Some(deadline) = deadline {
            // Only those it would queue behind, and cannot overtake, are
            // ahead of it.
            let place = place_for(&entry.queue, priority);
            let ahead = ahead_of(&entry.queue, place, weight);
            let earliest = entry.state.earliest_for(start, ahead, pacing);
            if earliest > deadline {
                drop(guard);
                return Err(report.over_budget(earliest, deadline, start));
            }
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let cap = pacing.max_concurrent();
        let waiter = Waiter {
            id,
            priority,
            weight,
            cap,
            wake: Arc::clone(&wake),
        };
        enqueue(&mut entry.queue, waiter);
        guard.queued += 1;
        guard.mark(&host, inner.track_in_flight);
        (id, wake)
    };
    let place = Place {
        inner,
        host: &host,
        id,
        queued: true,
    };
    // The wait, in a future of its own: an admission on the fast path
    // never carries (or moves) the waiting loop's state.
    let queued = Queued {
        policy,
        weight,
        priority,
        wake,
    };
    Box::pin(wait_in_line(inner, place, deadline, report, queued)).await
}

/// An acquire that joined its host's line, as [`wait_in_line`] takes it.
struct Queued {
    policy: usize,
    weight: u32,
    priority: u8,
    wake: Arc<Notify>,
}

/// Waits at `place` in its host's line until admitted, or until it gives
/// up or is dropped (leaving the line).
async fn wait_in_line(
    inner: &Arc<Inner>,
    place: Place<'_>,
    deadline: Option<Instant>,
    report: WaitReport<'_>,
    queued: Queued,
) -> Result<Permit, Error> {
    // Bound in this order, so that a cancelled acquire leaves the line
    // (`place` drops) before its hooks hear of it (`report` drops).
    let report = report;
    let mut place = place;
    let Queued {
        policy,
        weight,
        priority,
        wake,
    } = queued;
    let (host, id) = (place.host, place.id);
    let pacing = inner.policies.at(policy);
    let shard = inner.shard(host);

    loop {
        let now = Instant::now();
        if inner.closed.load(Ordering::SeqCst) {
            // `place` leaves the line as it drops.
            return Err(Error::Closed);
        }
        let step = {
            let mut guard = lock(shard);
            let entry = guard.entry(host, now, policy);
            let step = match entry.queue.iter().position(|w| w.id == id) {
                Some(at) if entry.may_decide(at) => match entry.state.decide(now, pacing, weight) {
                    Decision::Admit => {
                        entry.queue.remove(at);
                        let admission = entry.state.admit(now, pacing, weight);
                        entry.policy = inner.policies.longer_lived(entry.policy, policy);
                        entry.wake_turns();
                        Step::Admitted(admission)
                    }
                    Decision::WaitUntil(at) => Step::Sleep(at),
                    Decision::Full => Step::Park(entry.state.earliest_for(now, 0, pacing)),
                },
                Some(at) => {
                    let ahead = ahead_of(&entry.queue, at, weight);
                    Step::Park(entry.state.earliest_for(now, ahead, pacing))
                }
                // Unreachable while `place` is queued (a host with waiters
                // is never evicted); rejoining keeps the waiter correct.
                None => {
                    let waiter = Waiter {
                        id,
                        priority,
                        weight,
                        cap: pacing.max_concurrent(),
                        wake: Arc::clone(&wake),
                    };
                    enqueue(&mut entry.queue, waiter);
                    guard.queued += 1;
                    guard.mark(host, inner.track_in_flight);
                    Step::Park(now)
                }
            };
            if matches!(step, Step::Admitted(_)) {
                guard.queued -= 1;
                guard.in_flight += weight as usize;
                guard.mark(host, inner.track_in_flight);
            }
            step
        };
        match step {
            Step::Admitted(admission) => {
                place.queued = false;
                let waited = report.finish(WaitOutcome::Acquired);
                return Ok(permit(inner, host.clone(), waited, admission, policy));
            }
            Step::Sleep(at) => {
                let wake_at = match deadline {
                    Some(deadline) if at > deadline => {
                        return Err(report.over_budget(at, deadline, now));
                    }
                    // Jitter spreads replicas out but never costs the budget.
                    Some(deadline) => after(now, pacing.jittered(at - now)).min(deadline),
                    None => after(now, pacing.jittered(at - now)),
                };
                tokio::select! {
                    () = tokio::time::sleep_until(wake_at) => {}
                    () = wake.notified() => {}
                }
            }
            Step::Park(earliest) => match deadline {
                Some(deadline) if earliest > deadline || now >= deadline => {
                    return Err(report.over_budget(earliest, deadline, now));
                }
                Some(deadline) => tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = wake.notified() => {}
                },
                None => wake.notified().await,
            },
        }
    }
}

/// The permit of `admission`, made under `policy`.
fn permit(
    inner: &Arc<Inner>,
    host: HostKey,
    waited: Duration,
    admission: Admission,
    policy: usize,
) -> Permit {
    let admitted = LocalAdmission {
        inner: Arc::clone(inner),
        admission,
        policy,
    };
    Permit::admitted(host, waited, admitted)
}

//! A `RedisLimiter`'s acquire: the agreement checked, a place in this
//! process's queues, then script calls until Redis admits (waiting the
//! pause it decides between them, see `pause.rs`), a late admission handed
//! back (see `lateness.rs`), and the permit that holds the slot.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use super::backend::CallError;
use super::core::Core;
use super::lateness::{Verdict, verdict};
use super::pause::{Fit, Timing, Told, fit, pause};
use super::registry::{Lapse, less_lapsed};
use super::scripts::acquire::Reply;
use super::slots::{Booking, InLine, Ticket, hand_back, new_token, permit};
use crate::hooks::WaitReport;
use crate::pacing::after;
use crate::permit::Unsent;
use crate::{Error, Hooks, HostKey, Op, Permit, RequestPacing, WaitOutcome};

/// How long past the caller's deadline a call that started at it may take
/// to be answered (Redis answers in well under a millisecond).
const CALL_GRACE: Duration = Duration::from_millis(50);

/// How soon an acquire for a host that a replica cut off from Redis serves
/// alone asks again whether it still does.
const LAPSE_RETRY: Duration = Duration::from_millis(250);

/// Runs `call`, bounded by the caller's deadline as well as by the client's
/// timeouts, so a slow Redis cannot hold a caller far past its budget; a
/// call that starts at the deadline (its host frees just in time) still
/// gets [`CALL_GRACE`] to be answered. `None` when the budget ran out.
pub(super) async fn within<T>(
    deadline: Option<Instant>,
    call: impl Future<Output = T>,
) -> Option<T> {
    match deadline {
        Some(deadline) => {
            let bound = deadline.max(after(Instant::now(), CALL_GRACE));
            tokio::time::timeout_at(bound, call).await.ok()
        }
        None => Some(call.await),
    }
}

/// What one acquire call said that the loop acts on.
enum Answer {
    /// Admitted at `at_us` on the Redis clock, for a send `ahead` from now.
    Admitted { ahead: Duration, at_us: u64 },
    /// Not before `wait`; `full` when the in-flight cap is taken.
    Wait { wait: Duration, full: bool },
}

/// Acquires a permit for `host` through Redis (see [`RedisLimiter`'s
/// docs](crate::RedisLimiter)), reporting to `hooks`.
pub(super) async fn acquire(
    core: &Arc<Core>,
    hooks: &dyn Hooks,
    engine: &str,
    host: HostKey,
    deadline: Option<Instant>,
    request: RequestPacing,
) -> Result<Permit, Error> {
    let settings = &core.settings;
    let backend = &core.backend;
    if let Some(lookup) = settings.policies.resolving(&host) {
        lookup.await;
    }
    let start = Instant::now();
    let policy = settings.policies.index(&host);
    // The state's key; `host` still picks the in-process queues' rules.
    let key = settings.policies.key(&host);
    let mut args = settings.args[policy];
    let mut report = WaitReport::new(hooks, engine, &key, start);
    args.weight = request
        .check_weight(&key, args.mode.in_flight(), args.quota)
        .map_err(|e| report.fail(e))?;
    let weight = args.weight;
    core.agreement.touch();
    core.registry
        .ensure_heartbeat(&core.backend, &core.lifecycle, &core.agreement);
    let keys = Arc::new(settings.keys(&host));
    // For a Cluster, the circuit of the node serving the host.
    let circuit = backend.circuit(keys.gate());
    if circuit.waiting() {
        report.abandon();
        return Err(CallError::Skipped.into_error(Op::Acquire));
    }
    // Bounded like an acquire's own call: a caller's deadline that runs out
    // is a blown budget, not a Redis failure.
    let agreeing = core.agreement.agree(backend, &*core.hooks, false);
    let Some(agreed) = within(deadline, agreeing).await else {
        let now = Instant::now();
        return Err(report.over_budget(now, deadline.unwrap_or(now), now));
    };
    if let Err(err) = agreed {
        // A mismatch was reported where it was found.
        if err.is_unavailable() {
            core.hooks.on_error(Op::Acquire, &err);
            tracing::warn!(host = %key, error = %crate::error::Causes(&err), "acquire failed");
        }
        report.abandon();
        return Err(err);
    }
    // Queued here at weight 1: this process's own slots must not hold back
    // a lighter request while Redis refuses a heavy one (which Redis alone
    // can tell); its weight counts here once admitted.
    let mut local = core
        .queues
        .local
        .acquire_with(engine, host.clone(), deadline, request.with_weight(1))
        .await
        .map_err(|e| report.fail(e))?;
    // One waiter per host and process asks Redis at a time; the rest queue
    // here, in order. Fewer callers race at each opening, and a crowd of
    // waiters costs Redis one caller per process. Requests heavier than 1
    // have their own line, so that one Redis refuses for want of room never
    // holds up lighter ones (best fit).
    let pollers = if args.weight > 1 {
        &core.queues.heavy
    } else {
        &core.queues.pollers
    };
    let polling = pollers
        .acquire_with(engine, host.clone(), deadline, request.with_weight(1))
        .await
        .map_err(|e| report.fail(e))?;
    let mut ticket = Ticket {
        keys,
        token: new_token(),
        args,
    };
    let runtime = Handle::current();
    // Told to wait, a request of weight 1 is in the waiting line across
    // replicas; one that ends without an admission leaves it.
    let in_line = InLine::new(core, &ticket, &runtime);
    let mut retried_after_release = false;
    // The room the last hand-back asked for, at least.
    let mut room_floor = Duration::ZERO;
    let lifecycle = &core.lifecycle;
    loop {
        // A full host may be full of this process's own requests whose
        // releases are still on their way to Redis (sent after this
        // acquire): listen for them before asking, so the answer "full" can
        // be retried as soon as one lands, not a retry interval later.
        let released = lifecycle.released().notified();
        tokio::pin!(released);
        released.as_mut().enable();
        let releasing = lifecycle.releasing();
        // Checked before anything is sent: an acquire refused here never
        // reached Redis, so there is nothing to take back. First without a
        // side effect, so that a circuit held open fails at once rather than
        // after a turn; once the turn is had, for real (a caller let through
        // then is the probe).
        if circuit.waiting() {
            report.abandon();
            return Err(CallError::Skipped.into_error(Op::Acquire));
        }
        // A replica cut off from Redis may be sending to this host on its
        // own: its share stays free, or the host is its alone until it is
        // back. Read before every call, as the heartbeat last saw it.
        let lapse = core.registry.lapse(settings, &host);
        if lapse == Lapse::Defer {
            if lifecycle.is_closed() {
                return Err(report.fail(Error::Closed));
            }
            let retry = after(Instant::now(), LAPSE_RETRY);
            if let Some(deadline) = deadline
                && retry > deadline
            {
                tokio::time::sleep_until(deadline).await;
                let now = Instant::now();
                return Err(report.over_budget(retry, deadline, now));
            }
            tokio::time::sleep_until(retry).await;
            continue;
        }
        less_lapsed(&mut ticket.args, &settings.args[policy], weight, lapse);
        // A crowd of acquires (a crawl's first one per host) waits its turn
        // here, not in Redis, where its replies would outlast the response
        // timeout and open the circuit.
        let Some(turn) = within(deadline, backend.acquire_turn()).await else {
            let now = Instant::now();
            return Err(report.over_budget(now, deadline.unwrap_or(now), now));
        };
        let turn = turn.ok_or(Error::Closed).map_err(|e| report.fail(e))?;
        if circuit.open() {
            report.abandon();
            return Err(CallError::Skipped.into_error(Op::Acquire));
        }
        // Room after the slot for how late this process's sends leave.
        let room = if ticket.args.sends_late() {
            core.lateness.room().max(room_floor)
        } else {
            Duration::ZERO
        };
        ticket.args.room_us = u64::try_from(room.as_micros()).unwrap_or(u64::MAX);
        let horizon = settings.horizon(policy, deadline);
        let answer = {
            let booking = Booking::new(core, &ticket, &runtime, Some(&in_line));
            let asked = call(core, &ticket, horizon);
            let answer = within(deadline, asked).await;
            drop(turn);
            let Some(answer) = answer else {
                // The caller's budget ran out, not Redis: a blown budget,
                // which opens no circuit. The call may still run, so the
                // booking stays armed.
                drop(booking);
                let now = Instant::now();
                return Err(report.over_budget(now, deadline.unwrap_or(now), now));
            };
            booking.settle(&answer);
            answer
        };
        let (wait, full) = match answer {
            Ok(Answer::Admitted { ahead, at_us }) => {
                // Admitted, it left the line.
                in_line.disarm();
                // Counted from the end of its room.
                ticket.args.admitted_us = at_us.saturating_add(ticket.args.room_us);
                if ahead.is_zero()
                    && ticket.args.sends_late()
                    && let Some(again) = late(core, &key, &ticket, at_us, room)
                {
                    room_floor = again;
                    let back = hand_back(core, &ticket, &runtime);
                    let Some(back) = within(deadline, back).await else {
                        // The hand-back goes on without this caller.
                        let now = Instant::now();
                        return Err(report.over_budget(now, deadline.unwrap_or(now), now));
                    };
                    if let Err(err) = back {
                        // The runtime is shutting down.
                        if matches!(err, Error::Closed) {
                            return Err(report.fail(err));
                        }
                        core.hooks.on_error(Op::Acquire, &err);
                        tracing::warn!(host = %key, error = %crate::error::Causes(&err), "acquire failed");
                        report.abandon();
                        return Err(err);
                    }
                    ticket.args.admitted_us = 0;
                    continue;
                }
                // The next caller of this process may book the slot after
                // this one while this one waits for its own.
                drop(polling);
                local.reweigh(ticket.args.weight);
                let permit = permit(core, key.clone(), Duration::ZERO, ticket, local, runtime);
                if ahead.is_zero() {
                    return Ok(permit.waited_for(report.finish(WaitOutcome::Acquired)));
                }
                // Dropped before its slot, the booking is handed back.
                let unsent = Unsent::new(permit);
                super::precise::sleep(ahead).await;
                let waited = report.finish(WaitOutcome::Acquired);
                return unsent
                    .take()
                    .map(|permit| permit.waited_for(waited))
                    .ok_or(Error::Closed);
            }
            Ok(Answer::Wait { wait, full }) => {
                in_line.arm(ticket.args.weight == 1);
                (wait, full)
            }
            Err(err) => {
                let err = err.into_error(Op::Acquire);
                core.hooks.on_error(Op::Acquire, &err);
                tracing::warn!(host = %key, error = %crate::error::Causes(&err), "acquire failed");
                report.abandon();
                return Err(err);
            }
        };
        let now = Instant::now();
        let told = Told { wait, full };
        let pause = pause(
            told,
            Timing {
                horizon,
                slot_margin: settings.slot_margin,
                round_trip: backend.round_trip(),
                concurrency_retry: settings.concurrency_retry,
            },
        );
        let jittered = settings.policies.at(policy).jittered(pause);
        let wake = match fit(now, told, pause, jittered, deadline) {
            Fit::Sleep(wake) => wake,
            Fit::OverBudget { earliest } => {
                return Err(report.over_budget(earliest, deadline.unwrap_or(now), now));
            }
        };
        // A release may also have set off, or landed, during the call.
        let landed = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(released.as_mut().poll(cx).is_ready())
        })
        .await;
        let releasing = releasing || landed || lifecycle.releasing();
        if full && releasing && !retried_after_release {
            retried_after_release = true;
            tokio::select! {
                () = released => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        } else if full {
            tokio::time::sleep_until(wake).await;
        } else {
            // Timed finer than Tokio's millisecond: the slot is known.
            super::precise::sleep(wake.saturating_duration_since(Instant::now())).await;
        }
    }
}

/// One acquire call for `ticket`, booked ahead when its wait is within
/// `horizon`: what it says the loop does.
async fn call(core: &Core, ticket: &Ticket, horizon: Duration) -> Result<Answer, CallError> {
    let reply = core
        .backend
        .acquire(
            &ticket.keys,
            &ticket.token,
            &ticket.args,
            core.settings.lease_ttl_us,
            horizon,
        )
        .await?;
    Ok(match reply {
        Reply::Admitted { now_us, ahead_us } => Answer::Admitted {
            ahead: Duration::from_micros(ahead_us),
            at_us: now_us.saturating_add(ahead_us),
        },
        Reply::Wait { wait_us, full } => Answer::Wait {
            wait: Duration::from_micros(wait_us),
            full,
        },
        Reply::Voided => {
            return Err(CallError::BadReply(
                "this acquire had been abandoned (its call timed out) before Redis ran it"
                    .to_owned(),
            ));
        }
        Reply::Healed { wait_us } => {
            let gate = ticket.keys.gate();
            tracing::warn!(%gate, "pacing state of the wrong type or unparseable was replaced; the host is held for lease_ttl");
            core.hooks.on_repair(gate);
            Answer::Wait {
                wait: Duration::from_micros(wait_us),
                full: false,
            }
        }
    })
}

/// An admission of `ticket` made at `at_us` (Redis clock) with `room` for
/// its lateness reached its caller now: `None` when it is sent, else the
/// room to ask for again once it is handed back (see `lateness.rs`).
/// Lateness beyond `max_lateness` widens this process's room, reaches the
/// hooks, and is logged at most once a minute, with counts.
fn late(
    core: &Core,
    host: &HostKey,
    ticket: &Ticket,
    at_us: u64,
    room: Duration,
) -> Option<Duration> {
    let late = core.backend.late(at_us, Instant::now());
    let max_lateness = core.settings.max_lateness;
    if late <= max_lateness {
        return None;
    }
    let lateness = &core.lateness;
    lateness.seen(late);
    let again = match verdict(late, room, max_lateness, lateness.most()) {
        Verdict::Send => None,
        Verdict::HandBack { room } => Some(room),
    };
    let gate = ticket.keys.gate();
    core.hooks.on_late_admission(gate, late, again.is_some());
    tracing::debug!(%host, late_us = late.as_micros() as u64, room_us = room.as_micros() as u64, handed_back = again.is_some(), "admission reached its caller late");
    if let Some(r) = lateness.note(host.as_str(), late, again.is_some()) {
        tracing::warn!(
            late = r.late,
            handed_back = r.handed_back,
            worst_ms = r.worst.as_millis() as u64,
            worst_host = %r.worst_key,
            over_s = r.over.as_secs(),
            room_ms = lateness.room().as_millis() as u64,
            "admissions reach this process late (it is busy): each acquire keeps room after its slot for its lateness, which slows its hosts' pace by as much; one later than its room is handed back unsent and asked for again (reported at most once a minute, counts since the last report)"
        );
    }
    again
}

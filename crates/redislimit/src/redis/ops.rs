//! A `RedisLimiter`'s operations besides the acquire: adopting a request
//! sent while Redis was away, a penalty, a backoff step, a snapshot of
//! this process's part, and closing.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use super::backend::CallError;
use super::core::Core;
use super::keys::RedisKeys;
use super::scripts::backoff::Step;
use super::scripts::penalize::Kind;
use super::settings::Mode;
use super::slots::{Booking, Ticket, new_token, permit};
use crate::limiter::heaviest;
use crate::pacing::after;
use crate::snapshot::{HostSnapshot, PacedBy, Snapshot, TopHosts};
use crate::{BackoffStep, Error, HostKey, Limiter, Op, Permit};

/// Registers a request in flight since `ago` (admitted in-process while
/// Redis was away) as holding a slot; see `Limiter::adopt_host`. It skips a
/// Redis the circuit holds off until the next probe is due, and may itself
/// be that probe.
pub(super) async fn adopt(
    core: &Arc<Core>,
    host: HostKey,
    ago: Duration,
    weight: u32,
) -> Result<Option<Permit>, Error> {
    let settings = &core.settings;
    let mut args = settings.args[settings.policies.index(&host)];
    // Admitted in-process under the same caps (see fallback_policies); kept
    // within them all the same.
    args.weight = weight.clamp(1, heaviest(args.mode.in_flight(), args.quota));
    let host = settings.policies.key(&host);
    let keys = Arc::new(RedisKeys::new(&settings.prefix, &settings.scope, &host));
    // Skips a Redis (node) that failed moments ago, like an acquire; when
    // the probe is due, this may be it.
    if core.backend.circuit(keys.gate()).open() {
        return Err(CallError::Skipped.into_error(Op::Acquire));
    }
    let ticket = Ticket {
        keys,
        token: new_token(),
        args,
    };
    let runtime = Handle::current();
    let ago_us = u64::try_from(ago.as_micros())
        .unwrap_or(u64::MAX)
        .min(crate::MAX_MICROS);
    let adopted = {
        // Dropped mid-call, or lost with its connection, the script may
        // still have booked the slot: the guard then releases it.
        let booking = Booking::new(core, &ticket, &runtime, None);
        let adopted = core
            .backend
            .adopt(
                &ticket.keys,
                &ticket.token,
                &ticket.args,
                settings.lease_ttl_us,
                ago_us,
            )
            .await;
        booking.settle(&adopted);
        adopted.map_err(|e| e.into_error(Op::Acquire))?
    };
    if adopted {
        tracing::info!(host = %host, "a request admitted in-process now counts in Redis");
        let local = Permit::new(host.clone(), Duration::ZERO, || {});
        Ok(Some(permit(
            core,
            host,
            Duration::ZERO,
            ticket,
            local,
            runtime,
        )))
    } else {
        tracing::warn!(host = %host, "another replica held the host when Redis came back; the request in flight overlaps it");
        Ok(None)
    }
}

/// Holds `host` back for `hold` (capped by its `max_penalty`) on every
/// replica.
pub(super) async fn penalize(core: &Core, host: HostKey, hold: Duration) -> Result<(), Error> {
    let cap = core.settings.policies.pacing_for(&host).max_penalty();
    hold_back(core, host, hold.min(cap), Kind::Hold).await
}

/// Charges `bytes` of a response from `host` to its byte debt in Redis, on
/// every replica (see `Pacing::max_bytes_per_sec`).
pub(super) async fn charge(core: &Core, host: HostKey, bytes: u64) -> Result<(), Error> {
    let cost = core.settings.policies.pacing_for(&host).bytes_cost(bytes);
    hold_back(core, host, cost, Kind::Charge).await
}

/// Caps `host`'s requests in flight at `cap` for `window`, on every
/// replica (lease mode; serialized mode sends one at a time anyway).
pub(super) async fn cap(
    core: &Core,
    host: HostKey,
    cap: u32,
    window: Duration,
) -> Result<(), Error> {
    let settings = &core.settings;
    if settings.args[settings.policies.index(&host)].mode == Mode::Serialized {
        return Ok(());
    }
    hold_back(core, host, window, Kind::Cap(cap)).await
}

/// One run of penalize.lua, as `kind` says, for `hold`.
async fn hold_back(core: &Core, host: HostKey, hold: Duration, kind: Kind) -> Result<(), Error> {
    let settings = &core.settings;
    let hold_us = hold.as_micros().min(u128::from(crate::MAX_MICROS)) as u64;
    if hold_us == 0 {
        return Ok(());
    }
    if let Some(lookup) = settings.policies.resolving(&host) {
        lookup.await;
    }
    let host = settings.policies.key(&host);
    let keys = RedisKeys::new(&settings.prefix, &settings.scope, &host);
    if core.backend.circuit(keys.gate()).open() {
        return Err(CallError::Skipped.into_error(Op::Penalize));
    }
    match core
        .backend
        .penalize(keys.gate(), hold_us, settings.lease_ttl_us, kind)
        .await
    {
        Ok(()) => {
            tracing::debug!(host = %host, hold_us, ?kind, "host held back");
            Ok(())
        }
        Err(e) => {
            let err = e.into_error(Op::Penalize);
            tracing::warn!(host = %host, error = %crate::error::Causes(&err), "penalize failed");
            core.hooks.on_error(Op::Penalize, &err);
            Err(err)
        }
    }
}

/// `Limiter::back_off_host`: one run of `backoff.lua`.
pub(super) async fn back_off(
    core: &Core,
    host: HostKey,
    step: BackoffStep,
) -> Result<Option<Duration>, Error> {
    let settings = &core.settings;
    let cap = settings.policies.pacing_for(&host).max_penalty();
    let host = settings.policies.key(&host);
    let us = |d: Duration| d.as_micros().min(u128::from(crate::MAX_MICROS)) as u64;
    // A gap of zero could never widen.
    let step = match step {
        BackoffStep::Widen { start, max } => Step::Widen {
            start_us: us(start).max(1),
            max_us: us(max.min(cap)).max(1),
        },
        BackoffStep::Narrow { start } => Step::Narrow {
            start_us: us(start).max(1),
            max_us: us(cap).max(1),
        },
    };
    let keys = RedisKeys::new(&settings.prefix, &settings.scope, &host);
    if core.backend.circuit(keys.gate()).open() {
        return Err(CallError::Skipped.into_error(Op::Penalize));
    }
    match core
        .backend
        .back_off(keys.gate(), step, settings.lease_ttl_us)
        .await
    {
        Ok(gap_us) => {
            tracing::debug!(host = %host, gap_us, "backoff moved");
            Ok((gap_us > 0).then(|| Duration::from_micros(gap_us)))
        }
        Err(e) => {
            let err = e.into_error(Op::Penalize);
            tracing::warn!(host = %host, error = %crate::error::Causes(&err), "backoff failed");
            core.hooks.on_error(Op::Penalize, &err);
            Err(err)
        }
    }
}

/// `Limiter::snapshot` of this process's part: admitted by the in-process
/// cap but still asking Redis (polling, or queued to poll) is waiting, not
/// in flight.
pub(super) fn snapshot(core: &Core, top: usize) -> Snapshot {
    let queues = &core.queues;
    let mut asking: HashMap<HostKey, usize> = HashMap::new();
    let (mut poll_queued, mut polling) = (0, 0);
    for pollers in [&queues.pollers, &queues.heavy] {
        let (_, queued, asking_now) = pollers.visit_busy(|host, queued, polling, _, _| {
            *asking.entry(host.clone()).or_default() += queued + polling;
        });
        poll_queued += queued;
        polling += asking_now;
    }
    let mut tops = TopHosts::new(top);
    let mut offer = |host: &HostKey, queued: usize, admitted: usize, asking: usize| {
        let (queued, in_flight) = (queued + asking, admitted.saturating_sub(asking));
        tops.offer(queued, in_flight, || HostSnapshot {
            host: host.clone(),
            queued,
            in_flight,
            next_send: None,
            held_until: None,
            paced_by: PacedBy::Shared,
        });
    };
    let mut seen = HashSet::new();
    let (active_hosts, queued, admitted) =
        queues.local.visit_busy(|host, queued, admitted, _, _| {
            seen.insert(host.clone());
            offer(
                host,
                queued,
                admitted,
                asking.get(host).copied().unwrap_or(0),
            );
        });
    // Hosts asking Redis with nobody queued in process behind them.
    for (host, asking) in &asking {
        if !seen.contains(host) {
            let admitted = queues.local.in_flight_of(host).max(*asking);
            offer(host, 0, admitted, *asking);
        }
    }
    let asking_total = poll_queued + polling;
    Snapshot {
        hosts: tops.into_hosts(),
        active_hosts,
        queued: queued + asking_total,
        in_flight: admitted.saturating_sub(asking_total),
        policy_version: None,
    }
}

/// `Limiter::close`: refuses acquires from now on, wakes those under way,
/// and waits for the releases on their way to Redis (until `deadline`).
pub(super) async fn close(core: &Core, deadline: Option<Instant>) -> Result<(), Error> {
    let scope = &core.settings.scope;
    if core.lifecycle.close() {
        let (late, handed_back) = core.lateness.totals();
        if late > 0 {
            tracing::info!(%scope, late, handed_back, "closing: admissions that reached this process late over its life (handed_back of them asked for again)");
        }
    }
    // Wakes the acquires queued in this process with `Closed` too.
    let queues = &core.queues;
    for queue in [&queues.local, &queues.pollers, &queues.heavy] {
        queue.close(None).await?;
    }
    let drained = core.lifecycle.drain(deadline).await.map_err(|pending| {
        let err = Error::CloseIncomplete { pending };
        tracing::warn!(%scope, pending, "closed with releases still pending");
        core.hooks.on_error(Op::Close, &err);
        err
    });
    // Leaves the registry, so that the others do not keep this replica's
    // share free as a lapsed one's (best effort, within a second; if the
    // deadline cuts it short, dropping the limiter tries again).
    let leaving = core.registry.leave(&core.backend);
    let bound = after(Instant::now(), LEAVE_WITHIN);
    let bound = deadline.map_or(bound, |d| {
        d.min(bound).max(after(Instant::now(), LEAVE_GRACE))
    });
    let _ = tokio::time::timeout_at(bound, leaving).await;
    drained
}

/// How long `close` waits for Redis to take this replica's registry entry
/// out even when its deadline has passed.
const LEAVE_GRACE: Duration = Duration::from_millis(50);

/// How long `close` waits for Redis to take this replica's registry entry
/// out, at most.
const LEAVE_WITHIN: Duration = Duration::from_secs(1);

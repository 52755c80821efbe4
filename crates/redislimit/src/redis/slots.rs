//! A request's slot in Redis, from the call that may book it to its
//! release: the permit that holds it (and books its renewal), the release
//! sent off the caller's path and retried until it lands, the hand-back of
//! an admission never sent, and the guards that take back a booking or a
//! place in the waiting line when an acquire ends without one.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::time::Instant;

use super::backend::CallError;
use super::core::Core;
use super::gathered::Queued;
use super::keys::RedisKeys;
use super::lifecycle::Pending;
use super::renew::{Due, Lease, Renewal};
use super::settings::{Args, Mode};
use crate::permit::Holder;
use crate::{Error, HostKey, Op, Permit};

/// A random lease token; unique per acquire, so a late release of an
/// expired lease can never free a newer one.
pub(super) fn new_token() -> Arc<str> {
    // 128 random bits in hex, written in place (one allocation: this runs
    // for every acquire).
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = fastrand::u128(..);
    let hex: [u8; 32] = std::array::from_fn(|i| HEX[((bits >> (124 - 4 * i)) & 0xf) as usize]);
    Arc::from(std::str::from_utf8(&hex).expect("hex digits are ASCII"))
}

/// A request as Redis knows it: its host's keys, its token, and what the
/// scripts are told of it.
#[derive(Debug, Clone)]
pub(super) struct Ticket {
    pub(super) keys: Arc<RedisKeys>,
    pub(super) token: Arc<str>,
    pub(super) args: Args,
}

/// A slot a permit holds in Redis: its renewal, booked when it was taken
/// and started once due, runs until it is given back.
struct Slot {
    core: Arc<Core>,
    ticket: Ticket,
    renewal: Mutex<Renewal>,
    runtime: Handle,
    /// This process's own slot, freed as the Redis one is given back.
    local: Mutex<Option<Permit>>,
}

/// The permit of `ticket`'s admission for `host`, holding `local` (its
/// place in this process's cap) until it is released.
pub(super) fn permit(
    core: &Arc<Core>,
    host: HostKey,
    waited: Duration,
    ticket: Ticket,
    local: Permit,
    runtime: Handle,
) -> Permit {
    // Redis took the lease a moment ago (the renewal's retries cover the
    // round trip).
    let since = Instant::now();
    let slot = Arc::new(Slot {
        core: Arc::clone(core),
        ticket,
        renewal: Mutex::new(Renewal::Stopped),
        runtime,
        local: Mutex::new(Some(local)),
    });
    {
        // Booked under the slot's lock, as `give_back` and `start_renewal`
        // look at it: a booking that falls due at once waits for it to be
        // recorded.
        let mut renewal = slot.renewal();
        let due: std::sync::Weak<dyn Due> = Arc::downgrade(&slot) as _;
        *renewal = core.renewals.book(due, since);
    }
    Permit::held(host, waited, slot)
}

impl Slot {
    fn renewal(&self) -> MutexGuard<'_, Renewal> {
        self.renewal.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Holder for Slot {
    /// Stops the renewal, frees the local slot and sends the release (as
    /// `abandoned` when the request was never sent) off the caller's path.
    fn give_back(&self, abandoned: bool) {
        match std::mem::replace(&mut *self.renewal(), Renewal::Stopped) {
            Renewal::Due { key } => self.core.renewals.cancel(key),
            Renewal::Running(task) => task.abort(),
            Renewal::Stopped => {}
        }
        // Counted before the local slot frees, so an acquire it lets in
        // knows a release is on its way.
        let pending = Pending::new(&self.core.lifecycle);
        drop(
            self.local
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        send_release(&self.core, pending, &self.runtime, &self.ticket, abandoned);
    }
}

impl Due for Slot {
    fn start_renewal(&self) {
        let mut renewal = self.renewal();
        if let Renewal::Due { key: (first, _) } = *renewal {
            let settings = &self.core.settings;
            let lease = Lease {
                backend: Arc::clone(&self.core.backend),
                hooks: Arc::clone(&self.core.hooks),
                lease_ttl: settings.lease_ttl,
                lease_ttl_us: settings.lease_ttl_us,
                keys: Arc::clone(&self.ticket.keys),
                token: Arc::clone(&self.ticket.token),
                args: self.ticket.args,
            };
            let task = self.runtime.spawn(lease.renew_until_released(first));
            *renewal = Renewal::Running(task.abort_handle());
        }
    }
}

/// Sends the release of `ticket` (as `abandoned` when its request was never
/// sent), counted as `pending` until it lands: a completion in lease mode
/// through one Redis with the others that queued meanwhile (see
/// `gathered.rs`), any other on a task of `runtime` of its own.
///
/// Only a permit of a multi-thread runtime gathers: its workers run the
/// sending task until the runtime shuts down. A current-thread runtime runs
/// tasks only while something blocks on it, and a sending task left there
/// would hold every other runtime's releases queued behind it.
fn send_release(
    core: &Arc<Core>,
    pending: Pending,
    runtime: &Handle,
    ticket: &Ticket,
    abandoned: bool,
) {
    let gathers = !abandoned
        && matches!(ticket.args.mode, Mode::Lease(_))
        && runtime.runtime_flavor() == RuntimeFlavor::MultiThread
        && !core.backend.pool().is_cluster();
    if !gathers {
        send_alone(core, pending, runtime, ticket.clone(), abandoned);
        return;
    }
    let queued = Queued {
        keys: Arc::clone(&ticket.keys),
        token: Arc::clone(&ticket.token),
        args: ticket.args,
        pending,
        runtime: runtime.clone(),
    };
    if core.gathered.push(queued) {
        let core = Arc::clone(core);
        runtime.spawn(async move { send_gathered(core).await });
    }
}

/// The release of `ticket` on a task of `runtime` of its own.
fn send_alone(
    core: &Arc<Core>,
    pending: Pending,
    runtime: &Handle,
    ticket: Ticket,
    abandoned: bool,
) {
    let core = Arc::clone(core);
    runtime.spawn(async move {
        release(&core, &ticket, abandoned).await;
        pending.done();
    });
}

/// A completion gathered but not carried by a pipeline, released on its
/// own (and retried as every release is).
fn send_queued_alone(core: &Arc<Core>, queued: Queued) {
    let ticket = Ticket {
        keys: queued.keys,
        token: queued.token,
        args: queued.args,
    };
    send_alone(core, queued.pending, &queued.runtime, ticket, false);
}

/// The task that sends the gathered completions, one pipeline after
/// another, until none is left.
async fn send_gathered(core: Arc<Core>) {
    let mut sending = Sending {
        core: &core,
        batch: Vec::new(),
        finished: false,
    };
    loop {
        sending.batch = core.gathered.take();
        if sending.batch.is_empty() {
            if core.gathered.stop() {
                sending.finished = true;
                return;
            }
            continue;
        }
        let leases: Vec<(&RedisKeys, &str, u32)> = sending
            .batch
            .iter()
            .map(|q| (&*q.keys, &*q.token, q.args.weight))
            .collect();
        let landed = core.backend.complete_leases(&leases).await;
        drop(leases);
        let batch = std::mem::take(&mut sending.batch);
        match landed {
            Ok(landed) => {
                for (queued, landed) in batch.into_iter().zip(landed) {
                    if landed {
                        queued.pending.done();
                    } else {
                        send_queued_alone(&core, queued);
                    }
                }
            }
            // Each is retried on its own, and reports its failure.
            Err(_) => {
                for queued in batch {
                    send_queued_alone(&core, queued);
                }
            }
        }
    }
}

/// The sending task's releases in hand: when it is dropped unfinished (its
/// runtime shut down), they, and those still queued, are released on their
/// own permits' runtimes.
struct Sending<'a> {
    core: &'a Arc<Core>,
    batch: Vec<Queued>,
    finished: bool,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let queued = std::mem::take(&mut self.batch);
        for queued in queued.into_iter().chain(self.core.gathered.abandon()) {
            send_queued_alone(self.core, queued);
        }
    }
}

/// Returns `ticket`'s slot; `abandoned` when the caller never saw the
/// admission.
///
/// Retried with backoff while Redis is unavailable, for as long as the
/// slot could still matter (`lease_ttl`): a release that never lands would
/// hold the host for that long. The first failure is reported.
async fn release(core: &Core, ticket: &Ticket, abandoned: bool) {
    let start = Instant::now();
    let mut backoff = Duration::from_millis(50);
    let gate = ticket.keys.gate();
    loop {
        let Err(e) = call_release(core, ticket, abandoned).await else {
            return;
        };
        let err = e.into_error(Op::Release);
        if backoff == Duration::from_millis(50) {
            tracing::warn!(%gate, error = %crate::error::Causes(&err), "release failed; retrying");
            core.hooks.on_error(Op::Release, &err);
        }
        if start.elapsed() + backoff > core.settings.lease_ttl {
            tracing::warn!(%gate, "release abandoned; the lease will lapse");
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One release call (see `scripts/release.rs`): whether the token still held its slot.
async fn call_release(core: &Core, ticket: &Ticket, abandoned: bool) -> Result<bool, CallError> {
    core.backend
        .release(
            &ticket.keys,
            &ticket.token,
            abandoned,
            &ticket.args,
            core.settings.lease_ttl_us,
        )
        .await
}

/// Hands back `ticket`'s admission, which reached its caller too late (see
/// `lateness.rs`): abandoned as a request never sent, on a task of its own,
/// so that it lands even when the caller goes away meanwhile; the caller
/// asks again under the same token once it has. Its first attempt decides
/// what the caller does: asks again, or fails (the call failed, or the
/// lease lapsed first and the token is void); a failed attempt is retried
/// off the caller's path, as a dropped permit's release is, and counts
/// among the releases `close` waits for.
pub(super) fn hand_back(
    core: &Arc<Core>,
    ticket: &Ticket,
    runtime: &Handle,
) -> impl Future<Output = Result<(), Error>> + use<> {
    let pending = Pending::new(&core.lifecycle);
    let (answer, answered) = tokio::sync::oneshot::channel();
    let (core, ticket) = (Arc::clone(core), ticket.clone());
    runtime.spawn(async move {
        // Landed (or given up) before the caller hears of it: the caller
        // must not take it for a release still on its way.
        match call_release(&core, &ticket, true).await {
            Ok(true) => {
                pending.done();
                let _ = answer.send(Ok(()));
            }
            // Not held: the lease lapsed before the hand-back, and the token
            // is void from now on.
            Ok(false) => {
                pending.done();
                let _ = answer.send(Err(Error::unavailable(
                    Op::Acquire,
                    "admitted too late to send, and its lease lapsed before it could be handed back",
                )));
            }
            Err(e) => {
                let _ = answer.send(Err(e.into_error(Op::Acquire)));
                release(&core, &ticket, true).await;
                pending.done();
            }
        }
    });
    async move { answered.await.unwrap_or(Err(Error::Closed)) }
}

/// Guards an acquire script in flight: if the acquire is dropped before its
/// answer arrives, the script may still have admitted it, so the token is
/// released (as abandoned) off the caller's path.
pub(super) struct Booking<'a> {
    core: &'a Arc<Core>,
    ticket: &'a Ticket,
    runtime: &'a Handle,
    armed: bool,
    /// The acquire's place in the waiting line (adopt has none), which the
    /// abandon this sends also gives up.
    line: Option<&'a InLine>,
}

impl<'a> Booking<'a> {
    /// An armed guard for a call about to be sent.
    pub(super) fn new(
        core: &'a Arc<Core>,
        ticket: &'a Ticket,
        runtime: &'a Handle,
        line: Option<&'a InLine>,
    ) -> Self {
        Self {
            core,
            ticket,
            runtime,
            armed: true,
            line,
        }
    }

    /// The call ended with `answer`: nothing to take back unless it lost
    /// its connection after being sent (it may still run).
    pub(super) fn settle<T>(mut self, answer: &Result<T, CallError>) {
        self.armed = matches!(answer, Err(err) if err.may_have_run());
    }
}

impl Drop for Booking<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Some(line) = self.line {
                line.disarm();
            }
            let pending = Pending::new(&self.core.lifecycle);
            send_release(self.core, pending, self.runtime, self.ticket, true);
        }
    }
}

/// An acquire's place in the waiting line across replicas (see
/// acquire.lua): armed once Redis told it to wait, disarmed when it is
/// admitted (which takes it out of the line). An acquire that ends
/// otherwise (its deadline, an error, dropped by its caller) sends one
/// abandon off the caller's path, so that the waiters behind it need not
/// wait for its place to lapse (the patience it was given). Not retried:
/// the place lapses anyway.
pub(super) struct InLine {
    core: Arc<Core>,
    ticket: Ticket,
    runtime: Handle,
    armed: AtomicBool,
}

impl InLine {
    pub(super) fn new(core: &Arc<Core>, ticket: &Ticket, runtime: &Handle) -> Self {
        Self {
            core: Arc::clone(core),
            ticket: ticket.clone(),
            runtime: runtime.clone(),
            armed: AtomicBool::new(false),
        }
    }

    /// Told to wait: in line when `joined` (requests of weight 1).
    pub(super) fn arm(&self, joined: bool) {
        if joined {
            self.armed.store(true, Ordering::Relaxed);
        }
    }

    /// Out of line: admitted, or its abandon sent another way.
    pub(super) fn disarm(&self) {
        self.armed.store(false, Ordering::Relaxed);
    }
}

impl Drop for InLine {
    fn drop(&mut self) {
        // A Redis the circuit holds off is not asked; the place lapses.
        if !*self.armed.get_mut() || self.core.backend.circuit(self.ticket.keys.gate()).waiting() {
            return;
        }
        let (core, ticket) = (Arc::clone(&self.core), self.ticket.clone());
        self.runtime.spawn(async move {
            // One abandon (which also voids the token, should a call of its
            // own still be on its way), not retried: the place lapses.
            if let Err(e) = call_release(&core, &ticket, true).await {
                tracing::debug!(gate = %ticket.keys.gate(), error = ?e, "leaving the waiting line failed; the place lapses");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::new_token;

    #[test]
    fn tokens_are_128_bits_of_hex_and_differ() {
        let tokens: Vec<_> = (0..64).map(|_| new_token()).collect();
        for token in &tokens {
            assert_eq!(token.len(), 32, "{token}");
            assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{token}"
            );
        }
        let distinct: std::collections::HashSet<_> = tokens.iter().collect();
        assert_eq!(distinct.len(), tokens.len());
        // Every digit place takes more than one value (no constant nibble).
        for i in 0..32 {
            let values: std::collections::HashSet<_> =
                tokens.iter().map(|t| t.as_bytes()[i]).collect();
            assert!(values.len() > 1, "digit {i} never changes");
        }
    }
}

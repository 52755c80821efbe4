//! Lease renewal: how a held permit keeps its slot in Redis.
//!
//! A permit renews its lease every `lease_ttl / 2`. Its first renewal is
//! only booked in [`Renewals`], which one task per limiter serves: most
//! requests end long before, and then nothing was ever spawned or woken
//! for them. Once due, the renewal runs on a task of its own until the
//! permit is released. A renewal that fails
//! (Redis slow, unreachable, a stalled connection) is retried at once with
//! a short backoff, for as long as the lease may still be alive, so only a
//! stall longer than the time left on the lease can lose the slot. A lost
//! lease (Redis says the token no longer holds its slot) is reported
//! through [`Hooks::on_error`](crate::Hooks::on_error) with
//! [`Op::Renew`] and a `tracing` warning.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::backend::Backend;
use super::keys::RedisKeys;
use super::settings::Args;
use crate::local::sweep::{Sweep, SweepSignal};
use crate::pacing::after;
use crate::{Error, Hooks, Op};

/// The first retry after a failed renewal; each next one waits twice as long.
const FIRST_RETRY: Duration = Duration::from_millis(20);

/// How late after it is due a booked first renewal may start.
const RENEWAL_GRAIN: Duration = Duration::from_millis(1);

/// A held slot whose first renewal was booked: started when it is due.
pub(super) trait Due: Send + Sync {
    /// Starts renewing on a task of its own, unless released meanwhile.
    fn start_renewal(&self);
}

/// Where a permit's renewal stands.
#[derive(Debug)]
pub(super) enum Renewal {
    /// Booked in [`Renewals`] under `key`: when it is due, and a number
    /// telling bookings apart.
    Due { key: (Instant, u64) },
    /// Running on its own task.
    Running(tokio::task::AbortHandle),
    /// The permit was released: nothing renews it.
    Stopped,
}

/// The first renewals of a limiter's permits, by when they are due, and
/// the task that starts them (see [`SweepSignal`]): a permit books its
/// renewal here under a lock, without a task or a wake-up of its own.
pub(super) struct Renewals {
    signal: Arc<SweepSignal>,
    booked: Mutex<BTreeMap<(Instant, u64), Weak<dyn Due>>>,
    next_id: AtomicU64,
    /// How long after a lease is taken its first renewal is due.
    period: Duration,
}

impl Renewals {
    /// First renewals due `period` after each lease is taken.
    pub(super) fn new(period: Duration) -> Self {
        Self {
            signal: Arc::new(SweepSignal::with_grain(RENEWAL_GRAIN)),
            booked: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            period,
        }
    }

    /// Books the first renewal of `slot`, whose lease was taken at
    /// `since`; what the slot keeps as its [`Renewal`].
    pub(super) fn book(self: &Arc<Self>, slot: Weak<dyn Due>, since: Instant) -> Renewal {
        let key = (
            after(since, self.period),
            self.next_id.fetch_add(1, Ordering::Relaxed),
        );
        self.lock().insert(key, slot);
        self.signal.ensure_running(self);
        // Every booking is due a period after it is made, and the task
        // looks at least once a period (see `sweep`): it is not woken for
        // it (one that is sweeping right now reads it when it is done).
        self.signal.schedule(key.0);
        Renewal::Due { key }
    }

    /// Takes back a booking that is not due yet.
    pub(super) fn cancel(&self, key: (Instant, u64)) {
        self.lock().remove(&key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(Instant, u64), Weak<dyn Due>>> {
        self.booked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Renewals {
    fn drop(&mut self) {
        self.signal.stop();
    }
}

impl Sweep for Renewals {
    /// Starts the renewals due by `now`; returns when the next one is due,
    /// or a period from now when none is booked.
    fn sweep(&self, now: Instant) -> Option<Instant> {
        let (due, next) = {
            let mut booked = self.lock();
            let later = booked.split_off(&(now, u64::MAX));
            let due = std::mem::replace(&mut *booked, later);
            (due, booked.keys().next().map(|(at, _)| *at))
        };
        for slot in due.into_values().filter_map(|slot| slot.upgrade()) {
            slot.start_renewal();
        }
        Some(next.unwrap_or_else(|| after(now, self.period)))
    }

    /// The task's runtime shut down: each permit still booked renews on a
    /// task of its own runtime from now on (one that is gone too takes
    /// its permit with it), as it would have before it was booked.
    fn orphaned(&self) {
        let booked = std::mem::take(&mut *self.lock());
        for slot in booked.into_values().filter_map(|slot| slot.upgrade()) {
            slot.start_renewal();
        }
    }
}

/// What a renewal task renews, and through what.
pub(super) struct Lease {
    pub(super) backend: Arc<Backend>,
    pub(super) hooks: Arc<dyn Hooks>,
    pub(super) lease_ttl: Duration,
    pub(super) lease_ttl_us: u64,
    pub(super) keys: Arc<RedisKeys>,
    pub(super) token: Arc<str>,
    pub(super) args: Args,
}

impl Lease {
    /// Renews the lease whose first renewal is due at `first` (half a
    /// lease after it was taken) while the permit is held (this task is
    /// aborted when it is released).
    pub(super) async fn renew_until_released(self, first: Instant) {
        let Self {
            hooks,
            lease_ttl,
            keys,
            ..
        } = &self;
        let lease_ttl = *lease_ttl;
        let period = lease_ttl / 2;
        // A renewal's effect starts no earlier than when it was asked for,
        // so `asked + lease_ttl` is a lower bound of the lease deadline.
        let mut alive_until = after(first, lease_ttl - period);
        let mut next = first;
        let mut retry = FIRST_RETRY;
        let mut failing = false;
        let mut past_deadline = false;
        loop {
            tokio::time::sleep_until(next).await;
            let asked = Instant::now();
            // Bounded, so a call that hangs (a pool without timeouts) cannot
            // keep the next attempt from being made in time.
            let bound = after(asked, period.max(FIRST_RETRY));
            let renewed = match tokio::time::timeout_at(bound, self.renew()).await {
                Ok(renewed) => renewed,
                Err(_) => Err(Error::unavailable(
                    Op::Renew,
                    "Redis did not answer the renewal in time",
                )),
            };
            match renewed {
                Ok(true) => {
                    if failing {
                        tracing::info!(gate = %keys.gate(), "lease renewed after failed attempts");
                    }
                    failing = false;
                    past_deadline = false;
                    alive_until = after(asked, lease_ttl);
                    next = after(asked, period);
                    retry = FIRST_RETRY;
                }
                Ok(false) => {
                    let err = Error::unavailable(
                        Op::Renew,
                        "the lease had lapsed before it was renewed; its slot may be taken",
                    );
                    tracing::warn!(gate = %keys.gate(), "lease lost");
                    hooks.on_lease_lost(keys.gate());
                    hooks.on_error(Op::Renew, &err);
                    return;
                }
                Err(err) => {
                    let now = Instant::now();
                    if !failing {
                        tracing::warn!(gate = %keys.gate(), error = %crate::error::Causes(&err), "lease renewal failed; retrying");
                        hooks.on_error(Op::Renew, &err);
                    }
                    failing = true;
                    if now >= alive_until && !past_deadline {
                        past_deadline = true;
                        tracing::warn!(gate = %keys.gate(), "lease renewal failed until the lease deadline; its slot may be taken");
                    }
                    // Retry soon, and keep retrying: while the lease may be
                    // alive every attempt can save it, and after that the
                    // answer says whether it survived.
                    next = after(now, retry);
                    retry = (retry * 2).min((lease_ttl / 8).max(FIRST_RETRY));
                }
            }
        }
    }

    /// One renewal: whether the token still held its slot.
    async fn renew(&self) -> Result<bool, Error> {
        self.backend
            .renew(&self.keys, &self.token, &self.args, self.lease_ttl_us)
            .await
            .map_err(|e| e.into_error(Op::Renew))
    }
}

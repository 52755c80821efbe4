//! Hooks: how a limiter tells the caller's metrics what it decided.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, HostKey, Op};

/// How an acquire ended, as reported to [`Hooks::on_wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitOutcome {
    /// A permit was granted.
    Acquired,
    /// The acquire future was dropped while it waited.
    Canceled,
    /// The wait was longer than the caller's deadline allowed
    /// ([`Error::WaitBudget`]).
    BudgetExceeded,
    /// The host's queue was full ([`Error::QueueFull`]).
    QueueFull,
}

impl WaitOutcome {
    /// The outcome's name as used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Canceled => "canceled",
            Self::BudgetExceeded => "budget_exceeded",
            Self::QueueFull => "queue_full",
        }
    }
}

impl fmt::Display for WaitOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Callbacks a limiter makes on its decisions; wire them to metrics.
///
/// Every method defaults to doing nothing (or to the less detailed one),
/// so an implementation overrides only what it records. They are called on the acquiring task, so they
/// must be quick and must not block.
///
/// [`on_wait`](Self::on_wait) fires exactly once per acquire that reached a
/// pacing decision. An acquire that fails with [`Error::Unavailable`] made
/// no decision and fires no `on_wait`: a fallback limiter that re-runs it
/// reports the wait itself, so nothing is counted twice.
///
/// Limiters also emit `tracing` events (target `redislimit`) for the same
/// moments, so hooks are only needed for metrics.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::time::Duration;
/// use redislimit::{Hooks, WaitOutcome};
///
/// #[derive(Debug, Default)]
/// struct Waited(AtomicU64);
///
/// impl Hooks for Waited {
///     fn on_wait(&self, _engine: &str, outcome: WaitOutcome, waited: Duration) {
///         if outcome == WaitOutcome::Acquired {
///             self.0.fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait Hooks: Send + Sync + fmt::Debug {
    /// An acquire for `engine` ended with `outcome` after `waited`.
    fn on_wait(&self, engine: &str, outcome: WaitOutcome, waited: Duration) {
        let _ = (engine, outcome, waited);
    }

    /// [`on_wait`](Self::on_wait), naming the host's key too; what the
    /// limiters call. The default calls `on_wait`.
    fn on_host_wait(&self, engine: &str, host: &HostKey, outcome: WaitOutcome, waited: Duration) {
        let _ = host;
        self.on_wait(engine, outcome, waited);
    }

    /// A host was held back for `hold` because of `cause` (what a pacing
    /// middleware applied: `retry-after`, `budget-spent`, `budget-low`,
    /// `default-penalty`, `backoff`, `recovering`; see
    /// `http::ServerSignal::cause`, feature `http`), reported by the pacing middleware through the limiter.
    fn on_hold(&self, host: &HostKey, cause: &str, hold: Duration) {
        let _ = (host, cause, hold);
    }

    /// A fallback limiter started (`true`) or stopped (`false`) pacing in
    /// process because its shared limiter is unavailable.
    fn on_fallback(&self, active: bool) {
        let _ = active;
    }

    /// A limiter following the policies published to its scope
    /// (`LiveLimiter`) paces with `version` of them from now on.
    fn on_policy_version(&self, version: u64) {
        let _ = version;
    }

    /// A lease in Redis lapsed before its renewal: the slot at `key` may
    /// have been taken by another request (also reported to `on_error`).
    fn on_lease_lost(&self, key: &str) {
        let _ = key;
    }

    /// An admission for the host whose shared state is at `key` reached
    /// its caller `late` (beyond the quickest acquire call's round trip of
    /// the last 10-20 s), more than the limiter's `max_lateness`. It was
    /// sent when the room its acquire asked Redis to keep after its slot
    /// for this process's lateness covered it (the next send was kept a
    /// gap after that room), else (`handed_back`) handed back unsent and
    /// asked for again with more room.
    fn on_late_admission(&self, key: &str, late: Duration, handed_back: bool) {
        let _ = (key, late, handed_back);
    }

    /// A host's shared state at `key` was of the wrong type or unparseable
    /// (written by something other than this library) and was replaced by
    /// fresh state: the host is held for `lease_ttl`, so that whatever the
    /// garbage stood for has lapsed, and then paced afresh.
    fn on_repair(&self, key: &str) {
        let _ = key;
    }

    /// `op` failed with `error`. For a release, a renewal or a penalty this
    /// is the only place the failure is reported: those run off the
    /// caller's path.
    fn on_error(&self, op: Op, error: &Error) {
        let _ = (op, error);
    }
}

/// Hooks that record nothing; the default of every limiter.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {}

/// Reports one acquire's outcome to the hooks and to `tracing` exactly once:
/// as acquired or over budget when told, as canceled when dropped untold,
/// and not at all when [`abandon`](Self::abandon)ed (a backend failure,
/// which made no decision).
pub(crate) struct WaitReport<'a> {
    hooks: &'a dyn Hooks,
    engine: &'a str,
    host: &'a HostKey,
    start: Instant,
    done: bool,
}

impl<'a> WaitReport<'a> {
    pub(crate) fn new(
        hooks: &'a dyn Hooks,
        engine: &'a str,
        host: &'a HostKey,
        start: Instant,
    ) -> Self {
        Self {
            hooks,
            engine,
            host,
            start,
            done: false,
        }
    }

    /// Reports `outcome`; returns how long the acquire waited.
    pub(crate) fn finish(mut self, outcome: WaitOutcome) -> Duration {
        let waited = self.start.elapsed();
        self.emit(outcome, waited);
        waited
    }

    /// Reports `outcome` after a wait already known (saves a clock read on
    /// the fast path).
    pub(crate) fn finish_waited(mut self, outcome: WaitOutcome, waited: Duration) {
        self.emit(outcome, waited);
    }

    /// Reports a blown budget and builds its error: the wait would have
    /// lasted until `earliest`, and the budget ends at `deadline`.
    pub(crate) fn over_budget(self, earliest: Instant, deadline: Instant, now: Instant) -> Error {
        let host = self.host.to_string();
        self.finish(WaitOutcome::BudgetExceeded);
        Error::WaitBudget {
            host,
            wait: earliest.saturating_duration_since(now),
            remaining: deadline.saturating_duration_since(now),
        }
    }

    /// Reports nothing: the acquire ended without a pacing decision.
    pub(crate) fn abandon(mut self) {
        self.done = true;
    }

    /// An inner limiter failed with `err`: a blown budget or a full queue
    /// is this acquire's decision too, anything else made none. Hands
    /// `err` back.
    pub(crate) fn fail(&mut self, err: Error) -> Error {
        let waited = self.start.elapsed();
        match err {
            Error::WaitBudget { .. } => self.emit(WaitOutcome::BudgetExceeded, waited),
            Error::QueueFull { .. } => self.emit(WaitOutcome::QueueFull, waited),
            _ => self.done = true,
        }
        err
    }

    /// The host's queue holds `queued`, the most `max` allows: the acquire
    /// is refused at once.
    pub(crate) fn queue_full(self, queued: usize, max: u32) -> Error {
        let host = self.host.to_string();
        self.finish(WaitOutcome::QueueFull);
        Error::QueueFull { host, queued, max }
    }

    fn emit(&mut self, outcome: WaitOutcome, waited: Duration) {
        self.done = true;
        self.hooks
            .on_host_wait(self.engine, self.host, outcome, waited);
        tracing::debug!(
            engine = self.engine,
            host = %self.host,
            outcome = outcome.as_str(),
            waited_us = waited.as_micros() as u64,
            "acquire"
        );
    }
}

impl Drop for WaitReport<'_> {
    fn drop(&mut self) {
        if !self.done {
            let waited = self.start.elapsed();
            self.emit(WaitOutcome::Canceled, waited);
        }
    }
}

//! Whether a `RedisLimiter` is closed, and what `close` waits for: the
//! acquires winding down ([`Busy`]) and the releases on their way to Redis
//! ([`Pending`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

/// A limiter's open or closed state, and its work still under way.
#[derive(Debug, Default)]
pub(super) struct Lifecycle {
    /// Set by `close`; `closing` wakes the acquires under way.
    closed: AtomicBool,
    closing: Notify,
    /// Acquires under way (see [`Busy`]).
    acquiring: AtomicUsize,
    /// Releases spawned and not yet answered, and a wake-up when one is.
    releases: AtomicUsize,
    released: Notify,
    /// Set when a release was dropped unfinished (said once).
    lost_release: AtomicBool,
}

impl Lifecycle {
    /// Whether `close` was called.
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Closes, waking the acquires under way; whether it was open.
    pub(super) fn close(&self) -> bool {
        let was_open = !self.closed.swap(true, Ordering::SeqCst);
        self.closing.notify_waiters();
        was_open
    }

    /// What an acquire under way listens to for `close`.
    pub(super) fn closing(&self) -> &Notify {
        &self.closing
    }

    /// Whether a release is on its way to Redis.
    pub(super) fn releasing(&self) -> bool {
        self.releases.load(Ordering::Acquire) > 0
    }

    /// What wakes when a release lands (or an acquire winds down).
    pub(super) fn released(&self) -> &Notify {
        &self.released
    }

    /// Releases on their way to Redis, and acquires still winding down
    /// (which may leave one behind).
    pub(super) fn pending(&self) -> usize {
        self.releases.load(Ordering::Acquire) + self.acquiring.load(Ordering::Acquire)
    }

    /// Waits until nothing is pending, or `deadline` passes: `Err` with how
    /// much was still pending then.
    pub(super) async fn drain(&self, deadline: Option<Instant>) -> Result<(), usize> {
        loop {
            let landed = self.released.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            if self.pending() == 0 {
                return Ok(());
            }
            let Some(deadline) = deadline else {
                landed.await;
                continue;
            };
            if tokio::time::timeout_at(deadline, landed).await.is_err() {
                return match self.pending() {
                    0 => Ok(()),
                    pending => Err(pending),
                };
            }
        }
    }
}

/// An acquire under way, counted so that `close` waits for it to wind down
/// (a cancelled one may still send a release).
#[derive(Debug)]
pub(super) struct Busy<'a>(&'a Lifecycle);

impl<'a> Busy<'a> {
    pub(super) fn new(lifecycle: &'a Lifecycle) -> Self {
        lifecycle.acquiring.fetch_add(1, Ordering::AcqRel);
        Self(lifecycle)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.acquiring.fetch_sub(1, Ordering::AcqRel);
        self.0.released.notify_waiters();
    }
}

/// A release counted as on its way to Redis (which acquires listen for and
/// `close` waits for) until it has landed or given up ([`done`](Self::done)).
#[derive(Debug)]
pub(super) struct Pending {
    lifecycle: Arc<Lifecycle>,
    done: bool,
}

impl Pending {
    pub(super) fn new(lifecycle: &Arc<Lifecycle>) -> Self {
        lifecycle.releases.fetch_add(1, Ordering::AcqRel);
        Self {
            lifecycle: Arc::clone(lifecycle),
            done: false,
        }
    }

    /// The release landed, or was given up after its retries.
    pub(super) fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Pending {
    /// Also when the task is dropped unfinished, by a runtime shutting down:
    /// then the release never reached Redis, and the host stays booked for
    /// the rest of its lease on every replica. Said once per limiter, naming
    /// what prevents it.
    fn drop(&mut self) {
        let lifecycle = &self.lifecycle;
        lifecycle.releases.fetch_sub(1, Ordering::AcqRel);
        lifecycle.released.notify_waiters();
        if !self.done && !lifecycle.lost_release.swap(true, Ordering::AcqRel) {
            if lifecycle.is_closed() {
                tracing::warn!(
                    "a release was dropped before it reached Redis, after `close` returned at its deadline: \
                     its host stays booked until the lease expires, on every replica. \
                     Give `limiter.close(deadline).await` a later deadline"
                );
            } else {
                tracing::warn!(
                    "a release was dropped before it reached Redis (the runtime shut down with it under way?): \
                     its host stays booked until the lease expires, on every replica. \
                     Call `limiter.close(deadline).await` before the runtime ends"
                );
            }
        }
    }
}

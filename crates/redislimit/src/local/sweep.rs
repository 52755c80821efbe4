//! Eviction of idle host state: one background task per limiter that sleeps
//! until the earliest host can be forgotten, stopped by a drop guard. The
//! Redis limiter's lease renewals are started by the same kind of task.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Host sweeps happen on multiples of this since the limiter was made, so
/// a stream of releases wakes the sweeper at most once per grain rather
/// than once per release (a release schedules its host no earlier than
/// itself); an idle host is forgotten at most this much late.
pub(crate) const GRAIN: Duration = Duration::from_millis(25);

/// What a limiter and its sweeper task share besides what is swept (the
/// host map, or the Redis limiter's booked renewals).
#[derive(Debug)]
pub(crate) struct SweepSignal {
    /// The instant times are measured from (microseconds since it).
    epoch: Instant,
    /// What the times it keeps are rounded up to, in microseconds.
    grain: u64,
    /// When the sweeper will next look, in microseconds since `epoch`;
    /// `u64::MAX` while it has nothing scheduled. A sweep starts it at
    /// `u64::MAX`; what is scheduled during the sweep lowers it.
    next: AtomicU64,
    /// Wakes the sweeper for an earlier expiry, or to stop.
    wake: Notify,
    /// True while the sweeper sweeps: what is scheduled meanwhile it reads
    /// from `next` when done, so it is not woken for it (a stream of
    /// releases would otherwise wake it again after every sweep).
    sweeping: AtomicBool,
    /// Set by the limiter's drop guard.
    stopped: AtomicBool,
    /// True while a sweeper task is alive on some runtime.
    running: AtomicBool,
}

impl SweepSignal {
    /// Sweeps on multiples of [`GRAIN`].
    pub(crate) fn new() -> Self {
        Self::with_grain(GRAIN)
    }

    /// Sweeps on multiples of `grain` (at least a microsecond).
    pub(crate) fn with_grain(grain: Duration) -> Self {
        Self {
            grain: u64::try_from(grain.as_micros()).unwrap_or(u64::MAX).max(1),
            epoch: Instant::now(),
            next: AtomicU64::new(u64::MAX),
            wake: Notify::new(),
            sweeping: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            running: AtomicBool::new(false),
        }
    }

    /// `at` in microseconds since the epoch, rounded up to the grain: the
    /// sweep that will look at what is due at `at`.
    pub(crate) fn micros(&self, at: Instant) -> u64 {
        // From nanoseconds, so that the tick is never before `at` itself
        // (a sweep at the tick then finds the host idle).
        let grain = u128::from(self.grain) * 1000;
        let ticks = at
            .saturating_duration_since(self.epoch)
            .as_nanos()
            .div_ceil(grain);
        u64::try_from(ticks * u128::from(self.grain))
            .unwrap_or(u64::MAX - 1)
            .min(u64::MAX - 1)
    }

    /// `now` in microseconds since the epoch, rounded down: what a sweep at
    /// `now` may do is what [`micros`](Self::micros) put at or before it.
    pub(crate) fn micros_at(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    /// The instant `micros` microseconds after the epoch.
    pub(crate) fn instant(&self, micros: u64) -> Instant {
        self.epoch + Duration::from_micros(micros)
    }

    /// Something is due at `at` (a host becomes evictable, a renewal is
    /// due): make sure the sweeper looks by then.
    pub(crate) fn schedule(&self, at: Instant) {
        let at = self.micros(at);
        // Already due by then: nothing to write. A load, not the
        // read-modify-write below, so that a crawl marking hosts idle one
        // after another does not take the line from the sweeper's core each
        // time; at its place in the sequentially consistent order it reads
        // what the read-modify-write would.
        if self.next.load(Ordering::SeqCst) <= at {
            return;
        }
        // Sequentially consistent with the sweeper's end of a sweep: either
        // it reads this `at` from `next`, or this reads that it has
        // stopped sweeping and wakes it.
        if at < self.next.fetch_min(at, Ordering::SeqCst) && !self.sweeping.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// Stops the sweeper; called when the limiter's last handle goes away.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Starts the sweeper task if none is alive (the first use, or after the
    /// runtime that ran the previous one shut down). Must run inside a Tokio
    /// runtime; acquire, penalize and a renewal's booking do. When that
    /// runtime shuts down with the target still alive, the target hears of
    /// it ([`Sweep::orphaned`]).
    pub(crate) fn ensure_running<T: Sweep>(self: &Arc<Self>, target: &Arc<T>) {
        if self.running.load(Ordering::Acquire) {
            return;
        }
        let target = Arc::downgrade(target);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let signal = Arc::clone(self);
        runtime.spawn(async move {
            let _running = RunningGuard(Arc::clone(&signal), target.clone());
            signal.run(target).await;
        });
    }

    async fn run<T: Sweep>(&self, target: Weak<T>) {
        loop {
            if self.stopped.load(Ordering::Acquire) {
                return;
            }
            // Anything scheduled while we sweep lowers `next` below MAX,
            // read below, so nothing is missed; and it wakes nobody.
            self.sweeping.store(true, Ordering::SeqCst);
            self.next.store(u64::MAX, Ordering::SeqCst);
            let Some(limiter) = target.upgrade() else {
                self.sweeping.store(false, Ordering::SeqCst);
                return;
            };
            let now = Instant::now();
            let earliest = limiter.sweep(now);
            drop(limiter);
            if let Some(at) = earliest {
                self.next.fetch_min(self.micros(at), Ordering::SeqCst);
            }
            self.sweeping.store(false, Ordering::SeqCst);
            let next = self.next.load(Ordering::SeqCst);
            if next == u64::MAX {
                self.wake.notified().await;
            } else {
                let at = self.instant(next);
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = self.wake.notified() => {}
                }
            }
        }
    }
}

/// Clears `running` when the task ends, or is dropped with its runtime.
struct RunningGuard<T: Sweep>(Arc<SweepSignal>, Weak<T>);

impl<T: Sweep> Drop for RunningGuard<T> {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
        // Dropped with its runtime, not stopped: what is still due must
        // not wait for the next use to start a sweeper again.
        if !self.0.stopped.load(Ordering::Acquire)
            && let Some(target) = self.1.upgrade()
        {
            target.orphaned();
        }
    }
}

/// The state a sweeper serves.
pub(crate) trait Sweep: Send + Sync + 'static {
    /// Does what is due at `now` (forgets the hosts idle by then, starts
    /// the renewals due); returns when the next thing is due.
    fn sweep(&self, now: Instant) -> Option<Instant>;

    /// The sweeper's runtime shut down while this was alive. By default
    /// nothing: the next use starts a sweeper again.
    fn orphaned(&self) {}
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts its sweeps; each one also schedules something a grain on, as
    /// a release on another thread would while a sweep runs.
    struct Busy {
        signal: Arc<SweepSignal>,
        sweeps: AtomicUsize,
    }

    impl Sweep for Busy {
        fn sweep(&self, now: Instant) -> Option<Instant> {
            // Far more than a test's grains: a sweeper woken after every
            // sweep stops here, and the test fails instead of hanging.
            if self.sweeps.fetch_add(1, Ordering::SeqCst) > 1000 {
                return None;
            }
            let next = now + GRAIN;
            self.signal.schedule(next);
            Some(next)
        }
    }

    /// A signal with its sweeper started on a [`Busy`] target.
    fn started() -> (Arc<SweepSignal>, Arc<Busy>) {
        let signal = Arc::new(SweepSignal::new());
        let target = Arc::new(Busy {
            signal: Arc::clone(&signal),
            sweeps: AtomicUsize::new(0),
        });
        signal.ensure_running(&target);
        (signal, target)
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_scheduled_during_a_sweep_waits_for_the_next_grain() {
        let (signal, target) = started();
        tokio::time::sleep(GRAIN * 10).await;
        // One sweep when it starts, then one per grain: not one after
        // every sweep (which, in paused time, would never end).
        let sweeps = target.sweeps.load(Ordering::SeqCst);
        assert!((10..=12).contains(&sweeps), "{sweeps} sweeps in 10 grains");
        signal.stop();
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_scheduled_sooner_than_the_next_sweep_wakes_the_sweeper() {
        let (signal, target) = started();
        tokio::task::yield_now().await;
        assert_eq!(target.sweeps.load(Ordering::SeqCst), 1);
        // Something due now, sooner than the grain the sweeper sleeps for.
        signal.schedule(Instant::now());
        tokio::task::yield_now().await;
        assert_eq!(target.sweeps.load(Ordering::SeqCst), 2);
        signal.stop();
    }
}

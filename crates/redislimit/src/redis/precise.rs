//! A wait that ends within a fraction of a millisecond, for a send booked a
//! moment ahead in Redis.
//!
//! Tokio's timer fires at the first millisecond tick after the deadline: up
//! to a millisecond late, which at 100-200 requests a second per host is
//! 10-20 % of the slot. A booked slot is the host's one chance to send on
//! time, so the last stretch of the wait is timed by one thread per process
//! that sleeps on a condition variable (the kernel's timer, tens of
//! microseconds late) and wakes the waiting task.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How much of a wait is left to the timer thread: Tokio sleeps the rest.
const FINE: Duration = Duration::from_millis(3);

/// Waits `wait`, ending it within a fraction of a millisecond. Dropping the
/// future cancels it (the thread then finds nobody to wake).
pub(crate) async fn sleep(wait: Duration) {
    let until = Instant::now() + wait;
    if let Some(coarse) = wait.checked_sub(FINE) {
        tokio::time::sleep(coarse).await;
    }
    if Instant::now() >= until {
        return;
    }
    let timer = *TIMER;
    if !timer.started.load(Ordering::Acquire) {
        // No timer thread: Tokio's timer, a tick late at most.
        tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
        return;
    }
    let (tx, rx) = oneshot::channel();
    timer.add(until, tx);
    // The thread never drops an alarm before it is due; should it, the
    // wait still ends, by Tokio's timer.
    if rx.await.is_err() {
        tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
    }
}

/// One wake-up: its instant, an order among equal ones, and whom to wake.
struct Alarm {
    at: Instant,
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Alarm {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Alarm {}

impl PartialOrd for Alarm {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Alarm {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Default)]
struct Alarms {
    heap: BinaryHeap<Reverse<Alarm>>,
    seq: u64,
}

/// The timer thread's queue.
struct Timer {
    alarms: Mutex<Alarms>,
    changed: Condvar,
    /// Whether its thread runs.
    started: AtomicBool,
}

static TIMER: LazyLock<&'static Timer> = LazyLock::new(|| {
    let timer: &'static Timer = Box::leak(Box::new(Timer {
        alarms: Mutex::default(),
        changed: Condvar::new(),
        started: AtomicBool::new(false),
    }));
    let started = std::thread::Builder::new()
        .name("redislimit-timer".into())
        .spawn(move || timer.run());
    match started {
        Ok(_) => timer.started.store(true, Ordering::Release),
        Err(err) => {
            tracing::warn!(error = %err, "no timer thread: waits for a slot are timed by Tokio");
        }
    }
    timer
});

impl Timer {
    fn add(&self, at: Instant, wake: oneshot::Sender<()>) {
        let mut alarms = self.alarms.lock().unwrap_or_else(PoisonError::into_inner);
        alarms.seq = alarms.seq.wrapping_add(1);
        let seq = alarms.seq;
        let earliest = alarms.heap.peek().is_none_or(|Reverse(a)| at < a.at);
        alarms.heap.push(Reverse(Alarm { at, seq, wake }));
        if earliest {
            self.changed.notify_one();
        }
    }

    fn run(&self) {
        let mut alarms = self.alarms.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let now = Instant::now();
            alarms = match alarms.heap.peek() {
                None => self
                    .changed
                    .wait(alarms)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(Reverse(next)) if next.at <= now => {
                    if let Some(Reverse(due)) = alarms.heap.pop() {
                        // The waiter may be gone: nothing to wake then.
                        let _ = due.wake.send(());
                    }
                    alarms
                }
                Some(Reverse(next)) => {
                    let left = next.at - now;
                    self.changed
                        .wait_timeout(alarms, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn never_ends_early() {
        for wait_us in [0u64, 200, 1500, 4000] {
            let wait = Duration::from_micros(wait_us);
            let start = Instant::now();
            sleep(wait).await;
            let took = start.elapsed();
            assert!(took >= wait, "{took:?} < {wait:?}");
        }
    }

    #[tokio::test]
    async fn a_dropped_wait_leaves_the_others_on_time() {
        let dropped =
            tokio::time::timeout(Duration::from_micros(100), sleep(Duration::from_millis(2)));
        assert!(dropped.await.is_err());
        let start = Instant::now();
        sleep(Duration::from_millis(1)).await;
        assert!(start.elapsed() >= Duration::from_millis(1));
    }
}

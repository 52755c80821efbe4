//! [`StallProbe`]: how late a runtime's timers fire while a test runs, so
//! that a test of timing can tell a busy machine from a defect.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often the probe wakes.
const TICK: Duration = Duration::from_millis(5);

/// A task on the current tokio runtime that wakes every few milliseconds
/// and records each wake-up later than asked by more than a millisecond.
/// A stall of the runtime (or of the whole process, on a busy machine)
/// shows as one late wake-up, as long as the stall. Stops when dropped.
#[derive(Debug)]
pub struct StallProbe {
    late: Arc<Mutex<Vec<Stall>>>,
    task: tokio::task::JoinHandle<()>,
}

/// One wake-up of the probe later than asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    /// When the probe woke.
    pub woke: Instant,
    /// How much later than asked.
    pub late: Duration,
}

impl StallProbe {
    /// Starts probing the current runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start() -> Self {
        let late = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&late);
        let task = tokio::spawn(async move {
            loop {
                let due = tokio::time::Instant::now() + TICK;
                tokio::time::sleep_until(due).await;
                let woke = Instant::now();
                let late = woke.saturating_duration_since(due.into_std());
                if late > Duration::from_millis(1) {
                    log.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Stall { woke, late });
                }
            }
        });
        Self { late, task }
    }

    /// The wake-ups later than `over` so far.
    pub fn stalls(&self, over: Duration) -> Vec<Stall> {
        let late = self.late.lock().unwrap_or_else(PoisonError::into_inner);
        late.iter().filter(|s| s.late > over).copied().collect()
    }
}

impl Drop for StallProbe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

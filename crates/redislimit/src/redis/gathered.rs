//! The releases a replica gathers: a permit dropped after its request went
//! out, in lease mode (the common release), queues its lease's `ZREM`
//! here, and one task at a time sends what has queued as one pipeline,
//! then what queued meanwhile, until none is left (`slots.rs` sends them).
//!
//! A task and a round trip for each release cost a replica about a fifth
//! of its CPU for an admission through Redis (docs/PERFORMANCE.md); a
//! pipeline costs one task and one round trip for all that queued during
//! the last. Only those completions queue here, of permits taken on a
//! multi-thread runtime; an abandoned request, serialized mode, a Cluster
//! (whose hosts' keys lie on many nodes) and a permit of a current-thread
//! runtime release one by one, as does a completion whose `ZREM` the
//! server refused or whose pipeline failed (then retried as every release
//! is).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::runtime::Handle;

use super::keys::RedisKeys;
use super::lifecycle::Pending;
use super::settings::Args;

/// The most releases one pipeline carries; more go in the next.
const MOST: usize = 256;

/// A completion waiting for the pipeline that carries it.
pub(super) struct Queued {
    pub(super) keys: Arc<RedisKeys>,
    pub(super) token: Arc<str>,
    pub(super) args: Args,
    /// Counted among the releases on their way until it lands.
    pub(super) pending: Pending,
    /// The permit's runtime, where it is released on its own if it must.
    pub(super) runtime: Handle,
}

/// The queue (of [`Queued`] releases), and whether a task is sending it.
pub(super) struct Gathered<T = Queued> {
    queue: Mutex<Vec<T>>,
    sending: AtomicBool,
}

impl<T> Default for Gathered<T> {
    fn default() -> Self {
        Self {
            queue: Mutex::new(Vec::new()),
            sending: AtomicBool::new(false),
        }
    }
}

impl<T> Gathered<T> {
    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<T>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `release`: `true` when no task is sending, and the caller
    /// must start one.
    pub(super) fn push(&self, release: T) -> bool {
        self.queue().push(release);
        !self.sending.swap(true, Ordering::AcqRel)
    }

    /// The next pipeline's releases (the oldest first), for the task
    /// sending.
    pub(super) fn take(&self) -> Vec<T> {
        let mut queue = self.queue();
        if queue.len() <= MOST {
            std::mem::take(&mut *queue)
        } else {
            queue.drain(..MOST).collect()
        }
    }

    /// For the task sending, which found the queue empty: whether it
    /// stops. It goes on when a release queued after its last look, whose
    /// caller saw it sending and started no other.
    pub(super) fn stop(&self) -> bool {
        self.sending.store(false, Ordering::Release);
        if self.queue().is_empty() {
            return true;
        }
        // Queued meanwhile: send it, unless its caller has started a task.
        self.sending.swap(true, Ordering::AcqRel)
    }

    /// For a task dropped unfinished (its runtime shut down): every
    /// release still queued, which its permit's runtime then sends; the
    /// next release queued starts a task again.
    pub(super) fn abandon(&self) -> Vec<T> {
        let queued = std::mem::take(&mut *self.queue());
        self.sending.store(false, Ordering::Release);
        queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_task_sends_what_queued_until_none_is_left() {
        let gathered = Gathered::default();
        assert!(gathered.push(1), "the first starts a task");
        assert!(!gathered.push(2), "one task at a time");
        assert_eq!(gathered.take(), [1, 2]);
        // Queued while the pipeline was on its way: the same task sends it.
        assert!(!gathered.push(3));
        assert_eq!(gathered.take(), [3]);
        assert!(gathered.take().is_empty());
        assert!(gathered.stop(), "nothing left: the task stops");
        assert!(gathered.push(4), "the next starts a task again");
    }

    #[test]
    fn a_release_queued_as_the_task_stops_is_sent_by_one_task() {
        let gathered = Gathered::default();
        assert!(gathered.push(1));
        assert_eq!(gathered.take(), [1]);
        // Queued after the task found the queue empty, before it stopped:
        // its caller saw it sending, so the task goes on.
        assert!(!gathered.push(2));
        assert!(!gathered.stop(), "the task goes on");
        assert_eq!(gathered.take(), [2]);
        assert!(gathered.stop());
    }

    #[test]
    fn a_release_queued_after_the_task_stopped_starts_another() {
        let gathered = Gathered::default();
        assert!(gathered.push(1));
        assert_eq!(gathered.take(), [1]);
        assert!(gathered.stop());
        assert!(gathered.push(2), "no task sending: its caller starts one");
        assert!(!gathered.push(3));
        assert_eq!(gathered.take(), [2, 3]);
    }

    #[test]
    fn a_pipeline_carries_at_most_its_share_and_an_abandoned_queue_is_handed_out() {
        let gathered = Gathered::default();
        for n in 0..MOST + 3 {
            gathered.push(n);
        }
        assert_eq!(gathered.take(), (0..MOST).collect::<Vec<_>>());
        assert_eq!(gathered.abandon(), [MOST, MOST + 1, MOST + 2]);
        assert!(gathered.push(0), "abandoned: a task starts again");
    }
}

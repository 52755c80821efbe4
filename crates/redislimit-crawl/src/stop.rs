//! Stopping a crawl: first gracefully (no new request starts, those in
//! flight may finish), then at once.

use std::sync::Arc;

use tokio::sync::watch;

/// How far a crawl has been told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StopLevel {
    /// Running.
    Run,
    /// No request starts; those in flight finish.
    Graceful,
    /// Requests in flight end now (their permits are released).
    Abort,
}

/// A handle that stops a [`Crawler`](super::Crawler); clones share it.
#[derive(Debug, Clone)]
pub struct Stop {
    level: Arc<watch::Sender<StopLevel>>,
}

impl Default for Stop {
    fn default() -> Self {
        Self::new()
    }
}

impl Stop {
    /// A crawl that runs.
    pub fn new() -> Self {
        Self {
            level: Arc::new(watch::Sender::new(StopLevel::Run)),
        }
    }

    /// Stops starting requests; those in flight go on.
    pub fn graceful(&self) {
        self.raise(StopLevel::Graceful);
    }

    /// Ends the requests in flight too.
    pub fn abort(&self) {
        self.raise(StopLevel::Abort);
    }

    /// How far the crawl has been told to stop.
    pub fn level(&self) -> StopLevel {
        *self.level.borrow()
    }

    pub(super) fn watch(&self) -> watch::Receiver<StopLevel> {
        self.level.subscribe()
    }

    fn raise(&self, to: StopLevel) {
        self.level.send_if_modified(|level| {
            let raised = to > *level;
            if raised {
                *level = to;
            }
            raised
        });
    }
}

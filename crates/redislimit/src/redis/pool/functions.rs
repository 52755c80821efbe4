//! Whether a limiter's connections run the scripts as Redis Functions,
//! and the loads of the function library made through them.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How one limiter's connections run the scripts: as Redis Functions until
/// the server shows that it has none, or will not let this user use them
/// (then with `EVALSHA`, until the process restarts); and the loads of the
/// library made through them, one at a time: a crowd of calls that all
/// found the library missing (after a restart) sends one load, not one
/// each.
#[derive(Debug)]
pub(crate) struct Functions {
    enabled: AtomicBool,
    /// Loads of the library that succeeded.
    loads: AtomicU64,
    /// Held by the one load under way.
    loading: tokio::sync::Mutex<()>,
}

impl Functions {
    pub(crate) fn new() -> Self {
        Self {
            enabled: AtomicBool::new(true),
            loads: AtomicU64::new(0),
            loading: tokio::sync::Mutex::new(()),
        }
    }

    /// Whether scripts are still run as Redis Functions.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// From now on (until the process restarts), scripts are run with
    /// `EVALSHA` through these connections; `why` is what the server said.
    pub(crate) fn disable(&self, why: &dyn std::fmt::Display) {
        if self.enabled.swap(false, Ordering::Relaxed) {
            tracing::info!(
                error = %why,
                "Redis runs no functions for this user (a server before Redis 7, or an ACL \
                 that refuses them): running the scripts with EVALSHA"
            );
        }
    }

    /// How many loads of the library have succeeded: read before a call,
    /// for [`load_once`](Self::load_once).
    pub(crate) fn loads(&self) -> u64 {
        self.loads.load(Ordering::Acquire)
    }

    /// Runs `load` (the library's `FUNCTION LOAD`) unless a load succeeded
    /// since `seen` was read ([`loads`](Self::loads)), one load at a time.
    pub(crate) async fn load_once<E>(
        &self,
        seen: u64,
        load: impl Future<Output = Result<(), E>>,
    ) -> Result<(), E> {
        let _one_at_a_time = self.loading.lock().await;
        if self.loads() != seen {
            return Ok(());
        }
        load.await?;
        self.loads.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

//! The circuit: how a `RedisLimiter` stops asking a Redis that failed to
//! answer, and how it learns that Redis is back.
//!
//! It reads Redis, never the caller: it opens on failures of Redis itself
//! (no connection, refused, reset, a response timeout of the pool's
//! connections) and on nothing a caller did (a call its own deadline cut
//! short says nothing about Redis). Any answer from Redis closes it, from
//! any operation, an error reply included: an answer means Redis is there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_redis::redis::RedisError;
use tokio::time::Instant;

use super::pool::QueryError;

/// How long calls skip a Redis that failed to answer before one probes it.
const REPROBE: Duration = Duration::from_secs(1);

/// Whether Redis is skipped for now, shared by every caller of one limiter.
#[derive(Debug)]
pub(crate) struct Circuit {
    /// Until when (µs since `epoch`) calls skip Redis; 0 while it answers.
    until: AtomicU64,
    epoch: Instant,
}

impl Circuit {
    pub(crate) fn new() -> Self {
        Self {
            until: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Microseconds since this circuit was made.
    fn clock_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX - 1)
    }

    /// Whether a call should skip Redis for now because it just failed to
    /// answer. Once a second one caller is let through to probe it: a frozen
    /// Redis costs one timeout a second, not one per request.
    pub(crate) fn open(&self) -> bool {
        let until = self.until.load(Ordering::Acquire);
        if until == 0 {
            return false;
        }
        let now = self.clock_us();
        if now < until {
            return true;
        }
        let probe_until = now.saturating_add(REPROBE.as_micros() as u64);
        // Whoever moves the mark forward is the probe; everyone else waits.
        self.until
            .compare_exchange(until, probe_until, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    }

    /// Whether the circuit is open and not yet due for a probe (no side
    /// effect: the probe is chosen by [`open`](Self::open)).
    pub(crate) fn waiting(&self) -> bool {
        let until = self.until.load(Ordering::Acquire);
        until != 0 && self.clock_us() < until
    }

    /// Redis answered (an error reply included): the circuit closes.
    pub(crate) fn answered(&self) {
        if self.until.load(Ordering::Acquire) != 0 {
            self.until.store(0, Ordering::Release);
        }
    }

    /// A call failed with `err`: the circuit opens if Redis did not answer,
    /// and closes if it did (an error reply).
    pub(crate) fn observe_failure(&self, err: &QueryError) {
        if not_answering(err) {
            let until = self.clock_us().saturating_add(REPROBE.as_micros() as u64);
            self.until.store(until.max(1), Ordering::Release);
        } else {
            self.answered();
        }
    }
}

/// Whether a failure says Redis could not be reached or did not answer (as
/// opposed to an answer that was an error reply).
pub(crate) fn not_answering(err: &QueryError) -> bool {
    if super::misconfig::diagnose(err).is_some() {
        // It answered: wrongly set up, not away.
        return false;
    }
    match err {
        QueryError::Misconfigured(..) => false,
        QueryError::Pool(_) => true,
        QueryError::Redis(e) => connection_error(e),
    }
}

/// Whether a Redis error is about the connection, not an answer.
fn connection_error(e: &RedisError) -> bool {
    e.is_timeout() || e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> QueryError {
        QueryError::Redis(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )))
    }

    fn error_reply() -> QueryError {
        QueryError::Redis(RedisError::from((
            deadpool_redis::redis::ErrorKind::Server(
                deadpool_redis::redis::ServerErrorKind::ResponseError,
            ),
            "WRONGTYPE",
        )))
    }

    #[tokio::test(start_paused = true)]
    async fn opens_on_failures_to_answer_and_closes_on_any_answer() {
        let c = Circuit::new();
        assert!(!c.open());
        c.observe_failure(&refused());
        assert!(c.open() && c.waiting());
        c.observe_failure(&error_reply());
        assert!(!c.open(), "an error reply is an answer");
        c.observe_failure(&refused());
        tokio::time::advance(REPROBE).await;
        assert!(!c.waiting());
        assert!(!c.open(), "the first caller after a second probes");
        assert!(c.open(), "the others keep skipping while it does");
        c.answered();
        assert!(!c.open());
    }
}

//! `Backoff`: widening a host's gap when it signals overload without
//! saying for how long, and narrowing it back as it recovers.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::{BackoffStep, HostKey, Limiter};

/// Adaptive backoff per host, for the signals that carry no delay: a
/// `429`/`503` without `Retry-After` (or rate limit headers), any other
/// `5xx`, a timeout, a refused or reset connection.
///
/// Each such signal doubles the host's gap (from [`start`](Self::new) up
/// to `max`), and the middleware holds the host for it, through the
/// limiter's penalty, so every replica sharing the limiter keeps it. Each
/// success while backing off narrows the gap to three quarters and holds
/// the host for that; once it falls below `start`, the host is back on its
/// own pacing. So a host failing for a while sees requests 1 s, 2 s, 4 s
/// ... apart, and after it recovers 1.5 s, 1.1 s, ... apart, then its
/// policy's pace.
///
/// The formula is AIMD's shape applied to the delay: a multiplicative
/// increase on overload, as TCP and the binary exponential backoff of
/// retry libraries do, so a struggling server sheds load fast; and a
/// gentler multiplicative decrease on success, so one lucky response does
/// not bring the full rate back at once (Scrapy's AutoThrottle also moves
/// its delay only part of the way per response, towards its target;
/// Heritrix scales the delay with the fetch time through its delay
/// factor). Both need only the last gap, no latency measurements.
///
/// Through a limiter that keeps shared backoff state (`RedisLimiter`
/// does; see [`widen_through`](Self::widen_through)) the gap is one per
/// host for every replica: a bare `503` seen by any replica widens it for all, and any
/// replica that saw the host backing off narrows it on its successes.
/// Otherwise (in-process limiters, or Redis unavailable) the gap is kept
/// in this process (clones share it), and the holds it causes still reach
/// every replica sharing the limiter. Hosts are forgotten once their gap
/// has narrowed away.
#[derive(Clone)]
pub struct Backoff {
    start: Duration,
    max: Duration,
    gaps: Arc<Mutex<HashMap<Gapped, Duration>>>,
}

/// A host and port: what one gap is kept for (a limiter keyed by host and
/// port paces each port apart, so each has its own gap).
type Gapped = (HostKey, Option<u16>);

fn gapped(host: &HostKey) -> Gapped {
    (host.clone(), host.port())
}

/// Hosts backing off at once beyond which the oldest state is dropped.
const MAX_HOSTS: usize = 65_536;

impl Backoff {
    /// Starts at `start` (at least a millisecond: a zero gap could never
    /// widen) and widens up to `max` (the limiter's own `max_penalty` caps
    /// it too).
    pub fn new(start: Duration, max: Duration) -> Self {
        let start = start.max(Duration::from_millis(1));
        Self {
            start,
            max: max.max(start),
            gaps: Arc::default(),
        }
    }

    /// An overload signal from `host`: the gap to hold it for now, kept
    /// in this process.
    pub fn widen(&self, host: &HostKey) -> Duration {
        let step = self.step(true);
        self.move_local(host, step).unwrap_or(self.start)
    }

    /// A success from `host`: the narrowed gap to hold it for, while it is
    /// still backing off; `None` once it is back on its own pacing. Kept
    /// in this process.
    pub fn narrow(&self, host: &HostKey) -> Option<Duration> {
        let step = self.step(false);
        self.move_local(host, step)
    }

    /// An overload signal from `host`, through `limiter`: widens its gap
    /// and holds the host for it, in the limiter's shared state when it
    /// keeps one (every replica then widens the same gap), else in this
    /// process, holding the host through the limiter's penalty. Either way
    /// this process remembers the gap, so its own successes narrow it.
    /// Returns the gap now in force. What the pacing middlewares call.
    pub async fn widen_through(&self, limiter: &dyn Limiter, host: &HostKey) -> Option<Duration> {
        self.shift(limiter, host, true).await
    }

    /// A success from `host`, through `limiter` (see
    /// [`widen_through`](Self::widen_through)): the narrowed gap in force,
    /// `None` once the host is back on its own pacing.
    pub async fn narrow_through(&self, limiter: &dyn Limiter, host: &HostKey) -> Option<Duration> {
        self.shift(limiter, host, false).await
    }

    /// Moves `host`'s gap one step and holds the host for it (see
    /// [`widen_through`](Self::widen_through)).
    async fn shift(&self, limiter: &dyn Limiter, host: &HostKey, widen: bool) -> Option<Duration> {
        let step = self.step(widen);
        if let Some(shared) =
            crate::limiter::coordination(limiter).and_then(|c| c.back_off_host(host.clone(), step))
            && let Ok(gap) = shared.await
        {
            self.remember(host, gap);
            return gap;
        }
        let gap = self.move_local(host, step);
        if let Some(gap) = gap {
            // Failures are the limiter's hooks' to report.
            let _ = limiter.penalize_host(host.clone(), gap).await;
        }
        gap
    }

    fn step(&self, widen: bool) -> BackoffStep {
        if widen {
            BackoffStep::Widen {
                start: self.start,
                max: self.max,
            }
        } else {
            BackoffStep::Narrow { start: self.start }
        }
    }

    fn move_local(&self, host: &HostKey, step: BackoffStep) -> Option<Duration> {
        let mut gaps = self.gaps.lock().unwrap_or_else(PoisonError::into_inner);
        let gap = step.apply(gaps.get(&gapped(host)).copied());
        Self::set(&mut gaps, host, gap);
        gap
    }

    fn remember(&self, host: &HostKey, gap: Option<Duration>) {
        let mut gaps = self.gaps.lock().unwrap_or_else(PoisonError::into_inner);
        Self::set(&mut gaps, host, gap);
    }

    fn set(gaps: &mut HashMap<Gapped, Duration>, host: &HostKey, gap: Option<Duration>) {
        let key = gapped(host);
        match gap {
            Some(gap) => {
                if gaps.len() >= MAX_HOSTS && !gaps.contains_key(&key) {
                    gaps.clear();
                }
                gaps.insert(key, gap);
            }
            None => {
                gaps.remove(&key);
            }
        }
    }

    /// Whether `host` is backing off.
    pub fn is_backing_off(&self, host: &HostKey) -> bool {
        self.gaps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&gapped(host))
    }
}

impl Default for Backoff {
    /// From 1 s up to 10 minutes.
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(600))
    }
}

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backoff")
            .field("start", &self.start)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Backoff {
    /// The same settings (the hosts' state is not compared).
    fn eq(&self, other: &Self) -> bool {
        (self.start, self.max) == (other.start, other.max)
    }
}

impl Eq for Backoff {}

/// Whether an error, or one of its causes, is a timeout or a connection
/// that was refused, reset or cut: a transport failure that says the host
/// may be overloaded.
pub fn is_transport_failure(err: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind;
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                ErrorKind::TimedOut
                    | ErrorKind::ConnectionRefused
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
            )
        {
            return true;
        }
        if e.is::<tokio::time::error::Elapsed>() {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn overload_doubles_and_success_narrows_by_a_quarter() {
        let b = Backoff::new(S, 4 * S);
        let h = HostKey::parse("http://a.test/").unwrap();
        let other = HostKey::parse("http://b.test/").unwrap();
        assert_eq!(b.narrow(&h), None, "nothing to narrow");
        assert_eq!(b.widen(&h), S);
        assert_eq!(b.widen(&h), 2 * S);
        assert_eq!(b.widen(&h), 4 * S);
        assert_eq!(b.widen(&h), 4 * S, "capped");
        assert!(!b.is_backing_off(&other));
        assert_eq!(b.narrow(&h), Some(3 * S));
        assert_eq!(b.narrow(&h), Some(Duration::from_millis(2250)));
        assert_eq!(b.narrow(&h), Some(Duration::from_micros(1_687_500)));
        assert_eq!(b.narrow(&h), Some(Duration::from_micros(1_265_625)));
        assert_eq!(b.narrow(&h), None, "below the start: back on its pacing");
        assert!(!b.is_backing_off(&h));
        assert_eq!(b.widen(&h), S, "starts over");
        // A zero start still widens.
        let z = Backoff::new(Duration::ZERO, S);
        assert_eq!(z.widen(&h), Duration::from_millis(1));
        assert_eq!(z.widen(&h), Duration::from_millis(2));
    }

    #[test]
    fn transport_failures_are_told_from_other_errors() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(is_transport_failure(&reset));
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(!is_transport_failure(&denied));
        let wrapped = crate::Error::unavailable(crate::Op::Acquire, reset);
        assert!(is_transport_failure(&wrapped), "found among the causes");
    }
}

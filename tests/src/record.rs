//! [`Recorder`]: what an upstream saw (per host: when each request was sent
//! and when it ended), and the checks of the pacing invariants made on it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One request as the upstream saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The host it was sent to.
    pub host: String,
    /// Which replica (limiter instance or process) sent it.
    pub replica: usize,
    /// The path and query it asked for (empty when not an HTTP request).
    pub path: String,
    /// The status it was answered with (`200` when not an HTTP request).
    pub status: u16,
    /// When it arrived.
    pub send: Instant,
    /// When its response was complete.
    pub end: Instant,
}

/// A thread-safe log of requests.
#[derive(Debug, Default)]
pub struct Recorder {
    log: Mutex<Vec<Request>>,
}

impl Recorder {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one request.
    pub fn record(&self, host: &str, replica: usize, send: Instant, end: Instant) {
        self.add(Request {
            host: host.to_owned(),
            replica,
            path: String::new(),
            status: 200,
            send,
            end,
        });
    }

    /// Adds one request.
    pub fn add(&self, request: Request) {
        self.log.lock().unwrap().push(request);
    }

    /// Every request, in order of sending.
    pub fn all(&self) -> Vec<Request> {
        let mut all = self.log.lock().unwrap().clone();
        all.sort_by_key(|r| r.send);
        all
    }

    /// The requests to `host`, in order of sending.
    pub fn host(&self, host: &str) -> Vec<Request> {
        self.all().into_iter().filter(|r| r.host == host).collect()
    }
}

/// Invariant 1 (serialized mode): no two requests overlap, and every send is
/// at least `gap` after the latest end before it. Returns the smallest gap
/// seen between an end and the next send.
pub fn assert_serialized(reqs: &[Request], gap: Duration) -> Duration {
    let mut smallest = Duration::MAX;
    for pair in reqs.windows(2) {
        let latest_end = pair[0].end;
        assert!(
            pair[1].send >= latest_end,
            "overlap: a request was sent {:?} before the previous one ended ({pair:?})",
            latest_end - pair[1].send
        );
        let seen = pair[1].send - latest_end;
        assert!(
            seen >= gap,
            "a send came {seen:?} after the previous end, less than {gap:?} ({pair:?})"
        );
        smallest = smallest.min(seen);
    }
    smallest
}

/// The most requests in flight at once.
pub fn max_in_flight(reqs: &[Request]) -> usize {
    reqs.iter()
        .map(|r| {
            reqs.iter()
                .filter(|o| o.send <= r.send && o.end > r.send)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// The smallest gap between consecutive sends.
pub fn min_send_gap(reqs: &[Request]) -> Duration {
    reqs.windows(2)
        .map(|w| w[1].send - w[0].send)
        .min()
        .unwrap_or(Duration::MAX)
}

/// The most sends inside any interval `[s, s + window)` starting at a send.
pub fn max_in_window(reqs: &[Request], window: Duration) -> usize {
    reqs.iter()
        .map(|r| {
            reqs.iter()
                .filter(|o| o.send >= r.send && o.send < r.send + window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(send_ms: u64, end_ms: u64, base: Instant) -> Request {
        Request {
            host: "h".into(),
            replica: 0,
            path: String::new(),
            status: 200,
            send: base + Duration::from_millis(send_ms),
            end: base + Duration::from_millis(end_ms),
        }
    }

    #[test]
    fn checks_measure_what_they_say() {
        let t = Instant::now();
        let reqs = [
            req(0, 10, t),
            req(5, 20, t),
            req(30, 40, t),
            req(100, 110, t),
        ];
        assert_eq!(max_in_flight(&reqs), 2);
        assert_eq!(min_send_gap(&reqs), Duration::from_millis(5));
        assert_eq!(max_in_window(&reqs, Duration::from_millis(31)), 3);
        assert_eq!(max_in_window(&reqs, Duration::from_millis(30)), 2);
        let serial = [req(0, 10, t), req(30, 40, t), req(60, 70, t)];
        assert_eq!(
            assert_serialized(&serial, Duration::from_millis(20)),
            Duration::from_millis(20)
        );
    }

    #[test]
    #[should_panic(expected = "overlap")]
    fn serialized_check_catches_overlap() {
        let t = Instant::now();
        assert_serialized(&[req(0, 10, t), req(5, 20, t)], Duration::ZERO);
    }

    #[test]
    #[should_panic(expected = "less than")]
    fn serialized_check_catches_short_gaps() {
        let t = Instant::now();
        assert_serialized(&[req(0, 10, t), req(15, 20, t)], Duration::from_millis(10));
    }
}

//! Where this process's clock stands against Redis `TIME` (and so how late an
//! answer reached its caller), and how long a script call takes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Where this process's clock stands against Redis `TIME`, and so how late
/// an answer reached its caller. A script runs after its call was sent, so
/// the Redis time an admission read, less the local time its call was sent,
/// is at least the offset (Redis minus here); the least of these is the
/// tightest bound. Above the true offset by the way the quickest call took
/// to Redis (and any wait in Redis's queue it met), never below it: the
/// lateness it gives (how long after its admission an answer reached its
/// caller) is never understated, and overstated by at most the quickest
/// round trip of the calls counted. It includes the way back from Redis
/// and any time this process took to read the answer: a replica far from
/// Redis, or busy, sends that much later than one near and idle, and the
/// room for its lateness must cover it (see `lateness.rs`).
///
/// The local clock is Tokio's (monotonic), so the process's wall clock,
/// however wrong or stepped, plays no part. Only the calls of the last one
/// or two [`CLOCK_WINDOW`]s count, so that a Redis clock that stepped back
/// (a failover to a node whose clock differs, an NTP step) is followed at
/// once and one that stepped forward within two windows (meanwhile the
/// lateness is understated by the step). An admission's own call is folded
/// in before its lateness is reckoned, so the lateness is never put above
/// that call's own round trip. With several Redis clocks (a Cluster) the
/// bound follows the one furthest behind, and the lateness it gives is
/// understated for the others by how far ahead they are.
#[derive(Debug)]
pub(super) struct RedisClock {
    base: Instant,
    /// The bound so far; `None` before the first admission.
    bound: std::sync::Mutex<Option<ClockBound>>,
}

/// The least offset (µs) of admissions seen in the current window and in
/// the one before it (if it was the window just before), and when (µs after
/// [`RedisClock::base`]) the current one began.
#[derive(Debug, Clone, Copy)]
struct ClockBound {
    current: i64,
    previous: Option<i64>,
    since: i64,
}

impl ClockBound {
    /// The least of both windows.
    fn least(&self) -> i64 {
        self.previous
            .map_or(self.current, |previous| previous.min(self.current))
    }
}

/// How long (µs) a window of [`RedisClock`] lasts.
const CLOCK_WINDOW: i64 = 10_000_000;

impl Default for RedisClock {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            bound: std::sync::Mutex::new(None),
        }
    }
}

impl RedisClock {
    fn local_us(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.base).as_micros()).unwrap_or(i64::MAX)
    }

    /// Folds in an admission whose call was sent at `sent` and whose
    /// script read `redis_us` on the Redis clock.
    pub(super) fn observe(&self, sent: Instant, redis_us: u64) {
        let at = self.local_us(sent);
        let offset = i64::try_from(redis_us)
            .unwrap_or(i64::MAX)
            .saturating_sub(at);
        let mut bound = self
            .bound
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *bound = Some(match *bound {
            Some(b) if at.saturating_sub(b.since) < CLOCK_WINDOW => ClockBound {
                current: b.current.min(offset),
                ..b
            },
            // A new window; the one that ended counts on if it was the last.
            Some(b) => ClockBound {
                current: offset,
                previous: (at.saturating_sub(b.since) < 2 * CLOCK_WINDOW).then_some(b.current),
                since: at,
            },
            None => ClockBound {
                current: offset,
                previous: None,
                since: at,
            },
        });
    }

    /// At most how late `now` is after `redis_us` on the Redis clock (zero
    /// before any admission was seen).
    pub(super) fn late(&self, redis_us: u64, now: Instant) -> Duration {
        let bound = *self
            .bound
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(offset) = bound.map(|b| b.least()) else {
            return Duration::ZERO;
        };
        let late = self
            .local_us(now)
            .saturating_add(offset)
            .saturating_sub(i64::try_from(redis_us).unwrap_or(i64::MAX));
        Duration::from_micros(u64::try_from(late).unwrap_or(0))
    }
}

/// A running estimate of the round trip of a script call (local clock).
#[derive(Debug, Default)]
pub(super) struct RoundTrip(AtomicU64);

impl RoundTrip {
    /// Folds in one call's round trip (an eighth of the weight), counted
    /// as at most four times the estimate: one reply held up (a busy
    /// process, a stalled path) must not make every waiter ask early, and
    /// again and again, until the estimate comes down; a lasting rise is
    /// followed within a dozen calls.
    pub(super) fn observe(&self, rtt: Duration) {
        let us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                let new = if old == 0 {
                    us
                } else {
                    old - old / 8 + us.min(old.saturating_mul(4)) / 8
                };
                Some(new.max(1))
            });
    }

    /// The estimate (zero before the first call).
    pub(super) fn get(&self) -> Duration {
        Duration::from_micros(self.0.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// Redis's clock here: `offset` µs ahead of `base`'s (as µs).
    fn redis_at(clock: &RedisClock, at: Instant, offset: i64) -> u64 {
        (clock.local_us(at) + offset) as u64
    }

    /// One admission: its call takes `to` to reach Redis, whose clock is
    /// `offset` µs ahead, and `back` to be answered; the Redis time its
    /// script read. Folded into `clock` as the limiter does.
    async fn call(clock: &RedisClock, offset: i64, to: Duration, back: Duration) -> u64 {
        let sent = Instant::now();
        tokio::time::advance(to).await;
        let read = redis_at(clock, Instant::now(), offset);
        tokio::time::advance(back).await;
        clock.observe(sent, read);
        read
    }

    /// Redis's clock, well ahead of this one's base (so that it never
    /// reads below zero).
    const OFFSET: i64 = 60_000_000;

    #[tokio::test(start_paused = true)]
    async fn lateness_is_the_way_back_overstated_by_the_quickest_way_there() {
        let clock = RedisClock::default();
        // Calls of 300 µs each way, then one of 20 and 40.
        call(&clock, OFFSET, 300 * US, 300 * US).await;
        call(&clock, OFFSET, 20 * US, 40 * US).await;
        // Against the quickest way there (20 µs), an answer read at once
        // after its script is 20 µs late ...
        assert_eq!(
            clock.late(redis_at(&clock, Instant::now(), OFFSET), Instant::now()),
            20 * US
        );
        // ... and one that takes 3 ms to come back, 3 ms and those 20 µs.
        let admitted = call(&clock, OFFSET, 20 * US, 3_000 * US).await;
        assert_eq!(clock.late(admitted, Instant::now()), 3_020 * US);
        // A Redis far away (2 ms each way) is late by the way back: a
        // replica near it would send 2 ms sooner after an admission.
        let far = RedisClock::default();
        for _ in 0..3 {
            let admitted = call(&far, OFFSET, 2_000 * US, 2_000 * US).await;
            assert_eq!(far.late(admitted, Instant::now()), 4_000 * US);
        }
        // Nothing seen yet: nothing is late.
        let fresh = RedisClock::default();
        assert_eq!(fresh.late(0, Instant::now()), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_process_is_late_from_its_first_answer() {
        let clock = RedisClock::default();
        // The first answer is read 40 ms after its script ran: its own
        // call is the only measure, and it counts all of its round trip.
        let admitted = call(&clock, OFFSET, 50 * US, 40_000 * US).await;
        assert_eq!(clock.late(admitted, Instant::now()), 40_050 * US);
        // A minute without a call, then one whose answer is held 40 ms:
        // the quick way there seen before the spell is still the measure.
        call(&clock, OFFSET, 50 * US, 50 * US).await;
        tokio::time::advance(Duration::from_secs(60)).await;
        let admitted = call(&clock, OFFSET, 50 * US, 40_000 * US).await;
        assert_eq!(clock.late(admitted, Instant::now()), 40_050 * US);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wall_clock_plays_no_part_and_the_error_is_the_quickest_way_there() {
        // Whatever Redis's clock reads against this process's (hours
        // ahead or behind), lateness is what the calls show.
        for offset in [OFFSET, OFFSET + 3_600_000_000, 7_200_000_000 - OFFSET] {
            let clock = RedisClock::default();
            call(&clock, offset, 500 * US, 100 * US).await;
            call(&clock, offset, 80 * US, 900 * US).await;
            let admitted = call(&clock, offset, 300 * US, 5_000 * US).await;
            // 5 ms back, and the quickest way there (80 µs): never less
            // than the truth, never more than that.
            assert_eq!(clock.late(admitted, Instant::now()), 5_080 * US);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_that_stepped_is_followed_within_two_windows() {
        let clock = RedisClock::default();
        let window = Duration::from_micros(CLOCK_WINDOW as u64);
        let quick = 50 * US;
        call(&clock, OFFSET, quick, quick).await;
        // Redis's clock steps back 5 ms: the next call shows it at once,
        // and its own answer is as late as its way there and back.
        let admitted = call(&clock, OFFSET - 5_000, quick, quick).await;
        assert_eq!(clock.late(admitted, Instant::now()), 2 * quick);
        // Then forward 5 ms again. While the low bound still counts, a
        // reply 3 ms late is taken for on time (the step hides it) ...
        let late_by = |clock: &RedisClock| {
            let now = Instant::now();
            let read = redis_at(clock, now - 3 * Duration::from_millis(1), OFFSET);
            clock.late(read, now)
        };
        call(&clock, OFFSET, quick, quick).await;
        assert_eq!(late_by(&clock), Duration::ZERO);
        tokio::time::advance(window).await;
        call(&clock, OFFSET, quick, quick).await;
        assert_eq!(late_by(&clock), Duration::ZERO);
        // ... and two windows on, it is late by the 3 ms and the quickest
        // way there.
        tokio::time::advance(window).await;
        call(&clock, OFFSET, quick, quick).await;
        assert_eq!(late_by(&clock), 3_000 * US + quick);
    }

    #[test]
    fn one_slow_reply_barely_moves_the_round_trip() {
        let rtt = RoundTrip::default();
        rtt.observe(200 * US);
        // Held up 40 ms: counted as four times the estimate.
        rtt.observe(Duration::from_millis(40));
        assert_eq!(rtt.get(), 275 * US);
        // A lasting rise is followed.
        for _ in 0..12 {
            rtt.observe(Duration::from_millis(2));
        }
        assert!(rtt.get() > Duration::from_millis(1), "{:?}", rtt.get());
    }
}

//! How long a waiter that Redis told to wait sleeps before it asks again,
//! and whether that fits its caller's deadline: plain functions of their
//! inputs, the clock passed in.

use std::time::Duration;

use tokio::time::Instant;

use crate::pacing::after;

/// What a waiter knows when Redis tells it to wait.
#[derive(Debug, Clone, Copy)]
pub(super) struct Told {
    /// How long Redis said no send may happen.
    pub(super) wait: Duration,
    /// Whether the host's in-flight cap is taken (nobody knows for how
    /// long).
    pub(super) full: bool,
}

/// What shapes the pause: this limiter's timing and the way to Redis.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    /// How far ahead of its slot a waiter may be booked (zero: never).
    pub(super) horizon: Duration,
    /// How long after its slot a waiter aims to reach Redis.
    pub(super) slot_margin: Duration,
    /// The round trip of a script call, as measured.
    pub(super) round_trip: Duration,
    /// How soon to ask again when the in-flight cap is taken.
    pub(super) concurrency_retry: Duration,
}

/// How long a waiter told `told` sleeps before it asks again. A full host
/// is asked again after the retry interval (or the wait, if longer). Within
/// a booking horizon it asks while the slot is still within the horizon
/// ahead, so it is booked for it and sends on time. Otherwise it asks a
/// round trip before its slot plus the margin: the script ran about half a
/// round trip ago, so the call reaches Redis just after the slot and is
/// admitted then (lateness before the decision costs pace, never a gap).
pub(super) fn pause(told: Told, timing: Timing) -> Duration {
    if told.full {
        told.wait.max(timing.concurrency_retry)
    } else if !timing.horizon.is_zero() {
        told.wait.saturating_sub(timing.horizon / 2)
    } else {
        (told.wait + timing.slot_margin).saturating_sub(timing.round_trip)
    }
}

/// What a waiter does with its pause and its caller's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fit {
    /// Sleeps until then, and asks again.
    Sleep(Instant),
    /// Fails at once: the wait cannot fit the deadline (a send could come
    /// no sooner than `earliest`).
    OverBudget { earliest: Instant },
}

/// Whether a waiter told `told` at `now`, pausing `pause` (and `jittered`
/// with its jitter), fits `deadline`. A known wait that cannot fit fails at
/// once; a full host (whose wait nobody knows) is retried until the
/// deadline. Jitter spreads replicas out but never costs the budget.
pub(super) fn fit(
    now: Instant,
    told: Told,
    pause: Duration,
    jittered: Duration,
    deadline: Option<Instant>,
) -> Fit {
    let wake = after(now, jittered);
    let Some(deadline) = deadline else {
        return Fit::Sleep(wake);
    };
    let ready = after(now, told.wait);
    if ready > deadline || (told.full && now >= deadline) {
        return Fit::OverBudget {
            earliest: after(now, pause),
        };
    }
    Fit::Sleep(wake.min(deadline))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const US: Duration = Duration::from_micros(1);

    fn timing(horizon: Duration) -> Timing {
        Timing {
            horizon,
            slot_margin: 100 * US,
            round_trip: 300 * US,
            concurrency_retry: 50 * MS,
        }
    }

    #[test]
    fn a_waiter_asks_a_round_trip_before_its_slot_plus_the_margin() {
        let told = Told {
            wait: 10 * MS,
            full: false,
        };
        assert_eq!(pause(told, timing(Duration::ZERO)), 9_800 * US);
        // Booked ahead: asks with half the horizon left.
        assert_eq!(pause(told, timing(4 * MS)), 8 * MS);
        // Full: the retry interval, or the wait if longer.
        let full = Told { full: true, ..told };
        assert_eq!(pause(full, timing(Duration::ZERO)), 50 * MS);
        let long = Told {
            wait: 80 * MS,
            full: true,
        };
        assert_eq!(pause(long, timing(Duration::ZERO)), 80 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_cannot_fit_fails_at_once_and_a_full_host_is_tried_until_the_deadline() {
        let now = Instant::now();
        let told = Told {
            wait: 10 * MS,
            full: false,
        };
        assert_eq!(
            fit(now, told, 9 * MS, 12 * MS, Some(now + 5 * MS)),
            Fit::OverBudget {
                earliest: now + 9 * MS
            }
        );
        // The jitter is cut at the deadline, never over budget.
        assert_eq!(
            fit(now, told, 9 * MS, 12 * MS, Some(now + 11 * MS)),
            Fit::Sleep(now + 11 * MS)
        );
        let full = Told { full: true, ..told };
        assert_eq!(
            fit(now, full, 50 * MS, 50 * MS, Some(now + 5 * MS)),
            Fit::OverBudget {
                earliest: now + 50 * MS
            }
        );
        assert_eq!(
            fit(now, full, 50 * MS, 50 * MS, Some(now + 20 * MS)),
            Fit::Sleep(now + 20 * MS)
        );
        let full_unknown = Told {
            wait: Duration::ZERO,
            full: true,
        };
        assert_eq!(
            fit(now, full_unknown, 50 * MS, 50 * MS, Some(now + 20 * MS)),
            Fit::Sleep(now + 20 * MS)
        );
        assert_eq!(
            fit(now, full_unknown, 50 * MS, 50 * MS, Some(now)),
            Fit::OverBudget {
                earliest: now + 50 * MS
            }
        );
        assert_eq!(
            fit(now, told, 9 * MS, 12 * MS, None),
            Fit::Sleep(now + 12 * MS)
        );
    }

    proptest! {
        /// Whatever Redis says and however the way to it goes: a waiter
        /// never asks later than its slot plus the margin (or a full host's
        /// retry), never sleeps past its deadline, and fails at once exactly
        /// when its known wait ends after the deadline (or, full, once the
        /// deadline has come).
        #[test]
        fn a_pause_ends_by_the_slot_and_never_past_the_deadline(
            wait_us in 0u64..10_000_000,
            full in any::<bool>(),
            horizon_us in prop_oneof![Just(0u64), 1u64..20_000],
            rtt_us in 0u64..50_000,
            jitter_us in 0u64..100_000,
            deadline_us in prop::option::of(0u64..20_000_000),
        ) {
            let now = Instant::now();
            let told = Told { wait: Duration::from_micros(wait_us), full };
            let timing = Timing {
                horizon: Duration::from_micros(horizon_us),
                round_trip: Duration::from_micros(rtt_us),
                ..timing(Duration::ZERO)
            };
            let pause = pause(told, timing);
            if full {
                prop_assert_eq!(pause, told.wait.max(timing.concurrency_retry));
            } else {
                prop_assert!(pause <= told.wait + timing.slot_margin);
            }
            let deadline = deadline_us.map(|us| now + Duration::from_micros(us));
            let jittered = pause + Duration::from_micros(jitter_us);
            match fit(now, told, pause, jittered, deadline) {
                Fit::Sleep(wake) => {
                    prop_assert!(wake <= now + jittered);
                    if let Some(deadline) = deadline {
                        prop_assert!(wake <= deadline);
                        prop_assert!(now + told.wait <= deadline);
                    }
                }
                Fit::OverBudget { earliest } => {
                    let deadline = deadline.unwrap();
                    prop_assert_eq!(earliest, now + pause);
                    prop_assert!(now + told.wait > deadline || (full && now >= deadline));
                }
            }
        }
    }
}

//! How a replica serves each host while its primary is unavailable (the
//! plan, which the primary decides: see `redis/registry.rs`), and when its
//! turns come while it shares a host's pace with the other replicas: plain
//! functions of their inputs.

use std::fmt;
use std::time::Duration;

use crate::{HostKey, Pacing};

/// How this replica serves a host while the primary is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Alone, at the full in-process pacing.
    Alone,
    /// At its share of the pacing, `n` replicas dividing it; this one is
    /// the `index`th of them (which slots of the shared pace it takes).
    Share {
        /// How many replicas divide the pacing.
        n: u32,
        /// Which of them this one is, `0..n`.
        index: u32,
    },
    /// Not at all: another replica serves it until the primary is back.
    Defer,
    /// At the full in-process pacing, as the one replica that serves it
    /// (`Partition`) while the others defer.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Own,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Alone => f.write_str("alone at the full limits"),
            Self::Share { n, index } => {
                write!(f, "1/{n} of the limits (turn {} of {n})", index + 1)
            }
            Self::Defer => f.write_str("deferring to the replica that serves the host"),
            Self::Own => f.write_str("serving the host for all replicas (partition)"),
        }
    }
}

/// Decides, per host, how a replica carries on while its primary is
/// unavailable (see `FallbackPolicy`).
pub(crate) trait OutagePlan: Send + Sync + fmt::Debug {
    /// The plan for `host` now.
    fn plan(&self, host: &HostKey) -> Plan;

    /// From when this replica may send on its own under `plan` (at its
    /// share, as a host's one server, or alone while the others may not
    /// know of it yet) without a replica that still reaches the primary
    /// admitting beside it: once the others know it is cut off. `None`:
    /// at once.
    fn alone_from(&self, plan: Plan) -> Option<tokio::time::Instant>;
}

/// How long after `now` (the time since the Unix epoch on the wall clock,
/// which replicas share up to their clocks' offset) the turn of replica
/// `index` of `n` taking turns in slots of `gap` comes: at once when `now`
/// is at most `tolerance` into one of its slots, else at its next slot's
/// start. Without the tolerance, a send that reached its turn a moment
/// late (a timer's tick, a busy process) waited a whole period for the
/// next, and each replica sent at half its share.
pub(super) fn until_turn(
    gap: Duration,
    n: u32,
    index: u32,
    now: Duration,
    tolerance: Duration,
) -> Duration {
    let Some(Slot {
        since,
        period,
        window,
    }) = slot(gap, n, index, now, tolerance)
    else {
        return Duration::ZERO;
    };
    let wait = if since <= window { 0 } else { period - since };
    Duration::from_micros(u64::try_from(wait).unwrap_or(u64::MAX))
}

/// How much of its turn's window replica `index` has left at `now` (as
/// [`until_turn`] takes them): `None` when `now` is not in the window, all
/// of `tolerance` when there are no slots.
pub(super) fn turn_left(
    gap: Duration,
    n: u32,
    index: u32,
    now: Duration,
    tolerance: Duration,
) -> Option<Duration> {
    let Some(Slot { since, window, .. }) = slot(gap, n, index, now, tolerance) else {
        return Some(tolerance);
    };
    (since <= window)
        .then(|| Duration::from_micros(u64::try_from(window - since).unwrap_or(u64::MAX)))
}

/// Where `now` stands in replica `index`'s slots, in microseconds.
struct Slot {
    /// How long since its last slot began.
    since: u128,
    /// How long from one of its slots to the next.
    period: u128,
    /// How long into a slot a send still takes it: the tolerance, less
    /// than the slot.
    window: u128,
}

/// [`Slot`] at `now`; `None` without slots (no gap, or no replicas).
fn slot(gap: Duration, n: u32, index: u32, now: Duration, tolerance: Duration) -> Option<Slot> {
    let slot = gap.as_micros();
    let period = slot.saturating_mul(u128::from(n));
    if period == 0 {
        return None;
    }
    let now = now.as_micros();
    let start = slot.saturating_mul(u128::from(index)) % period;
    Some(Slot {
        since: (now % period + period - start) % period,
        period,
        window: tolerance.as_micros().min(slot - 1),
    })
}

/// How long after its turn begins a request taking turns may still leave
/// through the primary: a tenth of the gap, at most 10 ms. Replicas still
/// pacing in-process send at their slots' starts, so a send this late in
/// its own slot keeps the shared pace over any interval up to this. `None`
/// without a gap, when there are no slots.
pub(super) fn turn_window(pacing: &Pacing) -> Option<Duration> {
    let gap = pacing.min_delay();
    (!gap.is_zero()).then(|| (gap / 10).min(Duration::from_millis(10)))
}

/// How long before its turn a replica taking turns has its share admit a
/// request (the send then waits for the turn): half a gap, at most 100 ms.
/// Enough that a runtime waking a little late still makes the turn; the
/// share's in-flight room is held no longer than that before the send.
pub(super) fn turn_lead(gap: Duration) -> Duration {
    (gap / 2).min(Duration::from_millis(100))
}

/// Replica `index`'s part of a cap on requests in flight of `cap` that
/// `n` replicas divide: `cap / n`, and one more for the first `cap % n`
/// of them, so that the parts add up to the cap; 0 for the replicas past
/// the cap when it is below `n`. acquire.lua takes the lapsed replicas'
/// parts of a cap the host stated off it the same way.
pub(super) fn stated_share(cap: u32, n: u32, index: u32) -> u32 {
    let n = n.max(1);
    cap / n + u32::from(index < cap % n)
}

/// How soon a deferred acquire asks the primary again.
pub(super) const DEFER_RETRY: Duration = Duration::from_secs(1);

/// The time since the Unix epoch on this process's wall clock, as
/// [`until_turn`] takes it.
pub(super) fn wall_clock() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

#[cfg(feature = "redis")]
/// What a replica's fallback does while Redis is unavailable: how the
/// per-host limits are kept when every replica paces in-process.
///
/// Each replica knows the replicas that were live just before the outage
/// (the registry; see [`RedisLimiter`](crate::RedisLimiter)). With `N` of
/// them:
///
/// | policy | each replica, per host, during the outage | all replicas together |
/// |---|---|---|
/// | `Share` (default) | `min_delay` x N, `quota` / N, in-flight cap / N | within the rate, quota and cap |
/// | `Partition` | one replica (rendezvous hashing) serves the host at the full pacing; the others wait | exact spacing and cap |
/// | `Full` | the full pacing | N x the rate, quota and cap |
///
/// `Share` divides what can be divided. What cannot (an in-flight cap or a
/// quota smaller than N, and serialized mode, whose cap is one request) is
/// partitioned instead, so the limits hold either way. `Share` is the
/// default because it keeps every replica working on every host: nothing
/// waits for Redis, and a replica that died within `lease_ttl` before the outage
/// only costs the others their share of its pace. `Partition` is exact but
/// stalls: the hosts of a replica that died within `lease_ttl` before the
/// outage wait for Redis, and so do the other replicas' requests for a host
/// they do not serve (bounded by their deadline; they ask Redis again once
/// a second). `Full` is each replica alone, as if no other existed: use it
/// only when the replicas never share hosts.
///
/// The same holds when one replica alone loses Redis: it sends on its own
/// (at its share, or as a host's one server) only 2.5 s (plus the
/// tuning's `book_ahead`) after it last sent a renewal of its registry
/// entry, when the others have seen the entry lapse; they keep its share, turns or hosts free until `lease_ttl` after its
/// last renewal,
/// or until it is back. Every outage therefore begins with up to 2.5 s
/// without sends (none with `Full`, or with one replica).
///
/// Edge cases: with one live replica every policy is `Full`. A replica
/// that never saw the registry (it started during the outage) counts
/// [`expected_replicas`](crate::redis::RedisLimiterBuilder::expected_replicas)
/// (default 1). Limits hold from the first send of the outage on: a request
/// another replica had in flight when Redis went away is not visible to
/// the others, and the quota window in which Redis went away can hold the
/// admissions counted in Redis before it plus the shares during it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FallbackPolicy {
    /// Divide the rate, quota and in-flight cap among the live replicas.
    #[default]
    Share,
    /// Serve each host from exactly one live replica.
    Partition,
    /// Every replica at the full limits: N replicas send N times the rate.
    Full,
}

#[cfg(feature = "redis")]
impl FallbackPolicy {
    /// The policy's name, as the crawl's `--fallback` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Share => "share",
            Self::Partition => "partition",
            Self::Full => "full",
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_stated_cap_divides_into_parts_that_add_up_to_it() {
        for n in 1..=9 {
            for cap in 1..=20 {
                let parts: Vec<u32> = (0..n).map(|i| stated_share(cap, n, i)).collect();
                assert_eq!(parts.iter().sum::<u32>(), cap, "{cap} / {n}: {parts:?}");
                let (most, least) = (parts.iter().max().unwrap(), parts.iter().min().unwrap());
                assert!(most - least <= 1, "{cap} / {n}: {parts:?}");
            }
        }
        assert_eq!(
            (0..3).map(|i| stated_share(2, 3, i)).collect::<Vec<_>>(),
            [1, 1, 0]
        );
        assert_eq!(
            (0..3).map(|i| stated_share(5, 3, i)).collect::<Vec<_>>(),
            [2, 2, 1]
        );
    }

    #[test]
    fn turns_come_at_the_start_of_each_replicas_slots() {
        // Three replicas, 100 ms slots: replica 1 owns [100, 200) of each
        // 300 ms period.
        let gap = 100 * MS;
        let exact = Duration::ZERO;
        assert_eq!(until_turn(gap, 3, 1, 900 * MS, exact), 100 * MS);
        assert_eq!(until_turn(gap, 3, 1, 1_000 * MS, exact), Duration::ZERO);
        assert_eq!(until_turn(gap, 3, 1, 1_001 * MS, exact), 299 * MS);
        assert_eq!(until_turn(gap, 3, 0, 950 * MS, exact), 250 * MS);
        // No gap, or nobody to take turns with.
        assert_eq!(
            until_turn(Duration::ZERO, 3, 1, 1_000 * MS, exact),
            Duration::ZERO
        );
        assert_eq!(until_turn(gap, 0, 0, 1_000 * MS, exact), Duration::ZERO);
    }

    /// Regression: a send a moment into its turn waited a whole period.
    #[test]
    fn a_send_a_moment_into_its_turn_goes_at_once() {
        let gap = 100 * MS;
        let late = 10 * MS;
        let micro = Duration::from_micros(1);
        assert_eq!(
            until_turn(gap, 3, 1, 1_000 * MS + micro, late),
            Duration::ZERO
        );
        assert_eq!(until_turn(gap, 3, 1, 1_010 * MS, late), Duration::ZERO);
        assert_eq!(
            until_turn(gap, 3, 1, 1_010 * MS + micro, late),
            290 * MS - micro
        );
        // Never into the next replica's slot, whatever the tolerance.
        assert_eq!(until_turn(gap, 3, 1, 1_099 * MS, gap * 5), Duration::ZERO);
        assert_eq!(until_turn(gap, 3, 1, 1_100 * MS, gap * 5), 200 * MS);
    }

    /// What is left of a turn's window is what a request taking it may
    /// spend before it leaves.
    #[test]
    fn a_turns_window_is_left_until_the_tolerance() {
        let gap = 100 * MS;
        let late = 10 * MS;
        let micro = Duration::from_micros(1);
        assert_eq!(
            turn_left(gap, 3, 1, 1_000 * MS + micro, late),
            Some(late - micro)
        );
        assert_eq!(turn_left(gap, 3, 1, 1_010 * MS, late), Some(Duration::ZERO));
        assert_eq!(turn_left(gap, 3, 1, 1_010 * MS + micro, late), None);
        assert_eq!(turn_left(gap, 3, 1, 990 * MS, late), None);
        // No slots: the whole tolerance.
        assert_eq!(
            turn_left(Duration::ZERO, 3, 1, 1_005 * MS, late),
            Some(late)
        );
    }

    proptest! {
        /// Whatever the clock, each replica's next turn is within one period,
        /// starts on one of its own slots, and no two replicas' turns start
        /// closer than a slot apart.
        #[test]
        fn the_replicas_turns_interleave_a_slot_apart(
            gap_us in 1u64..1_000_000,
            n in 1u32..16,
            now_us in 0u64..10_000_000_000_000,
        ) {
            let (gap, now) = (Duration::from_micros(gap_us), Duration::from_micros(now_us));
            let period = gap * n;
            let mut starts: Vec<u128> = (0..n)
                .map(|index| {
                    let wait = until_turn(gap, n, index, now, Duration::ZERO);
                    assert!(wait < period, "{wait:?} >= {period:?}");
                    let start = (now + wait).as_micros();
                    // On the replica's own slot of its period.
                    assert_eq!(start % period.as_micros(), u128::from(index) * gap.as_micros());
                    start
                })
                .collect();
            starts.sort_unstable();
            for pair in starts.windows(2) {
                prop_assert!(pair[1] - pair[0] >= gap.as_micros());
            }
        }
    }
}

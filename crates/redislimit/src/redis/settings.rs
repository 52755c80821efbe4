//! What a `RedisLimiter` was built with, validated: its mode per policy
//! ([`Mode`]), what its scripts are told of each policy ([`Args`]), and its
//! timing ([`Settings`]).

use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

use super::keys::RedisKeys;
use super::roster::Turns;
use crate::fallback::FallbackPolicy;
use crate::{HostKey, KeyBy, Policies};

/// How a policy's requests to one host are admitted across the replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// One request at a time, each `min_delay` after the previous one's
    /// completion.
    Serialized,
    /// At most this many in flight, sends `min_delay` apart.
    Lease(NonZeroU32),
}

impl Mode {
    /// The mode of a cross-replica cap as the builder takes it (0:
    /// serialized).
    pub(super) fn from_cap(cap: u32) -> Self {
        NonZeroU32::new(cap).map_or(Self::Serialized, Self::Lease)
    }

    /// The cap as the scripts take it: 0 in serialized mode.
    pub(super) fn script_cap(self) -> u32 {
        match self {
            Self::Serialized => 0,
            Self::Lease(cap) => cap.get(),
        }
    }

    /// How many requests may be in flight at once: one in serialized mode.
    pub(super) fn in_flight(self) -> u32 {
        match self {
            Self::Serialized => 1,
            Self::Lease(cap) => cap.get(),
        }
    }
}

/// What the scripts are told of one policy's pacing, and of one request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Args {
    pub(super) mode: Mode,
    pub(super) min_delay_us: u64,
    pub(super) quota: u32,
    pub(super) window_us: u64,
    /// The longest wait this policy can ask for.
    pub(super) max_wait_us: u64,
    /// The weight of the request (1 in the policy's own arguments): how
    /// many members it is in the leases and admits sets.
    pub(super) weight: u32,
    /// 0 when the quota keeps each admission; else the width of its
    /// buckets (see [`quota_buckets`]).
    pub(super) bucket_us: u64,
    /// When the request was admitted, on the Redis clock (0 until it is,
    /// or when unknown): where a bucketed quota counted it (its slot plus
    /// its room).
    pub(super) admitted_us: u64,
    /// How late after its slot its send may leave (see `lateness.rs`):
    /// the room the acquire asks Redis to keep; 0 where lateness cannot
    /// bring a send too close to another (see [`Args::sends_late`]).
    pub(super) room_us: u64,
    /// How long after the wait it was told a waiter of weight 1 will have
    /// asked again at the latest (the retry, jitter, slot margin and
    /// [`LINE_SLACK`]): it keeps its place in the waiting line across
    /// replicas until then, or longer if it asks again before another
    /// waiter finds the place lapsed.
    pub(super) patience_us: u64,
    /// How many replicas divide the host's limits when some of them lapsed
    /// from the registry and send on their own (0: none did; see
    /// `registry::Lapse`).
    pub(super) shun_n: u32,
    /// The turns of those replicas among `shun_n`: no admission comes
    /// within `min_delay` (less a turn's tolerance) of one.
    pub(super) shun_turns: Turns,
}

impl Args {
    /// Whether a send that leaves late can come too close to the next one
    /// (a gap between sends, or a quota's window); in serialized mode the
    /// gap counts from each completion.
    pub(super) fn sends_late(&self) -> bool {
        (matches!(self.mode, Mode::Lease(_)) && self.min_delay_us > 0) || self.quota > 0
    }
}

/// Slack for a waiter that asks again late (its process busy) before it
/// loses its place in the waiting line; also about how long a waiter that
/// died in line holds up the others.
pub(super) const LINE_SLACK: Duration = Duration::from_millis(100);

/// Quotas up to this many admissions per window keep each admission in
/// Redis (a sorted set of tokens, about 60 bytes each); larger ones keep
/// [`QUOTA_BUCKETS`] counters per window instead, bounded whatever the
/// quota.
pub(super) const EXACT_QUOTA_MAX: u32 = 16;

/// How many buckets a window of a large quota is counted in.
pub(super) const QUOTA_BUCKETS: u64 = 32;

/// The bucket width (µs) of a quota of `quota` per `window_us`, or 0 when
/// each admission is kept.
pub(super) fn quota_buckets(quota: u32, window_us: u64) -> u64 {
    if quota > EXACT_QUOTA_MAX {
        window_us.div_ceil(QUOTA_BUCKETS).max(1)
    } else {
        0
    }
}

/// A `RedisLimiter`'s settings, validated by its builder.
#[derive(Debug)]
pub(super) struct Settings {
    pub(super) prefix: String,
    pub(super) scope: String,
    pub(super) policies: Policies,
    /// The limiter's own cross-replica cap (rules may set their own); 0:
    /// serialized.
    pub(super) cluster_concurrency: u32,
    pub(super) lease_ttl: Duration,
    /// `lease_ttl` in microseconds, as the scripts take it.
    pub(super) lease_ttl_us: u64,
    pub(super) concurrency_retry: Duration,
    /// How far ahead of its slot a waiter may be booked.
    pub(super) book_ahead: Duration,
    /// How long after its host's slot a waiter aims to reach Redis.
    pub(super) slot_margin: Duration,
    /// How late an admission may reach its caller beyond its room and
    /// still be sent.
    pub(super) max_lateness: Duration,
    /// What its fallback does while Redis is unavailable.
    pub(super) fallback_policy: FallbackPolicy,
    /// How many replicas to assume when the registry was never seen.
    pub(super) expected_replicas: u32,
    /// The script arguments of each policy (see [`Policies::index`]).
    pub(super) args: Box<[Args]>,
    /// The timing as given (the concurrency retry unresolved), for a
    /// limiter rebuilt with other policies.
    pub(super) tuning: crate::redis::Tuning,
    /// The version of the policies published to the scope these are; 0
    /// when they were not read from there.
    pub(super) policy_version: u64,
}

impl Settings {
    /// The keys of `host`'s state (under its key), with the waiting line of
    /// its rule when hosts under different rules can share a key.
    pub(super) fn keys(&self, host: &HostKey) -> RedisKeys {
        let key = self.policies.key(host);
        let keys = RedisKeys::new(&self.prefix, &self.scope, &key);
        if self.policies.key_by() == KeyBy::Host {
            return keys;
        }
        match self.policies.index(host) {
            0 => keys.in_lane(""),
            i => keys.in_lane(self.policies.rules()[i - 1].pattern()),
        }
    }

    /// How far ahead an acquire under policy `policy` may be booked: not at
    /// all when its pacing has jitter (which is there to spread sends out,
    /// not to hit slots), nor past the caller's deadline.
    pub(super) fn horizon(&self, policy: usize, deadline: Option<Instant>) -> Duration {
        if !self.policies.at(policy).jitter().is_zero() {
            return Duration::ZERO;
        }
        match deadline {
            Some(deadline) => self
                .book_ahead
                .min(deadline.saturating_duration_since(Instant::now())),
            None => self.book_ahead,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_is_named_where_a_zero_cap_was() {
        assert_eq!(Mode::from_cap(0), Mode::Serialized);
        assert_eq!(Mode::Serialized.script_cap(), 0);
        assert_eq!(Mode::Serialized.in_flight(), 1);
        let lease = Mode::from_cap(4);
        assert_eq!((lease.script_cap(), lease.in_flight()), (4, 4));
    }
}

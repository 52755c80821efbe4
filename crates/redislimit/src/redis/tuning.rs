//! `Tuning`: the timing of one process's acquires through Redis, beside
//! the pacing every replica agrees on.

use std::time::Duration;

/// How this process times its calls to Redis and its sends: how soon it
/// asks again when a host's cap is taken, how far ahead of its slot it may
/// be booked, how long after its slot it aims to reach Redis, and how late
/// an admission may reach it beyond the room kept for its lateness. Each
/// has a default that suits most crawlers and API clients; none is part of
/// the configuration agreement (replicas may differ in them).
///
/// ```
/// use std::time::Duration;
/// use redislimit::Tuning;
///
/// let tuning = Tuning::default()
///     .with_book_ahead(Duration::from_millis(10))
///     .with_slot_margin(Duration::from_micros(200));
/// # let _ = tuning;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    pub(super) concurrency_retry: Option<Duration>,
    pub(super) book_ahead: Duration,
    pub(super) slot_margin: Duration,
    pub(super) max_lateness: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            concurrency_retry: None,
            book_ahead: Self::DEFAULT_BOOK_AHEAD,
            slot_margin: Self::DEFAULT_SLOT_MARGIN,
            max_lateness: Self::DEFAULT_MAX_LATENESS,
        }
    }
}

impl Tuning {
    /// The longest default retry interval while a host's in-flight cap is
    /// taken (see [`with_concurrency_retry`](Self::with_concurrency_retry)).
    pub const DEFAULT_CONCURRENCY_RETRY: Duration = Duration::from_millis(50);
    /// How far ahead of its slot a waiter is booked by default (see
    /// [`with_book_ahead`](Self::with_book_ahead)).
    pub const DEFAULT_BOOK_AHEAD: Duration = Duration::ZERO;
    /// How long after its host's slot a waiter aims to reach Redis by
    /// default (see [`with_slot_margin`](Self::with_slot_margin)).
    pub const DEFAULT_SLOT_MARGIN: Duration = Duration::from_micros(100);
    /// How late an admission may reach its caller beyond its room and still
    /// be sent, by default (see [`with_max_lateness`](Self::with_max_lateness)).
    pub const DEFAULT_MAX_LATENESS: Duration = Duration::from_millis(2);

    /// How soon to ask again when the host's in-flight cap is taken
    /// (plus jitter). A slot frees on another replica's release, which
    /// nothing announces, so this is a short retry.
    ///
    /// The default is 50 ms, or `min_delay` when that is shorter: in
    /// serialized mode no send can follow the release it waits for by less
    /// than `min_delay`, so a waiter that asks at least that often is
    /// admitted at the first allowed instant and the host's pace loses
    /// nothing to polling.
    pub fn with_concurrency_retry(mut self, retry: Duration) -> Self {
        self.concurrency_retry = Some(retry);
        self
    }

    /// How far ahead of its slot a waiter may be booked (default zero:
    /// only when the host is free). A waiter that asks Redis within this
    /// of its host's next allowed send is booked for that instant at once
    /// and sends at it, timed in process to a fraction of a millisecond.
    /// The booking counts (in flight, in the quota, for the gap) from its
    /// slot; an acquire dropped before it hands it back. Hosts whose
    /// pacing has jitter are never booked ahead. At
    /// most `lease_ttl`.
    ///
    /// Without it a waiter asks again so as to reach Redis
    /// [`slot_margin`](Self::with_slot_margin) after its slot, and is admitted
    /// then. A booked waiter loses nothing of the pace, but the slots are
    /// fixed in Redis: a send that leaves late because its process was
    /// busy (a millisecond or more on an overloaded machine) is that much
    /// closer to the next one. Book ahead when throughput matters more
    /// than each gap, as against an API's token bucket; leave it off
    /// against servers that judge every gap, as nginx's `limit_req`
    /// without a burst does. Make it cover a round trip to Redis and a
    /// timer tick with room to spare (10 ms, say).
    pub fn with_book_ahead(mut self, ahead: Duration) -> Self {
        self.book_ahead = ahead;
        self
    }

    /// How long after its host's next allowed send a waiter aims to reach
    /// Redis (default 100 µs). A waiter told to wait asks again a measured
    /// round trip before its slot plus this margin, timed in process to a
    /// fraction of a millisecond, and is admitted as its call arrives; the
    /// pace loses about this much per admission (at 200 requests a second,
    /// 100 µs gets about 95 % of the pace, 1 ms about 84 %).
    ///
    /// Sends that leave late are not the margin's to absorb: an admission
    /// that reaches a busy process late is covered by the room its acquire
    /// kept for that, or handed back (see
    /// [`max_lateness`](Self::with_max_lateness)). A wider margin only keeps
    /// the calls of waiters that run late (a timer woken late, a round
    /// trip longer than measured) from reaching Redis before their slot
    /// and being told to wait again. Measured in the repository's
    /// docs/PERFORMANCE.md.
    pub fn with_slot_margin(mut self, margin: Duration) -> Self {
        self.slot_margin = margin;
        self
    }

    /// How late, beyond the room its acquire kept for this process's
    /// lateness, an admission may reach its caller and still be sent
    /// (default 2 ms; [`Duration::MAX`]: however late, with no room kept).
    /// Redis admits a request at or after its slot, but the reply can
    /// reach a busy process late, and a request that then leaves late is
    /// that much closer to the next one, which another replica may send on
    /// time. Where that matters (a `min_delay` in lease mode, or a quota),
    /// each acquire asks Redis to keep room after its slot for the lateness
    /// this process's admissions met lately (see "Late admissions" on
    /// [`RedisLimiter`](crate::RedisLimiter)), and an admission later than its room and this is
    /// handed back at once, as a request never sent, and asked for again
    /// with room for twice its lateness; the upstream then sees no gap more
    /// than this short of `min_delay` from lateness on the way to the
    /// caller (a request can still leave late after its permit is granted).
    ///
    /// Lateness is reckoned on the Redis clock, whose offset from this
    /// process's monotonic clock each admission bounds: it is never
    /// understated, and overstated by at most the quickest round trip of
    /// the last 10-20 s (a Redis far away is late by its way back: a replica
    /// nearer to it would send sooner). For up to 20 s after the Redis clock
    /// steps forward it is understated by the step; under a Cluster whose
    /// clocks disagree, it is understated for the nodes ahead. The
    /// admission handed back leaves the waiting line across replicas: it
    /// had its turn, and asks again behind those waiting. Every late
    /// admission is reported to [`Hooks::on_late_admission`](crate::Hooks::on_late_admission). Serialized
    /// mode counts the gap from each completion, which lateness does not
    /// shorten; admissions booked ahead (see [`book_ahead`](Self::with_book_ahead))
    /// keep their slots. Not part of the configuration agreement (nor is
    /// [`slot_margin`](Self::with_slot_margin)): replicas may differ in it, as it
    /// shapes only this process's sends.
    pub fn with_max_lateness(mut self, lateness: Duration) -> Self {
        self.max_lateness = lateness;
        self
    }
}

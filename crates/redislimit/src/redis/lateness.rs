//! Late admissions: how late this process's sends leave after their slots,
//! the room each admission asks Redis to keep for that, and what an
//! admission that reaches its caller later than its room becomes.
//!
//! Redis admits a request at its slot and keeps the next send `min_delay`
//! after it; a busy process (a crawl over thousands of hosts on two cores)
//! reads the answer milliseconds later and sends that much closer to the
//! next one, which another replica may send on time. So each acquire tells
//! Redis how late this process's sends have been leaving lately (its
//! *room*): the admission counts as sent at the end of its room, for the
//! gap after it in lease mode and for the quota. An admission that arrives
//! within its room (and `max_lateness`) is sent; a later one is handed back
//! unsent and asked for again, with room for at least twice the lateness
//! it met, so a process whose lateness grows is handed back a few times
//! and then sends, never breaking the gap and never handed back forever.
//! A hand-back costs two script calls and a turn in the host's line, and
//! the room costs the host a little of its pace, only while this process
//! is late.
//!
//! The decisions are plain functions of their inputs ([`verdict`],
//! [`Room::at`], [`LateLog::note`]); the limiter only measures lateness
//! (see [`RedisClock`](super::clock::RedisClock)) and acts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// How long the room takes to halve once sends are on time again.
const HALF_LIFE: Duration = Duration::from_secs(2);

/// How often a late process is reported, at most.
pub(super) const REPORT_EVERY: Duration = Duration::from_secs(60);

/// The room this process asks for: the latest lateness it met, decaying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Room {
    us: u64,
    at: Instant,
}

impl Room {
    /// No room, as of `now`.
    pub(super) fn none(now: Instant) -> Self {
        Self { us: 0, at: now }
    }

    /// The room at `now`: what was set, halved every [`HALF_LIFE`] since
    /// (never more than was set; zero once below a microsecond).
    pub(super) fn at(self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at);
        let halvings = elapsed.as_secs_f64() / HALF_LIFE.as_secs_f64();
        let us = (self.us as f64 * 0.5f64.powf(halvings)).floor();
        Duration::from_micros(us as u64)
    }

    /// After an admission that reached its caller `late` at `now`: at
    /// least that much room (and never less than what is left of it), at
    /// most `most`.
    pub(super) fn widened(self, late: Duration, now: Instant, most: Duration) -> Self {
        let room = self.at(now).max(late).min(most);
        Self {
            us: u64::try_from(room.as_micros()).unwrap_or(u64::MAX),
            at: now,
        }
    }
}

/// What an admission that reached its caller does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Sent: it arrived within its room and `max_lateness`.
    Send,
    /// Handed back unsent, and asked for again with at least this room.
    HandBack {
        /// Room for twice the lateness met (at most the most room).
        room: Duration,
    },
}

/// What an admission booked with `room` and reaching its caller `late`
/// after its slot does, when a send may leave at most `max_lateness`
/// beyond its room and no room is wider than `most`.
pub(super) fn verdict(
    late: Duration,
    room: Duration,
    max_lateness: Duration,
    most: Duration,
) -> Verdict {
    if late <= room.saturating_add(max_lateness) {
        Verdict::Send
    } else {
        Verdict::HandBack {
            room: late.saturating_mul(2).min(most),
        }
    }
}

/// One limiter's room, shared by its acquires.
#[derive(Debug)]
pub(super) struct Lateness {
    room: Mutex<Room>,
    /// The widest room an acquire asks for.
    most: Duration,
    log: LateLog,
    /// Late admissions over the limiter's life, and how many of them were
    /// handed back.
    late: AtomicU64,
    handed_back: AtomicU64,
}

impl Lateness {
    /// No room yet; never more than `most`.
    pub(super) fn new(most: Duration) -> Self {
        Self {
            room: Mutex::new(Room::none(Instant::now())),
            most,
            log: LateLog::default(),
            late: AtomicU64::new(0),
            handed_back: AtomicU64::new(0),
        }
    }

    /// The widest room an acquire asks for.
    pub(super) fn most(&self) -> Duration {
        self.most
    }

    /// The room to ask for now.
    pub(super) fn room(&self) -> Duration {
        self.lock().at(Instant::now())
    }

    /// An admission reached its caller `late` (beyond the quickest round
    /// trip): the room widens to it.
    pub(super) fn seen(&self, late: Duration) {
        let now = Instant::now();
        let mut room = self.lock();
        *room = room.widened(late, now, self.most);
    }

    /// Records an admission of `key` that reached its caller `late`; a
    /// report to log when one is due (see [`LateLog`]).
    pub(super) fn note(&self, key: &str, late: Duration, handed_back: bool) -> Option<LateReport> {
        self.late.fetch_add(1, Ordering::Relaxed);
        self.handed_back
            .fetch_add(u64::from(handed_back), Ordering::Relaxed);
        self.log.note(key, late, handed_back, Instant::now())
    }

    /// Late admissions over the limiter's life, and how many of them were
    /// handed back.
    pub(super) fn totals(&self) -> (u64, u64) {
        (
            self.late.load(Ordering::Relaxed),
            self.handed_back.load(Ordering::Relaxed),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Room> {
        self.room.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Late admissions since the last report: the first one is reported at
/// once, then at most one report every [`REPORT_EVERY`], with counts, so a
/// busy process says so without a line per host and admission.
#[derive(Debug, Default)]
pub(super) struct LateLog {
    window: Mutex<Option<Window>>,
}

/// What a [`LateLog`] counted since its last report.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Window {
    /// When the last report was made.
    since: Instant,
    late: u64,
    handed_back: u64,
    worst: Duration,
    worst_key: String,
}

/// One report of late admissions, to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LateReport {
    /// Admissions that reached their caller late, this one included.
    pub(super) late: u64,
    /// How many of them were handed back.
    pub(super) handed_back: u64,
    /// The latest of them, and its host.
    pub(super) worst: Duration,
    pub(super) worst_key: String,
    /// Over how long they were counted (zero for the first report).
    pub(super) over: Duration,
}

impl LateLog {
    /// Counts an admission of `key` that reached its caller `late` at
    /// `now`; the report due, if one is: the first late admission, or the
    /// first after [`REPORT_EVERY`] since the last report.
    pub(super) fn note(
        &self,
        key: &str,
        late: Duration,
        handed_back: bool,
        now: Instant,
    ) -> Option<LateReport> {
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(w) = &mut *window else {
            // The first one is reported at once.
            *window = Some(Window::empty(now));
            return Some(LateReport {
                late: 1,
                handed_back: u64::from(handed_back),
                worst: late,
                worst_key: key.to_owned(),
                over: Duration::ZERO,
            });
        };
        w.late += 1;
        w.handed_back += u64::from(handed_back);
        if late >= w.worst {
            w.worst = late;
            if w.worst_key != key {
                w.worst_key = key.to_owned();
            }
        }
        let over = now.saturating_duration_since(w.since);
        if over < REPORT_EVERY {
            return None;
        }
        let done = std::mem::replace(w, Window::empty(now));
        Some(LateReport {
            late: done.late,
            handed_back: done.handed_back,
            worst: done.worst,
            worst_key: done.worst_key,
            over,
        })
    }
}

impl Window {
    fn empty(since: Instant) -> Self {
        Self {
            since,
            late: 0,
            handed_back: 0,
            worst: Duration::ZERO,
            worst_key: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_admission_within_its_room_is_sent_and_a_later_one_handed_back() {
        let most = Duration::from_secs(1);
        assert_eq!(verdict(2 * MS, Duration::ZERO, 2 * MS, most), Verdict::Send);
        assert_eq!(
            verdict(3 * MS, Duration::ZERO, 2 * MS, most),
            Verdict::HandBack { room: 6 * MS }
        );
        assert_eq!(verdict(32 * MS, 30 * MS, 2 * MS, most), Verdict::Send);
        assert_eq!(
            verdict(40 * MS, 30 * MS, 2 * MS, most),
            Verdict::HandBack { room: 80 * MS }
        );
        // Never wider than the most.
        assert_eq!(
            verdict(Duration::from_secs(3), 30 * MS, 2 * MS, most),
            Verdict::HandBack { room: most }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_room_follows_the_latest_lateness_and_halves_every_two_seconds() {
        let most = Duration::from_secs(1);
        let start = Instant::now();
        let room = Room::none(start).widened(40 * MS, start, most);
        assert_eq!(room.at(start), 40 * MS);
        assert_eq!(room.at(start + HALF_LIFE), 20 * MS);
        assert_eq!(room.at(start + 2 * HALF_LIFE), 10 * MS);
        // A smaller lateness does not narrow what is left; a larger widens.
        let later = start + HALF_LIFE;
        assert_eq!(room.widened(5 * MS, later, most).at(later), 20 * MS);
        assert_eq!(room.widened(70 * MS, later, most).at(later), 70 * MS);
        assert_eq!(room.widened(5 * MS, later, 3 * MS).at(later), 3 * MS);
        // Long after, nothing is left.
        assert_eq!(room.at(start + Duration::from_secs(120)), Duration::ZERO);
    }

    proptest! {
        /// Whatever the lateness, an admission is sent at most once it has
        /// been handed back with the room its verdict asked for, as long as
        /// the lateness stays within the most room: never handed back forever.
        #[test]
        fn room_asked_after_a_hand_back_covers_the_lateness(
            late_us in 0u64..5_000_000,
            room_us in 0u64..5_000_000,
            max_us in 1u64..10_000,
        ) {
            let most = Duration::from_secs(10);
            let (late, room, max) = (
                Duration::from_micros(late_us),
                Duration::from_micros(room_us),
                Duration::from_micros(max_us),
            );
            match verdict(late, room, max, most) {
                Verdict::Send => prop_assert!(late <= room + max),
                Verdict::HandBack { room: again } => {
                    prop_assert!(late > room + max);
                    prop_assert_eq!(verdict(late, again, max, most), Verdict::Send);
                }
            }
        }

        /// The room never grows without a lateness that asks for it, and
        /// never shrinks faster than it halves every two seconds.
        #[test]
        fn the_room_decays_no_faster_than_its_half_life(
            set_us in 0u64..1_000_000,
            after_ms in 0u64..20_000,
        ) {
            let start = Instant::now();
            let room = Room::none(start).widened(
                Duration::from_micros(set_us),
                start,
                Duration::from_secs(10),
            );
            let now = start + Duration::from_millis(after_ms);
            let left = room.at(now).as_micros() as f64;
            let halvings = after_ms as f64 / HALF_LIFE.as_millis() as f64;
            let floor = (set_us as f64 * 0.5f64.powf(halvings)).floor() - 1.0;
            prop_assert!(left <= set_us as f64);
            prop_assert!(left >= floor, "{left} < {floor}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_process_is_reported_at_once_then_once_a_minute_with_counts() {
        let log = LateLog::default();
        let start = Instant::now();
        let first = log.note("a.test", 5 * MS, false, start).unwrap();
        assert_eq!(
            (first.late, first.handed_back, first.worst, first.over),
            (1, 0, 5 * MS, Duration::ZERO)
        );
        assert_eq!(first.worst_key, "a.test");
        // Thousands of hosts late within the minute: nothing more is said ...
        for i in 0..5_000u64 {
            let at = start + Duration::from_millis(i * 10);
            let host = format!("h{i}.test");
            assert_eq!(log.note(&host, MS * (i % 40) as u32, i % 3 == 0, at), None);
        }
        // ... until a minute after the first report, with what it counted.
        let at = start + REPORT_EVERY;
        let report = log.note("b.test", 7 * MS, true, at).unwrap();
        assert_eq!(report.late, 5_001);
        assert_eq!(report.handed_back, 1_667 + 1);
        assert_eq!(report.worst, 39 * MS);
        assert_eq!(report.worst_key, "h4999.test");
        assert_eq!(report.over, REPORT_EVERY);
        // And the next minute starts empty.
        assert_eq!(log.note("c.test", MS, false, at + MS), None);
        let next = log.note("c.test", MS, false, at + REPORT_EVERY).unwrap();
        assert_eq!((next.late, next.handed_back), (2, 0));
    }
}

//! The pacing state of one host and the pure decisions made on it.
//!
//! Nothing here reads a clock or waits: every function takes `now`, so the
//! arithmetic is tested directly (and property-tested) without a runtime.
//! The Redis scripts make the same decisions on the same state shape.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::pacing::after;
use crate::{Pacing, Spacing};

/// What the head of a host's queue may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Send now.
    Admit,
    /// Nothing may be sent before this instant.
    WaitUntil(Instant),
    /// `max_concurrent` requests are in flight: wait for a release.
    Full,
}

/// What one host's pacing remembers: inline what every admission reads
/// and writes, out of line ([`Rare`]) what only quotas, recorded sends and
/// penalties need, so that a host paced by a gap or a cap alone (most of
/// a crawl's) takes a few dozen bytes in its map and no allocation.
#[derive(Debug, Clone)]
pub(crate) struct HostState {
    /// Requests admitted and not yet released, by weight.
    in_flight: u32,
    /// No send before this: the latest of previous send + `min_delay`,
    /// latest completion + `min_delay` and any penalty. Only moves forward.
    ready_at: Instant,
    /// Counts changes, so an undo knows whether its admission was the last.
    epoch: u64,
    /// Allocated on the first quota record, recorded send or penalty.
    rare: Option<Box<Rare>>,
}

/// The part of a [`HostState`] few hosts need.
#[derive(Debug, Clone, Default)]
struct Rare {
    /// Admission instants, oldest first, one per unit of weight: those
    /// still inside the quota window, and perhaps older ones (dropped at
    /// the next admission; only the `quota` newest ever decide).
    admissions: VecDeque<Instant>,
    /// No request recorded as sent ([`HostState::try_send`]) may leave
    /// before this: the latest recorded send + `min_delay` (none before
    /// the first).
    sent_gap_until: Option<Instant>,
    /// The latest send recorded by [`HostState::try_send`].
    last_sent: Option<Instant>,
    /// The end of the longest penalty so far (for introspection).
    held_until: Option<Instant>,
    /// From when the response bytes charged so far fit in the host's
    /// `max_bytes_per_sec` (see [`HostState::charge`]).
    bytes_free: Option<Instant>,
    /// A cap on requests in flight the host stated, and until when it
    /// holds (see [`HostState::state_cap`]).
    stated_cap: Option<(u32, Instant)>,
}

/// The quota records of a host that has none.
static NO_ADMISSIONS: VecDeque<Instant> = VecDeque::new();

/// What an admission changed, so that it can be taken back.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    at: Instant,
    /// Its weight: slots in flight and quota records.
    weight: u32,
    ready_before: Instant,
    epoch: u64,
    /// When its send was recorded (and the epoch that made), with what
    /// the record replaced: out of line, as only an admission that awaited
    /// a shared limiter records its send, and every permit holds this.
    sent: Option<Box<(Instant, u64, Unsent)>>,
}

impl Admission {
    /// Its weight.
    pub(crate) fn weight(&self) -> u32 {
        self.weight
    }
}

/// The send record of a host before [`HostState::try_send`] changed it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unsent {
    last_sent: Option<Instant>,
    sent_gap_until: Option<Instant>,
    ready_at: Instant,
}

impl HostState {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            in_flight: 0,
            ready_at: now,
            epoch: 0,
            rare: None,
        }
    }

    /// The quota records (see [`Rare::admissions`]).
    fn admissions(&self) -> &VecDeque<Instant> {
        self.rare.as_ref().map_or(&NO_ADMISSIONS, |r| &r.admissions)
    }

    /// The out-of-line part, allocated on first use.
    fn rare_mut(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// When the longest penalty so far ends; `None` if never penalized.
    pub(crate) fn held_until(&self) -> Option<Instant> {
        self.rare.as_ref().and_then(|r| r.held_until)
    }

    /// The latest send recorded by [`try_send`](Self::try_send).
    pub(crate) fn last_sent(&self) -> Option<Instant> {
        self.rare.as_ref().and_then(|r| r.last_sent)
    }

    /// The cap on requests in flight the host stated, and until when it
    /// holds (it may have lapsed).
    pub(crate) fn stated_cap(&self) -> Option<(u32, Instant)> {
        self.rare.as_ref().and_then(|r| r.stated_cap)
    }

    /// Requests in flight, by weight.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The earliest instant the next send of `weight` may happen,
    /// concurrency aside.
    pub(crate) fn next_send(&self, pacing: &Pacing, weight: u32) -> Instant {
        let quota = pacing.quota() as usize;
        // Room for `weight` more once at most `quota - weight` records are
        // left inside the window: once the newest record beyond those has
        // left it, at `record + window`.
        let keep = quota.saturating_sub(weight as usize);
        let admissions = self.admissions();
        match admissions.len().checked_sub(keep + 1) {
            Some(i) if quota > 0 => self.ready_at.max(after(admissions[i], pacing.window())),
            _ => self.ready_at,
        }
    }

    /// What a request of `weight` may do at `now`.
    pub(crate) fn decide(&self, now: Instant, pacing: &Pacing, weight: u32) -> Decision {
        if !self.fits(now, pacing, weight) {
            return Decision::Full;
        }
        let at = self.next_send(pacing, weight);
        if at > now {
            Decision::WaitUntil(at)
        } else {
            Decision::Admit
        }
    }

    /// Whether `weight` more fit beside the requests in flight.
    pub(crate) fn fits(&self, now: Instant, pacing: &Pacing, weight: u32) -> bool {
        self.cap(now, pacing, weight).saturating_sub(self.in_flight) >= weight
    }

    /// The cap on requests in flight at `now` for a request of `weight`:
    /// the pacing's, lowered by one the host stated while that holds; a
    /// request heavier than the stated cap goes alone.
    fn cap(&self, now: Instant, pacing: &Pacing, weight: u32) -> u32 {
        let cap = pacing.max_concurrent();
        match self.rare.as_ref().and_then(|r| r.stated_cap) {
            Some((stated, until)) if until > now && stated < cap => stated.max(weight),
            _ => cap,
        }
    }

    /// Caps the host's requests in flight at `cap` (at least 1) until
    /// `now + window`, as the host stated; the latest statement replaces
    /// any earlier one. Never raises the pacing's own cap.
    pub(crate) fn state_cap(&mut self, now: Instant, cap: u32, window: Duration) {
        self.epoch = self.epoch.wrapping_add(1);
        self.rare_mut().stated_cap = Some((cap.max(1), after(now, window)));
    }

    /// The earliest a request with `ahead` others in line before it could
    /// be sent: a lower bound, used to refuse hopeless deadlines at once.
    pub(crate) fn earliest_for(&self, now: Instant, ahead: usize, pacing: &Pacing) -> Instant {
        let spacing = pacing
            .min_delay()
            .saturating_mul(u32::try_from(ahead).unwrap_or(u32::MAX));
        after(self.next_send(pacing, 1).max(now), spacing)
    }

    /// Records an admission of `weight` at `now`.
    pub(crate) fn admit(&mut self, now: Instant, pacing: &Pacing, weight: u32) -> Admission {
        let admission = Admission {
            at: now,
            weight,
            ready_before: self.ready_at,
            epoch: self.epoch.wrapping_add(1),
            sent: None,
        };
        self.epoch = admission.epoch;
        self.in_flight = self.in_flight.saturating_add(weight);
        self.ready_at = self.ready_at.max(after(now, pacing.min_delay()));
        if pacing.quota() > 0 {
            let admissions = &mut self.rare_mut().admissions;
            // Admissions that left the window can no longer matter.
            while let Some(&oldest) = admissions.front()
                && after(oldest, pacing.window()) <= now
            {
                admissions.pop_front();
            }
            admissions.extend(std::iter::repeat_n(now, weight as usize));
        }
        admission
    }

    /// Takes back an admission whose request was never sent: it no longer
    /// counts in flight or in the quota, and the gap it opened closes again
    /// unless something happened on this host since.
    ///
    /// A send recorded by [`try_send`](Self::try_send) is taken back the
    /// same way: unless another admission, send, completion or penalty was
    /// recorded since, the host is as it was before the send was recorded.
    pub(crate) fn undo(&mut self, admission: &Admission) {
        self.in_flight = self.in_flight.saturating_sub(admission.weight);
        let recorded_at = admission
            .sent
            .as_deref()
            .map_or(admission.at, |(at, ..)| *at);
        self.forget(recorded_at, admission.weight);
        match admission.sent.as_deref() {
            Some((_, epoch, before)) if self.epoch == *epoch => {
                let rare = self.rare_mut();
                rare.last_sent = before.last_sent;
                rare.sent_gap_until = before.sent_gap_until;
                self.ready_at = before.ready_at;
            }
            Some(_) => {}
            None if self.epoch == admission.epoch => self.ready_at = admission.ready_before,
            None => {}
        }
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// Records that the request `admission` admitted leaves at `at` (no
    /// earlier than it was admitted): the next send waits `min_delay` from
    /// `at`, and the quota counts the admission at `at`. Moving a record
    /// later is always safe; it keeps a process that was admitted early and
    /// sent late (after waiting on a shared limiter) from following its own
    /// send too closely. Refused, with the instant from which it may be
    /// sent, when another recorded send was less than `min_delay` before
    /// `at`: two admissions made by different paths (one in-process, one by
    /// a shared limiter that just came back) must not leave together.
    pub(crate) fn try_send(
        &mut self,
        admission: &mut Admission,
        at: Instant,
        pacing: &Pacing,
    ) -> Result<(), Instant> {
        if let Some(gap) = self.rare.as_ref().and_then(|r| r.sent_gap_until)
            && at < gap
        {
            return Err(gap);
        }
        // Nothing else happened since the admission: taking the send back
        // may take the admission's own gap back too.
        let ready_at = if self.epoch == admission.epoch {
            admission.ready_before
        } else {
            self.ready_at
        };
        let rare = self.rare.get_or_insert_with(Box::default);
        let before = Unsent {
            last_sent: rare.last_sent,
            sent_gap_until: rare.sent_gap_until,
            ready_at,
        };
        self.epoch = self.epoch.wrapping_add(1);
        admission.sent = Some(Box::new((at, self.epoch, before)));
        let gap = after(at, pacing.min_delay());
        rare.last_sent = Some(at);
        rare.sent_gap_until = Some(gap);
        self.ready_at = self.ready_at.max(gap);
        if pacing.quota() == 0 || at <= admission.at {
            return Ok(());
        }
        // The records move to the send; older ones stay until the next
        // admission drops what has left the window (only the `quota`
        // newest decide, so a record kept too long changes nothing).
        self.forget(admission.at, admission.weight);
        let admissions = &mut self.rare_mut().admissions;
        let pos = admissions.partition_point(|&t| t <= at);
        for _ in 0..admission.weight {
            admissions.insert(pos, at);
        }
        Ok(())
    }

    /// Counts `admission` as weighing `weight` from now on, when that is
    /// more than it was admitted with: the extra slots are in flight (even
    /// beyond the cap: a shared limiter admitted them) and the extra quota
    /// records stand where its own are.
    pub(crate) fn reweigh(&mut self, admission: &mut Admission, weight: u32, pacing: &Pacing) {
        let Some(extra) = weight.checked_sub(admission.weight).filter(|&e| e > 0) else {
            return;
        };
        admission.weight = weight;
        self.in_flight = self.in_flight.saturating_add(extra);
        if pacing.quota() > 0 {
            let at = admission
                .sent
                .as_deref()
                .map_or(admission.at, |(at, ..)| *at);
            let admissions = &mut self.rare_mut().admissions;
            let pos = admissions.partition_point(|&t| t <= at);
            for _ in 0..extra {
                admissions.insert(pos, at);
            }
        }
    }

    /// Drops up to `weight` quota records made at `at`.
    fn forget(&mut self, at: Instant, weight: u32) {
        let Some(rare) = &mut self.rare else {
            return;
        };
        for _ in 0..weight {
            match rare.admissions.iter().rposition(|&t| t == at) {
                Some(i) => drop(rare.admissions.remove(i)),
                None => return,
            }
        }
    }

    /// Records the completion at `now` of a request of `weight`: unless
    /// the pacing spaces sends only, the next send waits `min_delay` from
    /// it.
    pub(crate) fn complete(&mut self, now: Instant, pacing: &Pacing, weight: u32) {
        self.end(weight);
        if Self::completion_matters(pacing) {
            self.ready_at = self.ready_at.max(after(now, pacing.min_delay()));
        }
    }

    /// Whether [`complete`](Self::complete) reads its instant under
    /// `pacing`: when a gap counts from completions. Otherwise
    /// [`end`](Self::end) records the same completion without one.
    pub(crate) fn completion_matters(pacing: &Pacing) -> bool {
        pacing.spacing() == Spacing::SendsAndCompletions && !pacing.min_delay().is_zero()
    }

    /// Records the completion of a request of `weight`, whose instant
    /// does not matter (see [`completion_matters`](Self::completion_matters)).
    pub(crate) fn end(&mut self, weight: u32) {
        self.epoch = self.epoch.wrapping_add(1);
        self.in_flight = self.in_flight.saturating_sub(weight);
    }

    /// Holds the host back until at least `now + hold`; never shortens a
    /// hold already in place.
    pub(crate) fn penalize(&mut self, now: Instant, hold: Duration) {
        self.epoch = self.epoch.wrapping_add(1);
        let until = after(now, hold);
        self.ready_at = self.ready_at.max(until);
        let held = &mut self.rare_mut().held_until;
        *held = Some(held.map_or(until, |h| h.max(until)));
    }

    /// Adds `cost` (a response's bytes over the host's byte rate) to the
    /// host's byte debt, which runs down from now or from where the last
    /// charge left it, whichever is later; the next send waits until it is
    /// paid. Returns when it is.
    pub(crate) fn charge(&mut self, now: Instant, cost: Duration) -> Instant {
        self.epoch = self.epoch.wrapping_add(1);
        let rare = self.rare_mut();
        let free = after(rare.bytes_free.map_or(now, |f| f.max(now)), cost);
        rare.bytes_free = Some(free);
        self.ready_at = self.ready_at.max(free);
        free
    }

    /// From when on this state constrains nothing (it is equivalent to a
    /// fresh one), or `None` while requests are in flight.
    pub(crate) fn idle_at(&self, pacing: &Pacing) -> Option<Instant> {
        if self.in_flight > 0 {
            return None;
        }
        let quota_free = self
            .admissions()
            .back()
            .map(|&last| after(last, pacing.window()));
        let stated = self
            .rare
            .as_ref()
            .and_then(|r| r.stated_cap)
            .map(|(_, until)| until);
        let free = quota_free.map_or(self.ready_at, |q| q.max(self.ready_at));
        Some(stated.map_or(free, |s| s.max(free)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn pacing(max: u32, delay_ms: u64, quota: u32, window_ms: u64) -> Pacing {
        Pacing::builder()
            .max_concurrent(max)
            .min_delay(MS * delay_ms as u32)
            .quota(quota)
            .window(MS * window_ms as u32)
            .build()
            .unwrap()
    }

    #[test]
    fn fresh_state_admits() {
        let t0 = Instant::now();
        let p = pacing(1, 100, 0, 0);
        assert_eq!(HostState::new(t0).decide(t0, &p, 1), Decision::Admit);
    }

    #[test]
    fn min_delay_counts_from_send_and_from_completion() {
        let t0 = Instant::now();
        let p = pacing(2, 100, 0, 0);
        let mut s = HostState::new(t0);
        s.admit(t0, &p, 1);
        assert_eq!(s.decide(t0, &p, 1), Decision::WaitUntil(t0 + 100 * MS));
        // A completion later than the send pushes the next send further.
        s.complete(t0 + 50 * MS, &p, 1);
        assert_eq!(
            s.decide(t0 + 50 * MS, &p, 1),
            Decision::WaitUntil(t0 + 150 * MS)
        );
        assert_eq!(s.decide(t0 + 150 * MS, &p, 1), Decision::Admit);
    }

    #[test]
    fn an_undone_admission_leaves_no_trace_unless_something_followed() {
        let t0 = Instant::now();
        let p = pacing(2, 100, 1, 1000);
        let mut s = HostState::new(t0);
        let a = s.admit(t0, &p, 1);
        s.undo(&a);
        assert_eq!(
            s.decide(t0, &p, 1),
            Decision::Admit,
            "quota and gap are free again"
        );
        assert_eq!(s.idle_at(&p), Some(t0));
        // Something happened since: the gap it opened stays (conservative).
        let a = s.admit(t0, &p, 1);
        s.penalize(t0, 10 * MS);
        s.undo(&a);
        assert_eq!(s.decide(t0, &p, 1), Decision::WaitUntil(t0 + 100 * MS));
    }

    #[test]
    fn a_late_send_moves_the_gap_and_the_quota_record() {
        let t0 = Instant::now();
        let p = pacing(4, 100, 2, 1000);
        let mut s = HostState::new(t0);
        let mut a = s.admit(t0, &p, 1);
        s.admit(t0 + 100 * MS, &p, 1);
        // The first request really left at 700 ms.
        assert_eq!(s.try_send(&mut a, t0 + 700 * MS, &p), Ok(()));
        assert_eq!(
            s.decide(t0 + 700 * MS, &p, 1),
            Decision::WaitUntil(t0 + 1100 * MS),
            "the quota is full until the older record (100 ms) leaves the window"
        );
        assert_eq!(s.idle_at(&p), None);
        s.complete(t0 + 750 * MS, &p, 1);
        s.complete(t0 + 760 * MS, &p, 1);
        assert_eq!(s.idle_at(&p), Some(t0 + 1700 * MS));
        // Without a quota, only the gap moves.
        let p = pacing(4, 100, 0, 0);
        let mut s = HostState::new(t0);
        let mut a = s.admit(t0, &p, 1);
        let mut b = s.admit(t0 + 100 * MS, &p, 1);
        assert_eq!(s.try_send(&mut a, t0 + 500 * MS, &p), Ok(()));
        assert_eq!(
            s.decide(t0 + 550 * MS, &p, 1),
            Decision::WaitUntil(t0 + 600 * MS)
        );
        // Another admission may not leave within min_delay of that send.
        assert_eq!(s.try_send(&mut b, t0 + 550 * MS, &p), Err(t0 + 600 * MS));
        assert_eq!(s.try_send(&mut b, t0 + 600 * MS, &p), Ok(()));
    }

    #[test]
    fn taking_back_a_late_send_keeps_the_quota_record_it_pushed_out() {
        let t0 = Instant::now();
        let p = pacing(4, 0, 2, 1000);
        let mut s = HostState::new(t0);
        // A waits 1.5 s elsewhere; B and C are admitted meanwhile (A's own
        // record has left the window by then).
        let mut a = s.admit(t0, &p, 1);
        s.admit(t0 + 1200 * MS, &p, 1);
        s.admit(t0 + 1300 * MS, &p, 1);
        assert_eq!(s.try_send(&mut a, t0 + 1500 * MS, &p), Ok(()));
        s.undo(&a);
        // B and C still fill the quota until B leaves the window.
        assert_eq!(
            s.decide(t0 + 1600 * MS, &p, 1),
            Decision::WaitUntil(t0 + 2200 * MS)
        );
    }

    #[test]
    fn a_recorded_send_is_taken_back_with_its_admission() {
        let t0 = Instant::now();
        let p = pacing(4, 100, 2, 1000);
        let mut s = HostState::new(t0);
        let mut a = s.admit(t0, &p, 1);
        assert_eq!(s.try_send(&mut a, t0 + 50 * MS, &p), Ok(()));
        assert_eq!(s.last_sent(), Some(t0 + 50 * MS));
        s.undo(&a);
        // As if it had never been admitted: no gap, no quota entry, no send.
        assert_eq!(s.last_sent(), None);
        assert_eq!(s.decide(t0 + 60 * MS, &p, 1), Decision::Admit);
        let mut b = s.admit(t0 + 60 * MS, &p, 1);
        assert_eq!(s.try_send(&mut b, t0 + 60 * MS, &p), Ok(()));
        s.admit(t0 + 160 * MS, &p, 1);
        assert_eq!(
            s.decide(t0 + 260 * MS, &p, 1),
            Decision::WaitUntil(t0 + 1060 * MS),
            "two quota entries, not three"
        );
        // Something recorded after the send: only the counts go back.
        let mut p2 = HostState::new(t0);
        let q = pacing(4, 100, 0, 0);
        let mut c = p2.admit(t0, &q, 1);
        assert_eq!(p2.try_send(&mut c, t0, &q), Ok(()));
        p2.admit(t0 + 100 * MS, &q, 1);
        p2.undo(&c);
        assert_eq!(p2.last_sent(), Some(t0));
        assert_eq!(
            p2.decide(t0 + 150 * MS, &q, 1),
            Decision::WaitUntil(t0 + 200 * MS)
        );
    }

    #[test]
    fn spacing_from_sends_only_ignores_completions() {
        let t0 = Instant::now();
        let p = pacing(2, 100, 0, 0).with_spacing(Spacing::Sends);
        let mut s = HostState::new(t0);
        s.admit(t0, &p, 1);
        s.complete(t0 + 90 * MS, &p, 1);
        assert_eq!(
            s.decide(t0 + 90 * MS, &p, 1),
            Decision::WaitUntil(t0 + 100 * MS)
        );
        assert_eq!(s.decide(t0 + 100 * MS, &p, 1), Decision::Admit);
    }

    #[test]
    fn concurrency_cap_reports_full() {
        let t0 = Instant::now();
        let p = pacing(1, 0, 0, 0);
        let mut s = HostState::new(t0);
        s.admit(t0, &p, 1);
        assert_eq!(s.decide(t0 + MS, &p, 1), Decision::Full);
        s.complete(t0 + MS, &p, 1);
        assert_eq!(s.decide(t0 + MS, &p, 1), Decision::Admit);
    }

    #[test]
    fn quota_opens_when_the_oldest_admission_leaves_the_window() {
        let t0 = Instant::now();
        let p = pacing(10, 0, 2, 1000);
        let mut s = HostState::new(t0);
        s.admit(t0, &p, 1);
        s.admit(t0 + 10 * MS, &p, 1);
        assert_eq!(
            s.decide(t0 + 20 * MS, &p, 1),
            Decision::WaitUntil(t0 + 1000 * MS)
        );
        s.admit(t0 + 1000 * MS, &p, 1);
        assert_eq!(
            s.decide(t0 + 1000 * MS, &p, 1),
            Decision::WaitUntil(t0 + 1010 * MS)
        );
    }

    #[test]
    fn penalty_only_extends() {
        let t0 = Instant::now();
        let p = pacing(1, 0, 0, 0);
        let mut s = HostState::new(t0);
        s.penalize(t0, 500 * MS);
        s.penalize(t0 + 10 * MS, 100 * MS);
        assert_eq!(
            s.decide(t0 + 10 * MS, &p, 1),
            Decision::WaitUntil(t0 + 500 * MS)
        );
        assert_eq!(s.idle_at(&p), Some(t0 + 500 * MS));
    }

    #[test]
    fn byte_charges_add_up_and_run_down_in_real_time() {
        let t0 = Instant::now();
        let p = pacing(2, 0, 0, 0);
        let mut s = HostState::new(t0);
        // Two charges at once add up: 300 ms of debt.
        assert_eq!(s.charge(t0, 100 * MS), t0 + 100 * MS);
        assert_eq!(s.charge(t0, 200 * MS), t0 + 300 * MS);
        assert_eq!(s.decide(t0, &p, 1), Decision::WaitUntil(t0 + 300 * MS));
        // A charge after the debt is paid counts from its own instant.
        assert_eq!(s.charge(t0 + 1000 * MS, 50 * MS), t0 + 1050 * MS);
        // A shorter penalty does not shorten it.
        s.penalize(t0 + 1000 * MS, 10 * MS);
        assert_eq!(
            s.decide(t0 + 1000 * MS, &p, 1),
            Decision::WaitUntil(t0 + 1050 * MS)
        );
        assert_eq!(s.idle_at(&p), Some(t0 + 1050 * MS));
    }

    #[test]
    fn a_stated_cap_lowers_the_pacing_s_until_it_lapses() {
        let t0 = Instant::now();
        let p = pacing(4, 0, 0, 0);
        let mut s = HostState::new(t0);
        s.state_cap(t0, 2, 1000 * MS);
        s.admit(t0, &p, 1);
        s.admit(t0, &p, 1);
        assert_eq!(s.decide(t0, &p, 1), Decision::Full);
        // A request heavier than the stated cap goes alone, not never.
        assert!(!s.fits(t0, &p, 3));
        s.end(1);
        s.end(1);
        assert!(s.fits(t0, &p, 3));
        s.admit(t0, &p, 1);
        s.admit(t0, &p, 1);
        assert_eq!(s.idle_at(&p), None);
        // Lapsed: the pacing's own cap again; a stated cap never raises it.
        assert_eq!(s.decide(t0 + 1000 * MS, &p, 1), Decision::Admit);
        s.state_cap(t0, 9, 1000 * MS);
        s.admit(t0, &p, 1);
        s.admit(t0, &p, 1);
        assert_eq!(s.decide(t0, &p, 1), Decision::Full);
        for _ in 0..4 {
            s.end(1);
        }
        // Kept while it holds.
        assert_eq!(s.idle_at(&p), Some(t0 + 1000 * MS));
    }

    #[test]
    fn idle_at_waits_for_the_window_and_for_in_flight() {
        let t0 = Instant::now();
        let p = pacing(1, 100, 5, 1000);
        let mut s = HostState::new(t0);
        s.admit(t0, &p, 1);
        assert_eq!(s.idle_at(&p), None);
        s.complete(t0 + 10 * MS, &p, 1);
        assert_eq!(s.idle_at(&p), Some(t0 + 1000 * MS));
    }

    #[test]
    fn earliest_for_adds_one_gap_per_request_ahead() {
        let t0 = Instant::now();
        let p = pacing(1, 100, 0, 0);
        let mut s = HostState::new(t0);
        s.admit(t0, &p, 1);
        assert_eq!(s.earliest_for(t0, 0, &p), t0 + 100 * MS);
        assert_eq!(s.earliest_for(t0, 3, &p), t0 + 400 * MS);
    }

    #[test]
    fn a_weighted_admission_takes_its_weight_of_the_cap_and_the_quota() {
        let t0 = Instant::now();
        let p = pacing(3, 0, 4, 1000);
        let mut s = HostState::new(t0);
        s.admit(t0, &p, 2);
        assert_eq!(s.in_flight(), 2);
        assert_eq!(s.decide(t0, &p, 2), Decision::Full, "2 + 2 > 3");
        assert_eq!(s.decide(t0, &p, 1), Decision::Admit);
        s.admit(t0 + MS, &p, 1);
        s.complete(t0 + 2 * MS, &p, 1);
        assert_eq!(s.in_flight(), 2);
        assert_eq!(s.decide(t0 + 2 * MS, &p, 1), Decision::Admit);
        assert_eq!(s.decide(t0 + 2 * MS, &p, 2), Decision::Full);
        s.complete(t0 + 3 * MS, &p, 2);
        // Three of the four quota units are taken: one more fits, not two.
        assert_eq!(s.decide(t0 + 3 * MS, &p, 1), Decision::Admit);
        assert_eq!(
            s.decide(t0 + 3 * MS, &p, 2),
            Decision::WaitUntil(t0 + 1000 * MS),
            "two units are free once the weight-2 records leave the window"
        );
    }

    #[test]
    fn a_late_weighted_send_moves_all_its_records() {
        let t0 = Instant::now();
        let p = pacing(4, 0, 3, 1000);
        let mut s = HostState::new(t0);
        let mut a = s.admit(t0, &p, 2);
        assert_eq!(s.try_send(&mut a, t0 + 500 * MS, &p), Ok(()));
        s.admit(t0 + 600 * MS, &p, 1);
        // Both records of the weight-2 send count from 500 ms.
        assert_eq!(
            s.decide(t0 + 1200 * MS, &p, 1),
            Decision::WaitUntil(t0 + 1500 * MS)
        );
        s.undo(&a);
        assert_eq!(s.decide(t0 + 1200 * MS, &p, 2), Decision::Admit);
    }

    proptest! {
        /// Admitting whenever `decide` says so, at any sequence of instants,
        /// weights and completions, never breaks a rule: in flight (by
        /// weight) <= max, sends >= min_delay apart and after completions,
        /// <= quota (by weight) per window.
        #[test]
        fn admitting_on_decide_keeps_every_rule(
            max in 1u32..5,
            delay_ms in 0u64..50,
            quota in 0u32..6,
            window_ms in 1u64..200,
            steps in proptest::collection::vec((0u64..40, any::<bool>(), 1u32..5), 1..200),
        ) {
            let window_ms = if quota == 0 { 0 } else { window_ms };
            let p = pacing(max, delay_ms, quota, window_ms);
            let heaviest = if quota == 0 { max } else { max.min(quota) };
            let t0 = Instant::now();
            let mut s = HostState::new(t0);
            let mut now = t0;
            let mut sends: Vec<(Instant, u32)> = Vec::new();
            let mut last_completion: Option<Instant> = None;
            let mut flying: VecDeque<u32> = VecDeque::new();
            for (advance, complete, weight) in steps {
                now += MS * advance as u32;
                let weight = weight.min(heaviest);
                let in_flight: u32 = flying.iter().sum();
                if complete && let Some(done) = flying.pop_front() {
                    s.complete(now, &p, done);
                    last_completion = Some(now);
                    continue;
                }
                match s.decide(now, &p, weight) {
                    Decision::Admit => {
                        prop_assert!(in_flight + weight <= max);
                        if let Some(&(prev, _)) = sends.last() {
                            prop_assert!(now >= prev + p.min_delay());
                        }
                        if let Some(done) = last_completion {
                            prop_assert!(now >= done + p.min_delay());
                        }
                        if quota > 0 {
                            let in_window: u32 = sends
                                .iter()
                                .filter(|&&(t, _)| t + p.window() > now)
                                .map(|&(_, w)| w)
                                .sum();
                            prop_assert!(in_window + weight <= quota);
                        }
                        s.admit(now, &p, weight);
                        sends.push((now, weight));
                        flying.push_back(weight);
                    }
                    Decision::WaitUntil(at) => {
                        prop_assert!(at > now);
                        prop_assert!(in_flight + weight <= max);
                    }
                    Decision::Full => prop_assert!(in_flight + weight > max),
                }
                prop_assert_eq!(s.in_flight(), flying.iter().sum::<u32>());
            }
        }

        /// Once `idle_at` has passed, the state decides exactly as a fresh
        /// one would: evicting it loses nothing.
        #[test]
        fn idle_state_is_equivalent_to_fresh(
            delay_ms in 0u64..50,
            quota in 0u32..4,
            window_ms in 1u64..200,
            hold_ms in 0u64..300,
            sends in 1usize..6,
        ) {
            let window_ms = if quota == 0 { 0 } else { window_ms };
            let p = pacing(8, delay_ms, quota, window_ms);
            let t0 = Instant::now();
            let mut s = HostState::new(t0);
            for i in 0..sends {
                s.admit(t0 + MS * i as u32, &p, 1);
            }
            for i in 0..sends {
                s.complete(t0 + MS * (i as u32 + 10), &p, 1);
            }
            s.penalize(t0, MS * hold_ms as u32);
            let idle = s.idle_at(&p).unwrap();
            prop_assert_eq!(s.decide(idle, &p, 1), Decision::Admit);
            let fresh = HostState::new(idle);
            prop_assert_eq!(s.next_send(&p, 1).max(idle), fresh.next_send(&p, 1));
        }
    }
}

//! The share of each host's pace this replica takes during an outage (and
//! just after it, while the other replicas may not have noticed the
//! primary's return): the in-process limiter applying it, and whether its
//! turns are still in force, as plain functions of the instant given.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::pacing::after;
use crate::{DomainLimiter, HostKey, Policies};

/// The shares of each failure domain of the primary (a Redis Cluster
/// master, or the whole of Redis): an outage of one master sends only its
/// own hosts to their shares and turns.
#[derive(Debug, Default)]
pub(super) struct Domains {
    shares: Mutex<std::collections::HashMap<u32, std::sync::Arc<Shares>>>,
}

impl Domains {
    /// The shares of failure domain `domain`.
    pub(super) fn of(&self, domain: u32) -> std::sync::Arc<Shares> {
        let mut shares = self.shares.lock().unwrap_or_else(PoisonError::into_inner);
        std::sync::Arc::clone(shares.entry(domain).or_default())
    }
}

/// The in-process limiter pacing this replica's share during an outage,
/// and the caps on requests in flight its hosts stated, as an outage keeps
/// them (see [`Shares::stated`]).
#[derive(Debug)]
pub(super) struct Shares {
    /// Whether `current` holds anything (read on every admission).
    active: AtomicBool,
    current: Mutex<Option<Share>>,
    /// When the primary last answered, in µs since `epoch`, plus one; 0
    /// while it never has.
    heard: AtomicU64,
    epoch: Instant,
    /// The last cap on requests in flight each host stated, by key, and
    /// until when it holds.
    stated: Mutex<Statements>,
}

/// The caps hosts stated, and the size at which those no longer kept are
/// next dropped (twice what was left the last time, at least 64).
#[derive(Debug, Default)]
struct Statements {
    caps: HashMap<HostKey, (u32, Instant)>,
    prune_at: usize,
}

/// Whether a statement holding `until` is kept at `now`, the primary
/// having last answered at `heard`: in force, or lapsed only since.
fn kept(until: Instant, now: Instant, heard: Option<Instant>) -> bool {
    until > now || heard.is_some_and(|heard| until > heard)
}

impl Default for Shares {
    fn default() -> Self {
        Self {
            active: AtomicBool::default(),
            current: Mutex::default(),
            heard: AtomicU64::default(),
            epoch: Instant::now(),
            stated: Mutex::default(),
        }
    }
}

/// The share this replica paces at during (and just after) an outage.
#[derive(Debug)]
struct Share {
    /// How many replicas divide the pacing.
    n: u32,
    /// Which of them this one is.
    index: u32,
    /// When the outage was first met.
    began: Instant,
    /// The limiter applying the share.
    limiter: DomainLimiter,
    /// Whether its turns are still taken.
    grace: Grace,
}

/// How long after the primary answers again this replica keeps its share
/// of the pace (taking its turns) for requests the primary admits: other
/// replicas may not have noticed yet (they ask again once a second) and
/// still send at their shares; until they do, taking turns keeps the sum
/// within the shared pace.
pub(super) const SHARE_GRACE: Duration = Duration::from_millis(1500);

/// Whether a share's turns are in force: through the outage, and until
/// [`SHARE_GRACE`] after the primary's first answer since it last failed.
/// A plain state of the instants it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Grace {
    /// The primary's first answer since it last failed, if any.
    answered: Option<Instant>,
}

impl Grace {
    /// The primary failed (again): the outage goes on, and the grace waits
    /// for its next answer.
    pub(super) fn failed(&mut self) {
        self.answered = None;
    }

    /// The primary answered at `now`: the grace starts, unless it had.
    pub(super) fn answered(&mut self, now: Instant) {
        self.answered.get_or_insert(now);
    }

    /// Whether the primary has answered since it last failed.
    pub(super) fn started(&self) -> bool {
        self.answered.is_some()
    }

    /// Whether the turns are still taken at `now`.
    pub(super) fn in_force(&self, now: Instant) -> bool {
        self.answered
            .is_none_or(|answered| now < after(answered, SHARE_GRACE))
    }
}

impl Shares {
    /// The limiter for `n` shares of `policies`, and when the outage
    /// began. `outage` when the primary just failed (which starts the
    /// outage again if it had ended), not when it admitted during the grace.
    pub(super) fn get(
        &self,
        n: u32,
        index: u32,
        policies: &Policies,
        outage: bool,
        now: Instant,
    ) -> (Instant, DomainLimiter) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(share) = &mut *current
            && share.n == n
        {
            share.index = index;
            if outage {
                share.grace.failed();
            }
            return (share.began, share.limiter.clone());
        }
        let began = current.as_ref().map_or(now, |c| c.began);
        let limiter = DomainLimiter::new(policies.map(|_, pacing| pacing.shared_by(n)));
        *current = Some(Share {
            n,
            index,
            began,
            limiter: limiter.clone(),
            grace: Grace::default(),
        });
        self.active.store(true, Ordering::Release);
        (began, limiter)
    }

    /// The limiter applying the share now, if there is one.
    pub(super) fn limiter(&self) -> Option<DomainLimiter> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.as_ref().map(|share| share.limiter.clone())
    }

    /// The share (`n`, `index`) a request must take its turn in before it
    /// asks the primary, at `now`: while its [`Grace`] is in force (the
    /// registry read since the outage may already differ from the one the
    /// other replicas still pace by). `None` once it is over, when the
    /// share is forgotten.
    pub(super) fn turns(&self, now: Instant) -> Option<(u32, u32)> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let share = current.as_mut()?;
        if share.grace.in_force(now) {
            return Some((share.n, share.index));
        }
        *current = None;
        self.active.store(false, Ordering::Release);
        None
    }

    /// Whether the primary has not answered this replica since the outage
    /// began or last went on (the share's grace has not started).
    pub(super) fn unanswered(&self) -> bool {
        if !self.active.load(Ordering::Acquire) {
            return false;
        }
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.as_ref().is_some_and(|share| !share.grace.started())
    }

    /// The primary failed again after it had answered.
    pub(super) fn failed(&self) {
        self.with_grace(Grace::failed);
    }

    /// The primary admitted a request at `now` (or named a wait).
    pub(super) fn answered(&self, now: Instant) {
        let micros = now.saturating_duration_since(self.epoch).as_micros();
        let micros = u64::try_from(micros).unwrap_or(u64::MAX - 1) + 1;
        self.heard.fetch_max(micros, Ordering::Relaxed);
        self.with_grace(|grace| grace.answered(now));
    }

    /// When the primary last answered, if it ever did.
    fn heard(&self) -> Option<Instant> {
        match self.heard.load(Ordering::Relaxed) {
            0 => None,
            micros => Some(after(self.epoch, Duration::from_micros(micros - 1))),
        }
    }

    /// `key` stated a cap on requests in flight of `cap` until `until` (see
    /// `Limiter::cap_host`), which replaces what it stated before. Caps
    /// that lapsed before the primary last answered are forgotten as the
    /// statements grow.
    pub(super) fn state(&self, key: HostKey, cap: u32, until: Instant) {
        let (heard, now) = (self.heard(), Instant::now());
        let mut stated = self.stated.lock().unwrap_or_else(PoisonError::into_inner);
        stated.caps.insert(key, (cap.max(1), until));
        if stated.caps.len() >= stated.prune_at {
            stated
                .caps
                .retain(|_, &mut (_, until)| kept(until, now, heard));
            stated.prune_at = (stated.caps.len() * 2).max(64);
        }
    }

    /// The cap on requests in flight `key` stated, and until when, as an
    /// outage keeps it: in force at `now`, or lapsed only since the
    /// primary last answered. Through an outage the host may go on stating
    /// it to the replicas that send to it, while this one, sending nothing
    /// yet (or nothing at all, its part being none), hears nothing; the
    /// primary, once it answers, holds the host's statement for every
    /// replica.
    pub(super) fn stated(&self, key: &HostKey, now: Instant) -> Option<(u32, Instant)> {
        let (cap, until) = *self
            .stated
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .caps
            .get(key)?;
        kept(until, now, self.heard()).then_some((cap, until))
    }

    fn with_grace(&self, f: impl FnOnce(&mut Grace)) {
        if self.active.load(Ordering::Acquire) {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(share) = &mut *current {
                f(&mut share.grace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What happens to a share, in order, with the time before it.
    #[derive(Debug, Clone, Copy)]
    enum Event {
        Failed,
        Answered,
        Asked,
    }

    fn event() -> impl Strategy<Value = (u64, Event)> {
        (
            0u64..2_000,
            prop_oneof![
                Just(Event::Failed),
                Just(Event::Answered),
                Just(Event::Asked)
            ],
        )
    }

    proptest! {
        /// The turns are taken exactly while the primary has not answered
        /// since it last failed, or for less than the grace since its first
        /// answer after that.
        #[test]
        fn the_grace_runs_from_the_first_answer_after_the_last_failure(
            events in proptest::collection::vec(event(), 1..40),
        ) {
            let start = Instant::now();
            let mut now = start;
            let mut grace = Grace::default();
            // The model: the first answer since the last failure.
            let mut first_answer: Option<Instant> = None;
            for (ms, event) in events {
                now += Duration::from_millis(ms);
                match event {
                    Event::Failed => {
                        grace.failed();
                        first_answer = None;
                    }
                    Event::Answered => {
                        grace.answered(now);
                        first_answer.get_or_insert(now);
                    }
                    Event::Asked => {}
                }
                let expected = first_answer.is_none_or(|at| now - at < SHARE_GRACE);
                prop_assert_eq!(grace.in_force(now), expected);
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_share_is_forgotten_once_its_grace_is_over() {
        let shares = Shares::default();
        let policies = Policies::default();
        let start = Instant::now();
        assert_eq!(shares.turns(start), None);
        let (began, _) = shares.get(3, 1, &policies, true, start);
        assert_eq!(began, start);
        let later = start + Duration::from_secs(5);
        assert_eq!(shares.turns(later), Some((3, 1)));
        shares.answered(later);
        assert_eq!(
            shares.turns(later + SHARE_GRACE - Duration::from_millis(1)),
            Some((3, 1))
        );
        // A failure in the grace puts it off until the next answer.
        shares.failed();
        assert_eq!(shares.turns(later + 2 * SHARE_GRACE), Some((3, 1)));
        shares.answered(later + 2 * SHARE_GRACE);
        assert_eq!(shares.turns(later + 3 * SHARE_GRACE), None);
        // Forgotten: a new outage begins afresh.
        let again = later + Duration::from_secs(60);
        assert_eq!(shares.get(3, 1, &policies, true, again).0, again);
    }

    /// A stated cap holds until it lapses, and past that while the primary
    /// has not answered since it held (an outage); never when the primary
    /// never answered.
    #[tokio::test(start_paused = true)]
    async fn a_stated_cap_is_kept_past_its_lapse_until_the_primary_answers() {
        let shares = Shares::default();
        let key = HostKey::parse("http://a.test/").unwrap();
        let start = Instant::now();
        let until = start + Duration::from_secs(2);
        let past = until + Duration::from_secs(10);
        shares.state(key.clone(), 2, until);
        assert_eq!(shares.stated(&key, start), Some((2, until)));
        assert_eq!(shares.stated(&key, past), None, "never answered");
        // Answered while it held, then nothing: kept.
        shares.answered(start + Duration::from_secs(1));
        assert_eq!(shares.stated(&key, past), Some((2, until)));
        // Answered after it lapsed: gone; a new statement replaces it.
        shares.answered(until);
        assert_eq!(shares.stated(&key, past), None);
        shares.state(key.clone(), 0, past);
        assert_eq!(shares.stated(&key, start), Some((1, past)), "at least 1");
        let other = HostKey::parse("http://b.test/").unwrap();
        assert_eq!(shares.stated(&other, start), None);
    }

    /// Statements no longer kept are dropped as others come, so that the
    /// record of them stays about as large as what is kept.
    #[tokio::test(start_paused = true)]
    async fn statements_no_longer_kept_are_dropped() {
        let shares = Shares::default();
        let host = |i: usize| HostKey::parse(&format!("http://h{i}.test/")).unwrap();
        let start = Instant::now();
        for i in 0..63 {
            shares.state(host(i), 1, start + Duration::from_secs(1));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        shares.answered(Instant::now());
        let live = Instant::now() + Duration::from_secs(60);
        for i in 63..200 {
            shares.state(host(i), 1, live);
        }
        let count = shares.stated.lock().unwrap().caps.len();
        assert_eq!(count, 137, "the 63 lapsed before the answer are gone");
        assert_eq!(shares.stated(&host(0), Instant::now()), None);
        assert_eq!(shares.stated(&host(199), Instant::now()), Some((1, live)));
    }
}

//! Requests admitted in-process during an outage, offered to the primary
//! until it counts them (or they end), so that nothing is admitted beside
//! them once it answers.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::{HostKey, Limiter, Permit};

/// How often requests admitted in-process during an outage are offered to
/// the primary again while it is away.
pub(super) const ADOPT_RETRY: Duration = Duration::from_millis(100);

/// How often an acquire looks whether an offer of its key under way
/// elsewhere has ended (one Redis call; the acquire's deadline bounds it).
const OFFER_POLL: Duration = Duration::from_millis(2);

/// How long a replica's first admission by the primary for a host it
/// deferred during an outage waits (it is given back, and asked for again
/// after this): the replica that served the host may not have noticed the
/// primary's return yet (its circuit or its heartbeat finds it within a
/// second), and until it has offered its requests in flight (within
/// [`ADOPT_RETRY`] after that) a primary that came back empty knows nothing
/// of them.
pub(super) const SETTLE: Duration = Duration::from_millis(1300);

/// The hosts (keys) this replica deferred to another replica during an
/// outage, until their first admission by the primary has settled: from
/// it, admissions wait [`SETTLE`].
#[derive(Debug, Default)]
pub(super) struct Deferred {
    keys: Mutex<std::collections::HashMap<HostKey, Held>>,
    /// Whether `keys` holds any (read on every admission).
    any: AtomicBool,
}

/// Where a deferred host stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Deferred, and not admitted by the primary since; `cap`: a cap on
    /// requests in flight the host stated, of which this replica's part
    /// was none, when that was why.
    Deferred { cap: Option<u32> },
    /// Admitted by the primary: its admissions are given back until then.
    Until(Instant),
}

impl Deferred {
    /// `key` was deferred to another replica (for a stated `cap` it has no
    /// part of, if that was why).
    pub(super) fn add(&self, key: &HostKey, cap: Option<u32>) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.insert(key.clone(), Held::Deferred { cap });
        self.any.store(true, Ordering::Release);
    }

    /// `key` was deferred to another replica for a stated `cap` it has no
    /// part of, unless it is already (its first admission since may have
    /// been held): unlike [`add`](Self::add), asking again does not start
    /// the hold again.
    pub(super) fn mark(&self, key: &HostKey, cap: u32) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.entry(key.clone())
            .and_modify(|held| {
                if let Held::Deferred { cap: why } = held {
                    *why = Some(cap);
                }
            })
            .or_insert(Held::Deferred { cap: Some(cap) });
        self.any.store(true, Ordering::Release);
    }

    /// The stated cap `key` was deferred for, while it is deferred and the
    /// primary has not admitted it since.
    pub(super) fn stated(&self, key: &HostKey) -> Option<u32> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        match keys.get(key)? {
            Held::Deferred { cap } => *cap,
            Held::Until(_) => None,
        }
    }

    /// Until when an admission of `key` by the primary at `now` is given
    /// back: [`SETTLE`] after the first since it was deferred; `None` once
    /// that has passed (or it was not deferred), when it is forgotten.
    pub(super) fn hold(&self, key: &HostKey, now: Instant) -> Option<Instant> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let held = keys.get_mut(key)?;
        let until = match *held {
            Held::Until(until) if until > now => Some(until),
            Held::Until(_) => None,
            Held::Deferred { .. } => {
                let until = crate::pacing::after(now, SETTLE);
                *held = Held::Until(until);
                Some(until)
            }
        };
        if until.is_none() {
            keys.remove(key);
            self.any.store(!keys.is_empty(), Ordering::Release);
        }
        until
    }
}

/// Requests admitted in-process during an outage and still in flight,
/// which the primary has not counted yet.
#[derive(Debug, Default)]
pub(super) struct Adoptions {
    pending: Mutex<Vec<Arc<Adoptee>>>,
    /// `pending.len()`, read on every acquire.
    count: AtomicUsize,
    /// Whether the task offering them to the primary runs.
    running: AtomicBool,
    /// How many were ever added: the admissions made without the primary.
    added: std::sync::atomic::AtomicU64,
}

/// One request admitted in-process during an outage.
#[derive(Debug)]
pub(super) struct Adoptee {
    /// The request's host (the primary picks its rule by it) ...
    pub(super) host: HostKey,
    /// ... and its key, which requests of other hosts may share.
    pub(super) key: HostKey,
    /// Its weight.
    pub(super) weight: u32,
    pub(super) sent: Instant,
    pub(super) state: Mutex<Adopted>,
}

#[derive(Debug)]
pub(super) enum Adopted {
    /// In flight, not counted in the primary yet.
    Pending,
    /// Being offered to the primary by one caller (the others skip it).
    Offering,
    /// Counted: the primary's permit, released with the request.
    Held {
        /// Released when dropped.
        _permit: Permit,
    },
    /// Ended before the primary counted it: until `not_before` (a gap
    /// after its end), the primary is told to hold the host, so that a
    /// primary back without its state admits nobody too close to it.
    Trace {
        /// When the host may be sent to again after this request.
        not_before: Instant,
    },
    /// Released, or nothing to count it in.
    Done,
}

impl Adoptee {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Adopted> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Adoptions {
    /// Adds `adoptee`, and offers what is pending to `primary` in the
    /// background until nothing is.
    pub(super) fn add<P: Limiter + 'static>(
        self: &Arc<Self>,
        adoptee: Arc<Adoptee>,
        primary: &Arc<P>,
    ) {
        self.added.fetch_add(1, Ordering::Relaxed);
        {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            pending.push(adoptee);
            self.count.store(pending.len(), Ordering::SeqCst);
        }
        if !self.running.swap(true, Ordering::SeqCst) {
            tokio::spawn(adopt_in_background(Arc::clone(primary), Arc::clone(self)));
        }
    }

    /// How many requests were admitted without the primary, ever.
    pub(super) fn admitted(&self) -> u64 {
        self.added.load(Ordering::Relaxed)
    }

    /// Whether any request waits to be counted in the primary.
    pub(super) fn pending(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    /// Offers the pending requests (to `only` that key, when given) to
    /// `primary`; stops at the first that finds it unavailable. For one
    /// key (an acquire about to ask the primary), it also waits for the
    /// offers of that key already under way elsewhere (the background
    /// task's) to end: else the primary could admit beside a request it
    /// is about to count, one over the cap.
    pub(super) async fn offer<P: Limiter>(&self, primary: &P, only: Option<&HostKey>) {
        let candidates: Vec<Arc<Adoptee>> = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|a| only.is_none_or(|key| *key == a.key))
            .cloned()
            .collect();
        let mut elsewhere = Vec::new();
        for adoptee in candidates {
            let traced = {
                let mut state = adoptee.lock();
                match *state {
                    Adopted::Trace { not_before } => {
                        *state = Adopted::Done;
                        Some(not_before)
                    }
                    Adopted::Pending => {
                        *state = Adopted::Offering;
                        None
                    }
                    Adopted::Offering if only.is_some() => {
                        elsewhere.push(Arc::clone(&adoptee));
                        continue;
                    }
                    _ => continue,
                }
            };
            if let Some(not_before) = traced {
                if !trace(primary, &adoptee, not_before).await {
                    break;
                }
                continue;
            }
            // Put back to pending if this offer is dropped before it ends.
            let offering = Offering(&adoptee);
            let answer = match crate::limiter::coordination(primary) {
                Some(shared) => {
                    shared
                        .adopt_host(adoptee.host.clone(), adoptee.sent.elapsed(), adoptee.weight)
                        .await
                }
                None => Ok(None),
            };
            std::mem::forget(offering);
            let mut state = adoptee.lock();
            // Released meanwhile: `Done`, or a `Trace` of its end.
            let ended = !matches!(*state, Adopted::Offering);
            match answer {
                // Counted, and released at once: its release in the primary
                // records its end, which the trace would have told.
                Ok(Some(permit)) if ended => {
                    drop(permit);
                    *state = Adopted::Done;
                }
                // Nothing to count it in: a trace still has its end to tell.
                Ok(None) if ended => {}
                Ok(permit) => {
                    *state = permit.map_or(Adopted::Done, |p| Adopted::Held { _permit: p });
                }
                Err(err) if err.is_unavailable() => {
                    if !ended {
                        *state = Adopted::Pending;
                    }
                    break;
                }
                Err(err) => {
                    tracing::warn!(host = %adoptee.host, error = %crate::error::Causes(&err), "a request admitted in-process could not be counted in the shared limiter");
                    *state = Adopted::Done;
                }
            }
        }
        for adoptee in elsewhere {
            while matches!(*adoptee.lock(), Adopted::Offering) {
                tokio::time::sleep(OFFER_POLL).await;
            }
        }
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.retain(|a| {
            matches!(
                *a.lock(),
                Adopted::Pending | Adopted::Offering | Adopted::Trace { .. }
            )
        });
        self.count.store(pending.len(), Ordering::SeqCst);
    }
}

/// Tells `primary` to hold `adoptee`'s host until `not_before` (its
/// request ended before the primary counted it). False when the primary
/// is unavailable: the trace is put back, to be told again.
async fn trace<P: Limiter>(primary: &P, adoptee: &Adoptee, not_before: Instant) -> bool {
    let hold = not_before.saturating_duration_since(Instant::now());
    if hold.is_zero() {
        return true;
    }
    match primary.penalize_host(adoptee.host.clone(), hold).await {
        Ok(()) => true,
        Err(err) if err.is_unavailable() => {
            let mut state = adoptee.lock();
            if matches!(*state, Adopted::Done) {
                *state = Adopted::Trace { not_before };
            }
            false
        }
        Err(err) => {
            tracing::warn!(host = %adoptee.host, error = %crate::error::Causes(&err), "a request sent in-process could not be recorded in the shared limiter");
            true
        }
    }
}

/// An offer in progress; dropped unfinished, it puts its request back.
struct Offering<'a>(&'a Adoptee);

impl Drop for Offering<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        if matches!(*state, Adopted::Offering) {
            *state = Adopted::Pending;
        }
    }
}

/// Offers pending requests to the primary every [`ADOPT_RETRY`] until none
/// is left.
async fn adopt_in_background<P: Limiter>(primary: Arc<P>, adoptions: Arc<Adoptions>) {
    loop {
        tokio::time::sleep(ADOPT_RETRY).await;
        adoptions.offer(&*primary, None).await;
        if adoptions.count.load(Ordering::SeqCst) == 0 {
            adoptions.running.store(false, Ordering::SeqCst);
            // One added since the last offer restarts the loop.
            if adoptions.count.load(Ordering::SeqCst) == 0
                || adoptions.running.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
    }
}

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

/// Requests admitted in-process during an outage and still in flight,
/// which the primary has not counted yet.
#[derive(Debug, Default)]
pub(super) struct Adoptions {
    pending: Mutex<Vec<Arc<Adoptee>>>,
    /// `pending.len()`, read on every acquire.
    count: AtomicUsize,
    /// Whether the task offering them to the primary runs.
    running: AtomicBool,
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
        {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            pending.push(adoptee);
            self.count.store(pending.len(), Ordering::SeqCst);
        }
        if !self.running.swap(true, Ordering::SeqCst) {
            tokio::spawn(adopt_in_background(Arc::clone(primary), Arc::clone(self)));
        }
    }

    /// Whether any request waits to be counted in the primary.
    pub(super) fn pending(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    /// Offers the pending requests (to `only` that key, when given) to
    /// `primary`; stops at the first that finds it unavailable.
    pub(super) async fn offer<P: Limiter>(&self, primary: &P, only: Option<&HostKey>) {
        let candidates: Vec<Arc<Adoptee>> = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|a| only.is_none_or(|key| *key == a.key))
            .cloned()
            .collect();
        for adoptee in candidates {
            {
                let mut state = adoptee.lock();
                if !matches!(*state, Adopted::Pending) {
                    continue;
                }
                *state = Adopted::Offering;
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
            let released = matches!(*state, Adopted::Done);
            match answer {
                // Released meanwhile: the permit (if any) drops here.
                Ok(permit) if released => drop(permit),
                Ok(permit) => {
                    *state = permit.map_or(Adopted::Done, |p| Adopted::Held { _permit: p });
                }
                Err(err) if err.is_unavailable() => {
                    if !released {
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
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.retain(|a| matches!(*a.lock(), Adopted::Pending | Adopted::Offering));
        self.count.store(pending.len(), Ordering::SeqCst);
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

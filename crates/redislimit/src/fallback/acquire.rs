//! A fallback limiter's acquire: through the in-process limiter and then
//! the primary, or (the primary unavailable) as the outage plan says, at
//! this replica's share of the pace and in its turns; a request sent in
//! process counted in the primary once it answers again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::adoption::{Adopted, Adoptee, Adoptions, Deferred};
use super::plan::{DEFER_RETRY, OutagePlan, Plan, stated_share};
use super::shares::Shares;
use crate::hooks::WaitReport;
use crate::pacing::after;
use crate::permit::Unsent;
use crate::{DomainLimiter, Error, Hooks, HostKey, Limiter, Permit, RequestPacing, WaitOutcome};

/// How often an acquire probes the primary for its host while it waits to
/// send on its own (until the replicas still on the primary know this one
/// is cut off), and at most how often it asks again after a call skipped
/// while another call probed the primary and found it back. Only a call
/// finds the primary back (the circuit lets one through as its probe once
/// a second), and the replicas back on it meanwhile admit at their whole
/// limits once their share's grace ends: a send at this replica's share
/// would go beside them.
const ASK_AGAIN: Duration = Duration::from_millis(250);

/// What one acquire of a `FallbackLimiter` works with: its parts, borrowed.
pub(super) struct Acquire<'a, P> {
    pub(super) primary: &'a Arc<P>,
    pub(super) fallback: &'a DomainLimiter,
    pub(super) hooks: &'a dyn Hooks,
    pub(super) outage: Option<&'a dyn OutagePlan>,
    pub(super) shares: &'a Arc<Shares>,
    pub(super) adoptions: &'a Arc<Adoptions>,
    pub(super) deferred: &'a Deferred,
    pub(super) degraded: &'a AtomicBool,
}

impl<P: Limiter + 'static> Acquire<'_, P> {
    /// [`Limiter::acquire_host`] through the primary, or the fallback while
    /// the primary is unavailable.
    pub(super) async fn run(
        &self,
        engine: &str,
        host: HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> Result<Permit, Error> {
        // Hooks name the key, as the limiters below do.
        let key = self.fallback.policies().key(&host);
        let mut report = WaitReport::new(self.hooks, engine, &key, Instant::now());
        // Whether this acquire waits to send on its own (logged once).
        let mut cut_off = false;
        // When a skipped call was last asked again (see `ASK_AGAIN`).
        let mut asked_again: Option<Instant> = None;
        loop {
            // Requests this process sent during an outage count in the
            // primary before it admits anything else for their host.
            if self.adoptions.pending() {
                let offer = self.adoptions.offer(&**self.primary, Some(&key));
                match deadline {
                    // What is left is the background task's to finish.
                    Some(deadline) => drop(tokio::time::timeout_at(deadline, offer).await),
                    None => offer.await,
                }
            }
            // Until the primary has decided, this admission is
            // provisional: a refusal or a dropped future takes it back. It
            // is made at weight 1, so that a heavy request the primary
            // refuses for want of room does not hold back lighter ones
            // here (the primary alone knows the shared room); its whole
            // weight is recorded once the primary admits it. A weight the
            // fallback could never admit is refused here all the same.
            let limits = self.fallback.policies().pacing_for(&host);
            request
                .check_weight(&key, limits.max_concurrent(), limits.quota())
                .map_err(|e| report.fail(e))?;
            let local = Unsent::new(
                self.fallback
                    .acquire_with(engine, host.clone(), deadline, request.with_weight(1))
                    .await
                    .map_err(|e| report.fail(e))?,
            );
            // During an outage and just after it, take this replica's
            // turn (as the replicas still pacing in-process do) before
            // the primary is asked, so that an admission by the primary
            // is the send it records, and one by the fallback keeps the
            // turns too.
            // A replica whose part of a cap the host stated is none takes
            // no turn, as for a host another replica serves: through the
            // outage it asks the primary (waiting below while it does not
            // answer); in the grace after it, while the others may still
            // send their parts, it waits. Either way its first admission
            // by the primary is given back (see `Deferred`).
            let turns = self.shares.turns(Instant::now());
            let none_of = turns.and_then(|turns| self.no_part(&key, turns));
            let (turn, turn_ends) = match (turns, none_of) {
                (Some(_), Some(cap)) => {
                    self.deferred.mark(&key, cap);
                    if !self.shares.unanswered() {
                        drop(local);
                        if let Err((retry, deadline)) = defer(deadline).await {
                            let now = Instant::now();
                            return Err(report.over_budget(retry, deadline, now));
                        }
                        continue;
                    }
                    (None, None)
                }
                (Some(turns), None) => {
                    let shared = self
                        .share(turns, false, engine, &host, deadline, request)
                        .await
                        .map_err(|e| report.fail(e))?;
                    // The host stated a cap since, of which this replica
                    // has no part: the next pass defers, as above.
                    let Some((permit, ends)) = shared else {
                        continue;
                    };
                    (Some((turns, Unsent::new(permit))), Some(ends))
                }
                (None, _) => (None, None),
            };
            // A turn is a slot's start: the primary must admit within a
            // moment of it (`turn_ends`), or the send would leave in the
            // next replica's slot (which may still be pacing in-process).
            let ask_until = match (deadline, turn_ends) {
                (Some(d), Some(t)) => Some(d.min(t)),
                (d, t) => d.or(t),
            };
            let asking = Instant::now();
            let asked = match turn_ends {
                Some(ends) if self.shares.unanswered() => {
                    self.probe(engine, &host, ask_until, ends, request).await
                }
                _ => {
                    self.primary
                        .acquire_with(engine, host.clone(), ask_until, request)
                        .await
                }
            };
            if answers(&**self.primary, &asked, asking) {
                self.answered();
            }
            let err = match asked {
                Ok(shared) => {
                    if turn_ends.is_some_and(|ends| Instant::now() > ends) {
                        // Admitted too late for this turn: not sent,
                        // taken back; the next turn asks again.
                        shared.abandon();
                        continue;
                    }
                    if let Some(settled) = self.deferred.hold(&key, Instant::now()) {
                        // The first admissions since this replica deferred
                        // the host: the replica that served it may still
                        // be sending in-process, unseen by a primary that
                        // came back empty. Given back; asked for again
                        // once that replica has had time to tell it.
                        shared.abandon();
                        let now = Instant::now();
                        if let Some(deadline) = deadline
                            && settled > deadline
                        {
                            return Err(report.over_budget(settled, deadline, now));
                        }
                        tracing::debug!(host = %host, "the primary answers again: waiting for the replica that served the host during the outage");
                        tokio::time::sleep_until(settled).await;
                        continue;
                    }
                    let share = turn.and_then(|(_, turn)| turn.take());
                    // The request leaves now, perhaps long after the
                    // local admission (the primary may have made it
                    // wait): the local gap and quota count from now, so
                    // the next send keeps this process's own spacing
                    // whoever admits it.
                    let mut local = local.take();
                    if let Some(local) = &mut local {
                        leave(local).await;
                        local.reweigh(request.weight());
                    }
                    let waited = report.finish(WaitOutcome::Acquired);
                    return Ok(Permit::joint(
                        key,
                        waited,
                        Box::new([share, Some(shared), local]),
                    ));
                }
                Err(err) if err.is_unavailable() => {
                    // Skipped while another call probed the primary and
                    // found it back (for this host): asked again, not sent
                    // at this replica's share beside the others, who may be
                    // back at their whole limits. At most once an
                    // `ASK_AGAIN`, so that nothing spins.
                    let now = Instant::now();
                    if err.is_skipped()
                        && asked_again.is_none_or(|at| now >= after(at, ASK_AGAIN))
                        && crate::limiter::coordination(&**self.primary)
                            .is_some_and(|c| c.answers_for(&host))
                    {
                        asked_again = Some(now);
                        continue;
                    }
                    err
                }
                Err(Error::WaitBudget { wait, .. })
                    if turn_ends.is_some_and(|ends| {
                        deadline.is_none_or(|d| ends < d && after(Instant::now(), wait) <= d)
                    }) =>
                {
                    // Not admitted within this turn, and the caller's
                    // budget allows the wait: the next turn. (The call may
                    // have been cut short without an answer: this says
                    // nothing about whether the outage is over.)
                    continue;
                }
                Err(err) => return Err(report.fail(err)),
            };
            // The primary may have taken the budget to fail.
            let now = Instant::now();
            if let Some(deadline) = deadline
                && now >= deadline
            {
                return Err(report.over_budget(now, deadline, now));
            }
            let plan = self.outage.map_or(Plan::Alone, |o| o.plan(&host));
            // Sending on its own (at its share, as the host's one server,
            // or alone while a replica it has not seen yet may be sending)
            // waits until the replicas still on the primary know this one
            // is cut off, and keep its share free.
            // Meanwhile it probes the primary for the host every
            // `ASK_AGAIN`, so that the primary, if it is back (the others
            // may be back on it, at their whole limits), is asked when the
            // wait ends rather than skipped. The wait keeps its length: a
            // primary back empty knows nothing of what was in flight when
            // it went.
            let alone_from = self.outage.and_then(|o| o.alone_from(plan));
            if let Some(from) = alone_from
                && from > now
            {
                drop((local, turn));
                if let Some(deadline) = deadline
                    && from > deadline
                {
                    tokio::time::sleep_until(deadline).await;
                    let now = Instant::now();
                    return Err(report.over_budget(from, deadline, now));
                }
                if !cut_off {
                    cut_off = true;
                    tracing::debug!(host = %host, "cut off from the primary: waiting until the other replicas know");
                }
                if let Some(c) = crate::limiter::coordination(&**self.primary) {
                    let mut next = after(now, ASK_AGAIN);
                    while next < from {
                        tokio::time::sleep_until(next).await;
                        // Bounded by the wait: a primary without timeouts
                        // cannot hold it past `from`.
                        let _ = tokio::time::timeout_at(from, c.probe_host(&host)).await;
                        next = after(Instant::now(), ASK_AGAIN);
                    }
                }
                tokio::time::sleep_until(from).await;
                continue;
            }
            // (A cap the host stated since the turn was taken, of which
            // this replica's part is none, defers below instead.)
            if let Some(((n, index), turn)) = turn
                && plan == (Plan::Share { n, index })
                && self.no_part(&key, (n, index)).is_none()
            {
                // The outage goes on (its grace starts again when the
                // primary next answers) and the turn is taken: the send
                // keeps this process's own gap as it leaves.
                self.shares.failed();
                let mut local = local.take();
                if let Some(local) = &mut local {
                    leave(local).await;
                    local.reweigh(request.weight());
                }
                let share = turn.take();
                let waited = report.finish(WaitOutcome::Acquired);
                return Ok(self.outage_permit(host, request.weight(), waited, local, share));
            }
            // The provisional admission was made before the wait on the
            // primary; sending on it now could follow this process's
            // last send too closely, and waiters that fail over
            // together would all go at once. Give it back and queue
            // again for a real admission, which waits for the gap from
            // the latest send this process made. A turn taken for the
            // primary is given back too: the outage takes its own.
            drop(local);
            let none_of = match plan {
                Plan::Share { n, index } => self.no_part(&key, (n, index)),
                _ => None,
            };
            if plan == Plan::Defer || none_of.is_some() {
                // Another replica serves this host during the outage (or
                // has the whole of the cap it stated).
                self.deferred.add(&key, none_of);
                if let Err((retry, deadline)) = defer(deadline).await {
                    let now = Instant::now();
                    return Err(report.over_budget(retry, deadline, now));
                }
                continue;
            }
            if self.degraded.swap(true, Ordering::Relaxed) {
                tracing::debug!(host = %host, error = %crate::error::Causes(&err), %plan, "pacing in-process");
            } else {
                tracing::warn!(host = %host, error = %crate::error::Causes(&err), %plan, "the shared limiter is unavailable: pacing in-process");
                self.hooks.on_fallback(true);
            }
            // Taken back unless sent (a blown budget, a dropped future).
            let local = Unsent::new(
                self.fallback
                    .acquire_with(engine, host.clone(), deadline, request)
                    .await
                    .map_err(|e| report.fail(e))?,
            );
            let share = match plan {
                Plan::Share { n, index } => {
                    let shared = self
                        .share((n, index), true, engine, &host, deadline, request)
                        .await
                        .map_err(|e| report.fail(e))?;
                    // No part of a cap the host stated while this acquire
                    // waited: the next pass defers (the local admission is
                    // taken back).
                    let Some((permit, _)) = shared else {
                        continue;
                    };
                    Some(permit)
                }
                _ => None,
            };
            let mut local = local.take();
            if let Some(local) = &mut local {
                leave(local).await;
            }
            let waited = report.finish(WaitOutcome::Acquired);
            return Ok(self.outage_permit(host, request.weight(), waited, local, share));
        }
    }

    /// Asks the primary for a request taking its turn during an outage,
    /// which is how the primary's circuit learns that it is back: the
    /// answer is waited for until the turn's window `ends`, no longer. Past
    /// it the request goes on as if the primary were unavailable (at its
    /// share, in this turn), and the call runs on unwatched for as long as
    /// the primary bounds it: an answer then still tells the circuit, and
    /// an admission it brings is released at once (the request was sent,
    /// no later than the primary records it). Waited for beyond the turn,
    /// a primary that does not answer cost the turn of every request that
    /// probed it: with a period over a second, most turns.
    async fn probe(
        &self,
        engine: &str,
        host: &HostKey,
        ask_until: Option<Instant>,
        ends: Instant,
        request: RequestPacing,
    ) -> Result<Permit, Error> {
        let (primary, shares) = (Arc::clone(self.primary), Arc::clone(self.shares));
        let (engine, host) = (engine.to_owned(), host.clone());
        let mut call = tokio::spawn(async move {
            let asking = Instant::now();
            let asked = primary
                .acquire_with(&engine, host, ask_until, request)
                .await;
            // An answer that comes after the turn still ends the outage for
            // this replica: its grace starts, and its next request asks
            // the primary in full. (Else a primary slower to answer than a
            // turn's window would keep the replica on its share for good.)
            if answers(&*primary, &asked, asking) {
                shares.answered(Instant::now());
            }
            asked
        });
        match tokio::time::timeout_at(ends, &mut call).await {
            Ok(Ok(asked)) => asked,
            Ok(Err(join)) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Ok(Err(join)) => Err(Error::unavailable(crate::Op::Acquire, join)),
            // Dropping the handle detaches the call; what it returns is
            // dropped when it ends.
            Err(_) => Err(Error::unavailable(
                crate::Op::Acquire,
                "no answer within this replica's turn",
            )),
        }
    }

    /// The cap on requests in flight `host` (of `key`) stated, when this
    /// replica's part of it is none, replica `index` of `n` dividing it
    /// (see `stated_share`): the others then serve the host. The cap in
    /// force here, or, once it lapsed here, the one the host was deferred
    /// for, until the primary admits the host again: the replicas with a
    /// part of it hear it restated in their responses, this one (sending
    /// nothing) does not, and taking its share of the configured cap back
    /// would add to their parts of the stated one.
    pub(super) fn no_part(&self, key: &HostKey, (n, index): (u32, u32)) -> Option<u32> {
        let cap = self
            .stated_cap(key)
            .map(|(cap, _)| cap)
            .or_else(|| self.deferred.stated(key))?;
        (stated_share(cap, n, index) == 0).then_some(cap)
    }

    /// The cap on requests in flight the host of `key` stated, and until
    /// when, as the outage keeps it (see `Shares::stated`): also once it
    /// lapsed here, while the primary has not answered since.
    pub(super) fn stated_cap(&self, key: &HostKey) -> Option<(u32, Instant)> {
        self.shares.stated(key, Instant::now())
    }

    /// The primary answered: the share's grace starts (once its turns end,
    /// this replica asks it as the others do), and pacing is shared again.
    fn answered(&self) {
        self.shares.answered(Instant::now());
        if self.degraded.swap(false, Ordering::Relaxed) {
            tracing::info!("the shared limiter answers again: pacing is shared");
            self.hooks.on_fallback(false);
        }
    }

    /// The permit of a request sent in-process during an outage: counted in
    /// the primary as soon as it answers again.
    fn outage_permit(
        &self,
        host: HostKey,
        weight: u32,
        waited: Duration,
        local: Option<Permit>,
        share: Option<Permit>,
    ) -> Permit {
        let gap = self.fallback.policies().pacing_for(&host).min_delay();
        let adoptee = Arc::new(Adoptee {
            key: self.fallback.policies().key(&host),
            host: host.clone(),
            weight,
            sent: Instant::now(),
            state: Mutex::new(Adopted::Pending),
        });
        self.adoptions.add(Arc::clone(&adoptee), self.primary);
        let parts = Arc::new(Mutex::new(Some((adoptee, share, local))));
        let back = Arc::clone(&parts);
        // Nothing is left to count in the primary once the request ends,
        // but its end: until a gap after it, the primary (back, perhaps
        // empty) holds the host when told (`Adopted::Trace`); a request
        // never sent leaves nothing.
        let take = move |parts: &Mutex<Option<_>>, sent: bool| {
            let taken = parts.lock().unwrap_or_else(PoisonError::into_inner).take();
            taken.map(|(adoptee, share, local): (Arc<Adoptee>, _, _)| {
                let mut state = adoptee.lock();
                let counted = matches!(*state, Adopted::Held { .. } | Adopted::Done);
                let end = if sent && !counted && !gap.is_zero() {
                    Adopted::Trace {
                        not_before: after(Instant::now(), gap),
                    }
                } else {
                    Adopted::Done
                };
                drop(std::mem::replace(&mut *state, end));
                (share, local)
            })
        };
        let key = self.fallback.policies().key(&host);
        Permit::new(key, waited, move || drop(take(&parts, true))).on_abandon(move || {
            if let Some((share, local)) = take(&back, false) {
                share.into_iter().chain(local).for_each(Permit::abandon);
            }
        })
    }
}

/// Records `local`'s request as leaving now, after waiting (at most one
/// `min_delay`) if another request of this process left too recently: an
/// admission by the primary that came back and one made in-process during
/// its absence could otherwise fall together.
async fn leave(local: &mut Permit) {
    while let Err(at) = local.try_send(Instant::now()) {
        tokio::time::sleep_until(at).await;
    }
}

/// Whether `asked`, what `primary` said to a call made at `asking`, is the
/// primary's answer: an admission, or a wait its backend named (not one its
/// own queues named, nor a deadline that cut the call short).
fn answers<P: Limiter + ?Sized>(
    primary: &P,
    asked: &Result<Permit, Error>,
    asking: Instant,
) -> bool {
    match asked {
        Ok(_) => true,
        Err(Error::WaitBudget { .. }) => {
            crate::limiter::coordination(primary).is_some_and(|c| c.answered_since(asking))
        }
        Err(_) => false,
    }
}

/// Waits while another replica serves a host (the outage's plan, or the
/// parts of a cap it stated), then the caller asks again: for
/// [`DEFER_RETRY`], or fails at `deadline` when that comes first (with
/// when the retry would have been, and the deadline).
async fn defer(deadline: Option<Instant>) -> Result<(), (Instant, Instant)> {
    let retry = after(Instant::now(), DEFER_RETRY);
    match deadline {
        Some(deadline) if retry >= deadline => {
            tokio::time::sleep_until(deadline).await;
            Err((retry, deadline))
        }
        _ => {
            tokio::time::sleep_until(retry).await;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::limiter::sealed;
    use crate::{BoxFuture, FallbackLimiter, Op, Pacing};

    const MS: Duration = Duration::from_millis(1);

    /// A primary that is away until `up` is set, then admits through an
    /// in-process limiter, counting what it admitted; it answers for every
    /// host while `up` is set. While away, its calls fail as `away` makes
    /// them (timed out, or skipped by its circuit); `probed`: whether
    /// another call finds it back while the first one fails (`up` is then
    /// set). With `ahead` set, it is reachable (`up` is then set) only
    /// once `probe_host` has run after `ahead`, as a circuit that other
    /// calls skip until a probe closes it.
    #[derive(Debug)]
    struct Returning {
        up: Arc<AtomicBool>,
        away: fn() -> Error,
        probed: bool,
        ahead: Option<Instant>,
        probes: AtomicUsize,
        inner: DomainLimiter,
        admitted: AtomicUsize,
    }

    impl Returning {
        fn new(up: &Arc<AtomicBool>, away: fn() -> Error, probed: bool) -> Self {
            Self {
                up: Arc::clone(up),
                away,
                probed,
                ahead: None,
                probes: AtomicUsize::new(0),
                inner: unpaced(),
                admitted: AtomicUsize::new(0),
            }
        }
    }

    fn unpaced() -> DomainLimiter {
        DomainLimiter::new(Pacing::builder().max_concurrent(4).build().unwrap())
    }

    impl Limiter for Returning {
        fn acquire_with<'a>(
            &'a self,
            engine: &'a str,
            host: HostKey,
            deadline: Option<Instant>,
            request: RequestPacing,
        ) -> BoxFuture<'a, Result<Permit, Error>> {
            Box::pin(async move {
                if !self.up.load(Ordering::SeqCst) {
                    self.up.store(self.probed, Ordering::SeqCst);
                    return Err((self.away)());
                }
                let permit = self
                    .inner
                    .acquire_with(engine, host, deadline, request)
                    .await?;
                self.admitted.fetch_add(1, Ordering::SeqCst);
                Ok(permit)
            })
        }

        fn penalize_host<'a>(
            &'a self,
            host: HostKey,
            hold: Duration,
        ) -> BoxFuture<'a, Result<(), Error>> {
            self.inner.penalize_host(host, hold)
        }

        fn coordination(&self, _: sealed::Token) -> Option<&dyn sealed::Coordination> {
            Some(self)
        }
    }

    impl sealed::Coordination for Returning {
        fn answers_for(&self, _: &HostKey) -> bool {
            self.up.load(Ordering::SeqCst)
        }

        fn probe_host<'a>(&'a self, _: &HostKey) -> BoxFuture<'a, ()> {
            self.probes.fetch_add(1, Ordering::SeqCst);
            if self.ahead.is_some_and(|at| Instant::now() >= at) {
                self.up.store(true, Ordering::SeqCst);
            }
            Box::pin(std::future::ready(()))
        }
    }

    /// Every host served by this replica alone during an outage, from
    /// `from` (once the others know it is cut off; at once when `None`).
    #[derive(Debug)]
    struct CutOff {
        from: Option<Instant>,
    }

    impl OutagePlan for CutOff {
        fn plan(&self, _: &HostKey) -> Plan {
            Plan::Own
        }

        fn alone_from(&self, _: Plan) -> Option<Instant> {
            self.from
        }
    }

    fn host() -> HostKey {
        HostKey::parse("http://a.test/").unwrap()
    }

    /// Regression (a Cluster failover mid-crawl): an acquire waiting to send
    /// on its own slept until the others knew it was cut off, and no call
    /// of its replica found the primary back meanwhile; when the wait
    /// ended, another call took the circuit's probe, this one was skipped
    /// and sent at its share, beside the others back on the primary at
    /// their whole limits. It probes the primary while it waits (the wait
    /// keeps its length), and the primary admits it when the wait ends.
    #[tokio::test(start_paused = true)]
    async fn a_primary_back_while_an_acquire_waits_to_send_alone_admits_it() {
        let up = Arc::new(AtomicBool::new(false));
        let skipped = || Error::unavailable(Op::Acquire, crate::error::Skipped);
        let start = Instant::now();
        let plan = CutOff {
            from: Some(start + 2500 * MS),
        };
        let primary = Returning {
            ahead: Some(start + 300 * MS),
            ..Returning::new(&up, skipped, false)
        };
        let limiter = FallbackLimiter::new(primary, unpaced()).with_outage_plan(Arc::new(plan));
        let permit = limiter.acquire_host("t", host(), None).await.unwrap();
        assert_eq!(
            start.elapsed(),
            2500 * MS,
            "the wait did not keep its length"
        );
        assert_eq!(limiter.primary().admitted.load(Ordering::SeqCst), 1);
        assert_eq!(limiter.in_process_admissions(), 0);
        // Probed every 250 ms through the wait (a Redis circuit makes a
        // probe nothing once it answers).
        assert_eq!(limiter.primary().probes.load(Ordering::SeqCst), 9);
        drop(permit);
    }

    /// Regression (the same failover): an acquire whose call the circuit
    /// skipped, while another call of its replica probed the primary and
    /// found it back, sent at its share at once. It asks again.
    #[tokio::test(start_paused = true)]
    async fn a_call_skipped_while_a_probe_found_the_primary_back_is_asked_again() {
        let up = Arc::new(AtomicBool::new(false));
        let skipped = || Error::unavailable(Op::Acquire, crate::error::Skipped);
        let primary = Returning::new(&up, skipped, true);
        let limiter = FallbackLimiter::new(primary, unpaced())
            .with_outage_plan(Arc::new(CutOff { from: None }));
        // The first call is skipped; the probe beside it answers meanwhile.
        let start = Instant::now();
        let permit = limiter.acquire_host("t", host(), None).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(limiter.primary().admitted.load(Ordering::SeqCst), 1);
        assert_eq!(limiter.in_process_admissions(), 0);
        drop(permit);

        // Skipped while the primary's part for the host does not answer:
        // sent in-process at once, as before.
        let up = Arc::new(AtomicBool::new(false));
        let away = Returning::new(&up, skipped, false);
        let limiter =
            FallbackLimiter::new(away, unpaced()).with_outage_plan(Arc::new(CutOff { from: None }));
        let start = Instant::now();
        let permit = limiter.acquire_host("t", host(), None).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(limiter.in_process_admissions(), 1);
        drop(permit);
    }
}

//! `Permit`: the right to send one request, released exactly once; and
//! `Unsent`, an admission taken back unless its request leaves.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::HostKey;
use crate::local::LocalAdmission;

type ReleaseFn = Box<dyn FnOnce() + Send + Sync>;

/// What a limiter of this crate keeps of a permit it admitted, in one
/// allocation of its own, which the permit holds: releasing or abandoning
/// the permit tells it once.
pub(crate) trait Holder: Send + Sync {
    /// The permit was released, or `abandoned` (its request never sent).
    fn give_back(&self, abandoned: bool);
}

/// How a permit is released.
enum Release {
    /// Closures an implementor of [`Limiter`] gave.
    Closures {
        release: ReleaseFn,
        abandon: Option<ReleaseFn>,
    },
    /// A limiter's own record of the admission (see [`Holder`]).
    Held(std::sync::Arc<dyn Holder>),
    /// Permits of one admission made in parts (a `FallbackLimiter`'s),
    /// released, or abandoned, together and in order.
    Joint(Box<[Option<Permit>]>),
    /// An in-process admission, held in the permit itself (no allocation);
    /// `sent` once its send was recorded.
    Local {
        admitted: LocalAdmission,
        sent: bool,
    },
}

/// The right to send one request to one host.
///
/// The request counts as in flight until the permit is released, by
/// [`release`](Self::release) or by dropping it, whichever comes first;
/// release happens exactly once. For HTTP, keep the permit until the
/// response body has been read to the end or dropped: a slow download is
/// still a request in flight.
#[must_use = "dropping a permit releases it at once"]
pub struct Permit {
    host: HostKey,
    waited: Duration,
    release: Option<Release>,
}

impl Permit {
    /// A permit for `host` that runs `release` exactly once when released or
    /// dropped. For implementors of [`Limiter`](crate::Limiter).
    pub fn new(
        host: HostKey,
        waited: Duration,
        release: impl FnOnce() + Send + Sync + 'static,
    ) -> Self {
        Self {
            host,
            waited,
            release: Some(Release::Closures {
                release: Box::new(release),
                abandon: None,
            }),
        }
    }

    /// A permit for an in-process admission.
    pub(crate) fn admitted(host: HostKey, waited: Duration, admitted: LocalAdmission) -> Self {
        Self {
            host,
            waited,
            release: Some(Release::Local {
                admitted,
                sent: false,
            }),
        }
    }

    /// A permit for an admission `holder` records.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn held(
        host: HostKey,
        waited: Duration,
        holder: std::sync::Arc<dyn Holder>,
    ) -> Self {
        Self {
            host,
            waited,
            release: Some(Release::Held(holder)),
        }
    }

    /// One permit made of `parts`: releasing it releases them all, and
    /// abandoning it abandons them all (each as far as it can be taken
    /// back), in order.
    pub(crate) fn joint(host: HostKey, waited: Duration, parts: Box<[Option<Permit>]>) -> Self {
        Self {
            host,
            waited,
            release: Some(Release::Joint(parts)),
        }
    }

    /// The same permit, as granted after waiting `waited`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn waited_for(mut self, waited: Duration) -> Self {
        self.waited = waited;
        self
    }

    /// What [`abandon`](Self::abandon) runs instead of the release: taking
    /// the admission back. For implementors of [`Limiter`](crate::Limiter).
    pub fn on_abandon(mut self, abandon: impl FnOnce() + Send + Sync + 'static) -> Self {
        if let Some(Release::Closures { abandon: slot, .. }) = &mut self.release {
            *slot = Some(Box::new(abandon));
        }
        self
    }

    /// Records that the request leaves at `at` (no earlier than it was
    /// admitted), so the gap and the quota count from `at`; or, when
    /// another request of this limiter was sent too recently for that,
    /// refuses with the instant from which it may leave. Recorded once;
    /// [`abandon`](Self::abandon) takes the record back too, unless the
    /// host recorded something else since.
    pub(crate) fn try_send(&mut self, at: Instant) -> Result<(), Instant> {
        if let Some(Release::Local { admitted, sent }) = &mut self.release
            && !*sent
        {
            admitted.try_send(&self.host, at)?;
            *sent = true;
        }
        Ok(())
    }

    /// Counts the request as weighing `weight` (when more than it was
    /// admitted with) in the limiter that admitted it: a process that
    /// queues a heavy request at weight 1, so that lighter ones are not
    /// held back while a shared limiter decides, records its whole weight
    /// once the shared limiter has admitted it.
    pub(crate) fn reweigh(&mut self, weight: u32) {
        if let Some(Release::Local { admitted, .. }) = &mut self.release {
            admitted.reweigh(&self.host, weight);
        }
    }

    /// The host this permit admits a request to.
    pub fn host(&self) -> &HostKey {
        &self.host
    }

    /// How long the acquire waited before this permit was granted.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Releases the permit now; the same as dropping it.
    pub fn release(self) {
        drop(self);
    }

    /// Gives the permit back without having sent the request: where the
    /// limiter can, the admission is taken back (it counts neither in the
    /// quota nor as a completion); otherwise this is a release.
    pub fn abandon(mut self) {
        match self.release.take() {
            Some(Release::Closures {
                abandon: Some(abandon),
                ..
            }) => abandon(),
            Some(Release::Closures { release, .. }) => release(),
            Some(Release::Held(holder)) => holder.give_back(true),
            Some(Release::Joint(parts)) => parts.into_iter().flatten().for_each(Permit::abandon),
            Some(Release::Local { admitted, .. }) => admitted.abandon(&self.host),
            None => {}
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        match self.release.take() {
            Some(Release::Closures { release, .. }) => release(),
            Some(Release::Held(holder)) => holder.give_back(false),
            Some(Release::Joint(parts)) => drop(parts),
            Some(Release::Local { admitted, .. }) => admitted.release(&self.host),
            None => {}
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("host", &self.host)
            .field("waited", &self.waited)
            .finish_non_exhaustive()
    }
}

/// An admission whose request has not left yet: abandoned (taken back, as
/// a request never sent) if dropped before it is taken out. For an
/// in-process admission awaiting a shared limiter's decision, and for a
/// slot booked a moment ahead.
pub(crate) struct Unsent(Option<Permit>);

impl Unsent {
    pub(crate) fn new(permit: Permit) -> Self {
        Self(Some(permit))
    }

    /// Confirms the admission: it is no longer taken back. (Always `Some`:
    /// only this, which consumes the guard, takes the permit out.)
    pub(crate) fn take(mut self) -> Option<Permit> {
        self.0.take()
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if let Some(permit) = self.0.take() {
            permit.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn counting_permit() -> (Permit, Arc<AtomicUsize>) {
        let count = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&count);
        let host = HostKey::parse("http://example.com/").unwrap();
        let permit = Permit::new(host, Duration::ZERO, move || {
            c.fetch_add(1, Ordering::SeqCst);
        });
        (permit, count)
    }

    #[test]
    fn drop_releases_once() {
        let (permit, count) = counting_permit();
        assert_eq!(count.load(Ordering::SeqCst), 0);
        drop(permit);
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn explicit_release_releases_once() {
        let (permit, count) = counting_permit();
        permit.release();
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn abandon_runs_instead_of_release_and_falls_back_to_it() {
        let (permit, released) = counting_permit();
        let undone = Arc::new(AtomicUsize::new(0));
        let u = Arc::clone(&undone);
        let permit = permit.on_abandon(move || {
            u.fetch_add(1, Ordering::SeqCst);
        });
        permit.abandon();
        assert_eq!(
            (
                released.load(Ordering::SeqCst),
                undone.load(Ordering::SeqCst)
            ),
            (0, 1)
        );
        let (plain, released) = counting_permit();
        plain.abandon();
        assert_eq!(
            released.load(Ordering::SeqCst),
            1,
            "without an undo, abandon releases"
        );
    }

    /// Records every give-back, in order: (which, abandoned).
    struct Recorder {
        id: usize,
        log: Arc<std::sync::Mutex<Vec<(usize, bool)>>>,
    }

    impl Holder for Recorder {
        fn give_back(&self, abandoned: bool) {
            self.log.lock().unwrap().push((self.id, abandoned));
        }
    }

    fn held(id: usize, log: &Arc<std::sync::Mutex<Vec<(usize, bool)>>>) -> Permit {
        let host = HostKey::parse("http://example.com/").unwrap();
        let log = Arc::clone(log);
        Permit::held(host, Duration::ZERO, Arc::new(Recorder { id, log }))
    }

    #[test]
    fn a_held_permit_tells_its_holder_once_whether_it_was_sent() {
        let log = Arc::default();
        drop(held(1, &log));
        held(2, &log).release();
        held(3, &log).abandon();
        assert_eq!(*log.lock().unwrap(), [(1, false), (2, false), (3, true)]);
    }

    #[test]
    fn a_joint_permit_releases_or_abandons_every_part_in_order() {
        let host = HostKey::parse("http://example.com/").unwrap();
        let log = Arc::default();
        let joint = |first: usize| {
            let parts = [Some(held(first, &log)), None, Some(held(first + 1, &log))];
            Permit::joint(host.clone(), Duration::ZERO, Box::new(parts))
        };
        drop(joint(1));
        joint(3).abandon();
        let mut sent = joint(5);
        // Only an in-process admission records its send; a joint one has
        // nothing to record and never refuses.
        assert_eq!(sent.try_send(Instant::now()), Ok(()));
        sent.release();
        assert_eq!(
            *log.lock().unwrap(),
            [
                (1, false),
                (2, false),
                (3, true),
                (4, true),
                (5, false),
                (6, false)
            ]
        );
    }
}

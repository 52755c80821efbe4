//! What happens inside the pacing middleware on each hop of a request: the
//! `--concurrency` slot it takes once admitted, the robots.txt `Crawl-delay`
//! it applies, the stamp of when it left, and the signal to its host's queue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::Extensions;
use redislimit::http::MaxWait;
use redislimit::{HostKey, Limiter};
use redislimit_reqwest::NotSent;
use reqwest_middleware::{Middleware, Next};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// When the request left (its latest hop), stamped inside the pacing
/// middleware.
#[derive(Debug, Clone, Copy)]
pub(super) struct SentAt(pub(super) SystemTime, pub(super) Instant);

/// Tells the host queue that its head request was admitted (so the next
/// one may start waiting); fired once, by the first hop.
#[derive(Debug, Clone)]
pub(super) struct Admitted(pub(super) Arc<Mutex<Option<oneshot::Sender<()>>>>);

/// The crawl's `--concurrency` slots as one request sees them: the slot
/// it holds (from its first admitted hop to its end), or the way to take
/// one once admitted.
#[derive(Debug, Clone)]
pub(super) struct SlotGate {
    slots: Arc<Semaphore>,
    held: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
}

impl SlotGate {
    pub(super) fn new(slots: &Arc<Semaphore>, held: Option<OwnedSemaphorePermit>) -> Self {
        Self {
            slots: Arc::clone(slots),
            held: Arc::new(Mutex::new(held)),
        }
    }

    /// Holds a slot: the one held, or a free one; false when none is free.
    pub(super) fn take(&self) -> bool {
        let mut held = lock(&self.held);
        if held.is_none() {
            *held = Arc::clone(&self.slots).try_acquire_owned().ok();
        }
        held.is_some()
    }

    /// Gives the slot back.
    pub(super) fn free(&self) {
        drop(lock(&self.held).take());
    }
}

/// The crawl's `--concurrency` slots, and how a URL may ask for its host's
/// turn. An admission is only worth having when it can be sent at once: one
/// that finds every slot busy is handed back, which costs the limiter (with
/// Redis, a script call) as much as the admission did. So a URL asks without
/// a slot only while fewer URLs ask that way than there are free slots, and
/// otherwise takes a slot first and asks holding it. With many hosts and few
/// slots the crawl then asks once per request; with few hosts, whose turns
/// bind, URLs wait for their turns holding no slot, as before.
#[derive(Debug)]
pub(super) struct Slots {
    pub(super) free: Arc<Semaphore>,
    /// URLs waiting for their hosts' turns without a slot.
    asking: AtomicUsize,
}

/// How one attempt asks for its host's turn (see [`Slots`]).
pub(super) enum Ask {
    /// Without a slot; counted among those asking until dropped.
    Free(Asking),
    /// Holding this slot.
    Holding(OwnedSemaphorePermit),
}

/// One URL counted as asking without a slot, until dropped.
pub(super) struct Asking(Arc<Slots>);

impl Drop for Asking {
    fn drop(&mut self) {
        self.0.asking.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Slots {
    pub(super) fn new(concurrency: usize) -> Arc<Self> {
        Arc::new(Self {
            free: Arc::new(Semaphore::new(concurrency)),
            asking: AtomicUsize::new(0),
        })
    }

    /// How many slots are free that no URL asks for.
    pub(super) fn idle(&self) -> usize {
        self.free
            .available_permits()
            .saturating_sub(self.asking.load(Ordering::Acquire))
    }

    /// Counts one more URL asking without a slot, when fewer ask that way
    /// than there are slots free.
    pub(super) fn try_ask_free(self: &Arc<Self>) -> Option<Asking> {
        let mut asking = self.asking.load(Ordering::Acquire);
        loop {
            if asking >= self.free.available_permits() {
                return None;
            }
            match self.asking.compare_exchange_weak(
                asking,
                asking + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(Asking(Arc::clone(self))),
                Err(now) => asking = now,
            }
        }
    }

    /// How the next attempt asks: without a slot when one is likely free
    /// once it is admitted, else holding one (waiting for it first). `None`
    /// when the slots are closed.
    pub(super) async fn ask(self: &Arc<Self>) -> Option<Ask> {
        if let Some(asking) = self.try_ask_free() {
            return Some(Ask::Free(asking));
        }
        Arc::clone(&self.free)
            .acquire_owned()
            .await
            .ok()
            .map(Ask::Holding)
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Inside the pacing middleware, once per hop: takes a `--concurrency`
/// slot for an admitted request (or refuses to send it, so the admission
/// is taken back), stamps when it left and tells its host's queue.
#[derive(Debug)]
pub(super) struct Stamp;

#[async_trait::async_trait]
impl Middleware for Stamp {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        if let Some(gate) = extensions.get::<SlotGate>()
            && !gate.take()
        {
            return Err(reqwest_middleware::Error::Middleware(
                NotSent::new("every --concurrency slot is busy").into(),
            ));
        }
        if let Some(delay) = extensions.get::<CrawlDelay>()
            && HostKey::from_url(req.url()).is_ok_and(|h| h == delay.host)
        {
            // The next request to this host leaves no sooner than the
            // delay after this one, on every replica (penalties are shared).
            let _ = delay
                .limiter
                .penalize_host(delay.host.clone(), delay.delay)
                .await;
        }
        extensions.insert(SentAt(SystemTime::now(), Instant::now()));
        // The queue's budget is for the first hop only: a redirect's next
        // hop waits as long as `--max-wait` allows.
        extensions.remove::<MaxWait>();
        if let Some(Admitted(signal)) = extensions.get::<Admitted>()
            && let Some(tx) = lock(signal).take()
        {
            let _ = tx.send(());
        }
        next.run(req, extensions).await
    }
}

/// A host's robots.txt `Crawl-delay`, applied by [`Stamp`] to its sends.
#[derive(Clone)]
pub(super) struct CrawlDelay {
    pub(super) host: HostKey,
    pub(super) delay: Duration,
    pub(super) limiter: Arc<dyn Limiter>,
}

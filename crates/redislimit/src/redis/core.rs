//! What one `RedisLimiter` is made of, each part with its own job: its
//! settings, the backend that talks to Redis, its hooks, its queues in
//! this process, its part in the scope's agreement and registry, its
//! renewals, its lateness and its lifecycle. The parts know nothing of this
//! aggregate; the acquire, the slots and the other operations take it.

use std::sync::Arc;

use super::agreement::Agreement;
use super::backend::Backend;
use super::gathered::Gathered;
use super::lateness::Lateness;
use super::lifecycle::Lifecycle;
use super::registry::Registry;
use super::renew::Renewals;
use super::settings::Settings;
use crate::{DomainLimiter, Hooks};

/// One limiter's parts (see the module docs).
pub(super) struct Core {
    pub(super) settings: Arc<Settings>,
    pub(super) backend: Arc<Backend>,
    pub(super) hooks: Arc<dyn Hooks>,
    pub(super) queues: Queues,
    /// This limiter's part in its scope's configuration record.
    pub(super) agreement: Arc<Agreement>,
    /// This limiter's entry in its scope's replica registry.
    pub(super) registry: Arc<Registry>,
    /// The first renewals of the permits held, not yet due.
    pub(super) renewals: Arc<Renewals>,
    /// How late this process's sends leave, and the room its acquires ask
    /// for.
    pub(super) lateness: Lateness,
    pub(super) lifecycle: Arc<Lifecycle>,
    /// Completed requests' releases, queued for the next pipeline.
    pub(super) gathered: Gathered,
}

impl Drop for Core {
    /// A limiter dropped without `close()` leaves the scope's registry
    /// too, so that the other replicas do not keep its share free as a
    /// lapsed one's.
    fn drop(&mut self) {
        self.registry.leave_when_dropped(&self.backend);
    }
}

/// The in-process queues an acquire waits in before it asks Redis; they
/// record no hooks of their own.
pub(super) struct Queues {
    /// The per-process cap and FIFO order.
    pub(super) local: DomainLimiter,
    /// One Redis caller per host at a time in this process, in FIFO order
    /// (by priority): requests of weight 1, and (`heavy`) heavier ones.
    pub(super) pollers: DomainLimiter,
    pub(super) heavy: DomainLimiter,
}

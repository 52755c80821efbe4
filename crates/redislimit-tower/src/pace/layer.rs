//! `PaceLayer`: wraps services in [`Pace`].

use std::fmt;
use std::sync::Arc;

use redislimit::Limiter;
use redislimit::http::PaceOptions;
use tower::Layer;

use super::service::Pace;
use super::settings::Settings;

/// Applies per-host pacing to a service; see [`Pace`].
///
/// To follow redirects, put `tower_http`'s `FollowRedirectLayer` outside
/// this layer (before it in a `ServiceBuilder`), so each hop is paced and
/// penalized at its own host; see the [crate docs](crate#redirects).
///
/// Cloning the layer (or a [`Pace`] service) shares the limiter: every
/// clone paces against the same state, which is what makes one limit per
/// host hold across a client's clones.
#[derive(Clone)]
pub struct PaceLayer {
    pub(crate) settings: Arc<Settings>,
}

impl PaceLayer {
    /// Paces through `limiter`, with the engine label `default`.
    pub fn new(limiter: impl Limiter + 'static) -> Self {
        Self::from_arc(Arc::new(limiter))
    }

    /// Paces through a shared limiter.
    pub fn from_arc(limiter: Arc<dyn Limiter>) -> Self {
        Self {
            settings: Arc::new(Settings {
                limiter,
                options: PaceOptions::default(),
            }),
        }
    }

    /// The per-request choices: the default engine label, the longest
    /// wait, the penalty for a bare `429`/`503`, whether rate limit headers
    /// are honored, the adaptive backoff (see [`PaceOptions`]; its default
    /// until set). The backoff also widens on an inner service error that
    /// is a timeout (tower's own or an I/O one) or a refused, reset or cut
    /// connection (see
    /// [`is_transport_failure`](redislimit::http::is_transport_failure)).
    pub fn with_options(self, options: PaceOptions) -> Self {
        let limiter = Arc::clone(&self.settings.limiter);
        Self {
            settings: Arc::new(Settings { limiter, options }),
        }
    }

    /// The per-request choices in force (see
    /// [`with_options`](Self::with_options)).
    pub fn options(&self) -> &PaceOptions {
        &self.settings.options
    }

    /// The limiter this layer paces through: call its
    /// [`close`](Limiter::close) before the program ends, so the last
    /// releases reach Redis.
    pub fn limiter(&self) -> &Arc<dyn Limiter> {
        &self.settings.limiter
    }
}

impl fmt::Debug for PaceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceLayer")
            .field("limiter", &self.settings.limiter)
            .field("options", &self.settings.options)
            .finish()
    }
}

impl<S> Layer<S> for PaceLayer {
    type Service = Pace<S>;

    fn layer(&self, inner: S) -> Pace<S> {
        Pace {
            inner,
            settings: Arc::clone(&self.settings),
        }
    }
}

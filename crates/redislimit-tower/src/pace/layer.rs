//! `PaceLayer`: wraps services in [`Pace`].

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

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

    fn with(mut self, change: impl FnOnce(PaceOptions) -> PaceOptions) -> Self {
        let options = change(self.settings.options.clone());
        let limiter = Arc::clone(&self.settings.limiter);
        self.settings = Arc::new(Settings { limiter, options });
        self
    }

    /// The engine label for requests that carry no [`Engine`](redislimit::http::Engine) extension.
    pub fn with_engine(self, engine: impl Into<Cow<'static, str>>) -> Self {
        self.with(|o| o.with_engine(engine))
    }

    /// The longest a request may wait for its turn; a longer wait fails at
    /// once with [`redislimit::Error::WaitBudget`].
    pub fn with_max_wait(self, max_wait: Duration) -> Self {
        self.with(|o| o.with_max_wait(max_wait))
    }

    /// The penalty for a `429` or `503` that carries no usable `Retry-After`.
    pub fn with_default_penalty(self, penalty: Duration) -> Self {
        self.with(|o| o.with_default_penalty(penalty))
    }

    /// Whether a response whose `RateLimit` field or `X-RateLimit-*`
    /// headers say the budget is spent holds its host until the reset, and
    /// one saying little is left spreads the rest up to it (on by default;
    /// see [`rate_limit_hold`](redislimit::http::rate_limit_hold)).
    pub fn with_rate_limit_headers(self, read: bool) -> Self {
        self.with(|o| o.with_rate_limit_headers(read))
    }

    /// The adaptive backoff for a `429`/`503` without a stated delay, any
    /// other `5xx`, and an inner service error that is a timeout (tower's
    /// own or an I/O one) or a refused, reset or cut connection (see
    /// [`Backoff`](redislimit::http::Backoff) and
    /// [`is_transport_failure`](redislimit::http::is_transport_failure));
    /// `None` switches it off. On by default.
    pub fn with_backoff(self, backoff: Option<redislimit::http::Backoff>) -> Self {
        self.with(|o| o.with_backoff(backoff))
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

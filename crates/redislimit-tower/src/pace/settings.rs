//! What a [`PaceLayer`](super::PaceLayer) and its services share: the limiter and
//! the options.

use std::sync::Arc;

use redislimit::Limiter;
use redislimit::http::PaceOptions;

/// The limiter and options every clone of a layer and its services paces with.
pub(crate) struct Settings {
    pub(crate) limiter: Arc<dyn Limiter>,
    pub(crate) options: PaceOptions,
}

//! HTTP helpers shared by the middleware crates (feature `http`): the body
//! that holds a permit until the response is read, `Retry-After` handling,
//! and the per-request engine label.

mod body;
mod options;
mod retry_after;

use std::borrow::Cow;

pub use self::body::PermitBody;
pub use self::options::PaceOptions;
pub use self::retry_after::{penalty, retry_after};

/// A request extension naming the engine (the caller label in hooks and
/// metrics) for this request, overriding the middleware's default.
///
/// ```
/// use redislimit::http::Engine;
///
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Engine::new("search"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Engine(Cow<'static, str>);

impl Engine {
    /// An engine label.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self(name.into())
    }

    /// The label.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

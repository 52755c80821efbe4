//! `SharedCache`: small values fetched by one replica for the whole fleet
//! and kept in the limiter's scope (a crawl's robots.txt, once per host).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::backend::{Backend, CallError};
use super::keys::RedisKeys;
use super::slots::new_token;
use crate::{Hooks, Op};

/// The first pause between two looks at a value another replica is
/// fetching; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
/// The longest pause between two looks.
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// Values fetched once for every replica of a limiter's scope, kept in
/// Redis beside the pacing state: from [`RedisLimiter::shared_cache`](crate::RedisLimiter::shared_cache).
///
/// [`get_or_fetch`](Self::get_or_fetch) reads a name's value; when there
/// is none (or it is no longer fresh), one replica claims the fetch and
/// the others wait for its result, so that a fleet asks a server once. A
/// claim lapses after the wait its callers allow, so a replica that dies
/// while fetching holds the others up no longer than that; when Redis
/// cannot be asked, each replica fetches for itself, and says so.
///
/// Cheap to clone.
#[derive(Clone)]
pub struct SharedCache {
    backend: Arc<Backend>,
    hooks: Arc<dyn Hooks>,
    prefix: Arc<str>,
    scope: Arc<str>,
    kind: Arc<str>,
}

/// A value to keep, and for how long (Redis expires it then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fresh {
    /// The value.
    pub value: Vec<u8>,
    /// How long Redis keeps it.
    pub keep: Duration,
}

/// What [`SharedCache::get_or_fetch`] gave, and where it came from.
#[derive(Debug)]
pub enum Cached {
    /// Found in Redis: another replica, or an earlier run, fetched it.
    Found(Vec<u8>),
    /// Fetched here and kept in Redis for the other replicas.
    Fetched(Vec<u8>),
    /// Fetched here alone: Redis could not be asked, or could not keep it
    /// (the error says why), so the other replicas fetch it themselves.
    Alone(Vec<u8>, crate::Error),
}

impl Cached {
    /// The value, wherever it came from.
    pub fn value(&self) -> &[u8] {
        match self {
            Self::Found(v) | Self::Fetched(v) | Self::Alone(v, _) => v,
        }
    }

    /// The value, wherever it came from.
    pub fn into_value(self) -> Vec<u8> {
        match self {
            Self::Found(v) | Self::Fetched(v) | Self::Alone(v, _) => v,
        }
    }
}

impl SharedCache {
    pub(super) fn new(
        backend: Arc<Backend>,
        hooks: Arc<dyn Hooks>,
        prefix: &str,
        scope: &str,
        kind: &str,
    ) -> Self {
        Self {
            backend,
            hooks,
            prefix: prefix.into(),
            scope: scope.into(),
            kind: kind.into(),
        }
    }

    /// The value of `name`, when Redis holds one that `fresh` accepts;
    /// otherwise `fetch` runs (given the value that was not fresh, if any)
    /// on one replica, which keeps its result for the others. A replica
    /// that finds the fetch claimed looks again, more slowly each time,
    /// for at most `wait` (and takes the claim over if it lapses); after
    /// `wait` it fetches itself. `wait` is also how long a claim lasts: set
    /// it above the longest a fetch takes.
    ///
    /// Never fails: when Redis cannot be asked, `fetch` runs here and the
    /// value comes back as [`Cached::Alone`]. Dropping the future while it
    /// fetches leaves the claim to lapse.
    pub async fn get_or_fetch<Fut>(
        &self,
        name: &str,
        wait: Duration,
        fresh: impl Fn(&[u8]) -> bool,
        fetch: impl FnOnce(Option<Vec<u8>>) -> Fut,
    ) -> Cached
    where
        Fut: Future<Output = Fresh>,
    {
        let (key, claim) = RedisKeys::shared(&self.prefix, &self.scope, &self.kind, name);
        let backend = &*self.backend;
        let token = new_token();
        let deadline = Instant::now() + wait;
        let mut pause = FIRST_PAUSE;
        let mut stale = None;
        let claimed = loop {
            if backend.circuit(&key).open() {
                let why = CallError::Skipped.into_error(Op::Shared);
                return Cached::Alone(fetch(stale).await.value, why);
            }
            match backend.get_bytes(&key).await {
                Ok(Some(value)) if fresh(&value) => return Cached::Found(value),
                Ok(found) => stale = found.or(stale),
                Err(err) => return self.alone(name, err, fetch(stale)).await,
            }
            let now = Instant::now();
            if now >= deadline {
                tracing::warn!(
                    kind = %self.kind,
                    name,
                    "another replica's fetch outlasted the wait; fetching here too"
                );
                break false;
            }
            match backend.set_if_free(&claim, &token, wait).await {
                // The value may have been kept, and its claim ended, between
                // the read above and this claim: read again before fetching.
                Ok(true) => match backend.get_bytes(&key).await {
                    Ok(Some(value)) if fresh(&value) => {
                        // Left to lapse if this fails: the value is kept.
                        let _ = backend.delete(&claim).await;
                        return Cached::Found(value);
                    }
                    Ok(found) => {
                        stale = found.or(stale);
                        break true;
                    }
                    // Fetched under the claim all the same; keeping it
                    // says whether Redis answers.
                    Err(_) => break true,
                },
                Ok(false) => {
                    tokio::time::sleep(pause.min(deadline - now)).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                Err(err) => return self.alone(name, err, fetch(stale)).await,
            }
        };
        let fetched = fetch(stale).await;
        let done = claimed.then_some(claim.as_str());
        match backend
            .set_bytes(&key, &fetched.value, fetched.keep, done)
            .await
        {
            Ok(()) => Cached::Fetched(fetched.value),
            Err(err) => {
                let err = err.into_error(Op::Shared);
                self.hooks.on_error(Op::Shared, &err);
                tracing::warn!(kind = %self.kind, name, error = %crate::error::Causes(&err), "could not keep a shared value; the other replicas fetch it themselves");
                Cached::Alone(fetched.value, err)
            }
        }
    }

    /// Fetches alone after `err`, saying so.
    async fn alone(
        &self,
        name: &str,
        err: CallError,
        fetch: impl Future<Output = Fresh>,
    ) -> Cached {
        let err = err.into_error(Op::Shared);
        self.hooks.on_error(Op::Shared, &err);
        tracing::warn!(kind = %self.kind, name, error = %crate::error::Causes(&err), "Redis could not be asked for a shared value; fetching it here alone");
        Cached::Alone(fetch.await.value, err)
    }
}

impl fmt::Debug for SharedCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedCache")
            .field("scope", &self.scope)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

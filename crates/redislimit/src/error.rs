//! Errors: one enum for everything an acquire or a penalty can fail with.

use std::time::Duration;

/// A boxed error from a backend (Redis, a pool), kept as the `source()` of
/// [`Error::Unavailable`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything a [`Limiter`](crate::Limiter) can fail with.
///
/// Only [`Error::Unavailable`] means "the limiter could not decide"; a
/// fallback wrapper re-runs the acquire
/// on an in-process limiter for that variant and for no other.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend that holds the shared pacing state could not be used:
    /// connection refused, timeout, a script error, a reply of the wrong shape
    /// or a backend error reply. Nothing was admitted. The cause is its
    /// [`source`](std::error::Error::source).
    #[error("pacing backend unavailable during {op}")]
    Unavailable {
        /// The operation that failed.
        op: Op,
        /// What went wrong, as the backend reported it.
        #[source]
        source: BoxError,
    },

    /// The wait the limiter needs is longer than what is left of the caller's
    /// deadline. Returned at once, without sleeping the budget out.
    #[error("waiting {wait:?} for {host} exceeds the remaining budget of {remaining:?}")]
    WaitBudget {
        /// The host that had to be waited for.
        host: String,
        /// How long the wait would have been (at least; when other requests
        /// queue ahead it is a lower bound).
        wait: Duration,
        /// How much of the caller's deadline was left when the limiter gave up.
        remaining: Duration,
    },

    /// The host already had as many acquires waiting in this process as
    /// its pacing's [`max_queued`](crate::pacing::PacingBuilder::max_queued)
    /// allows. Returned at once; nothing was booked.
    #[error("{queued} acquires already wait for {host} (at most {max} may)")]
    QueueFull {
        /// The host (its key).
        host: String,
        /// How many were waiting.
        queued: usize,
        /// The bound.
        max: u32,
    },

    /// A request's [`weight`](crate::RequestPacing::with_weight) is 0, or
    /// more than it can ever fit in: the host's in-flight cap (in the
    /// Redis limiter, also its cross-replica cap; 1 in serialized mode)
    /// or its quota. Returned at once; nothing was booked.
    #[error(
        "a request of weight {weight} can never be admitted to {host} (weights go from 1 to {limit})"
    )]
    InvalidWeight {
        /// The host (its key).
        host: String,
        /// The weight asked for.
        weight: u32,
        /// The largest weight the host admits.
        limit: u32,
    },

    /// The URL could not be parsed, or it has no host to pace (`mailto:`,
    /// `file:///`, `data:` ...).
    #[error("cannot pace {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why no host key could be taken from it.
        reason: &'static str,
    },

    /// The limiter was closed ([`Limiter::close`](crate::Limiter::close)):
    /// it admits nothing any more. Nothing was admitted.
    #[error("the limiter is closed")]
    Closed,

    /// [`Limiter::close`](crate::Limiter::close) reached its deadline with
    /// releases still on their way to the shared backend; their hosts stay
    /// booked until the leases lapse.
    #[error("{pending} release(s) had not reached the pacing backend by the close deadline")]
    CloseIncomplete {
        /// Releases still pending.
        pending: usize,
    },

    /// The pacing configuration was refused at construction.
    #[error(transparent)]
    InvalidConfig(#[from] ConfigError),

    /// The shared backend answered in a way that says it is set up wrong
    /// for this limiter: a password it refuses, a database it does not
    /// have, a server that does not speak RESP, TLS to a plain port, a
    /// command the user may not run. Unlike [`Error::Unavailable`], waiting
    /// will not mend it, so a fallback does not take over: every call fails
    /// with this until the configuration is fixed. Nothing was admitted.
    #[error("the pacing backend is misconfigured ({cause}) during {op}")]
    Misconfigured {
        /// The operation that failed.
        op: Op,
        /// What is wrong.
        cause: Misconfiguration,
        /// The backend's own report.
        #[source]
        source: BoxError,
    },

    /// Replicas sharing one scope disagree on the settings that decide
    /// admission; this one is refused so that the scope keeps one limit.
    /// Nothing was admitted. Once the replicas with the other settings
    /// have been idle long enough for the scope's record to expire (its
    /// longest window, at least `lease_ttl` + `min_delay`, plus a second),
    /// the next replica to acquire records its own settings.
    #[error(
        "the replicas of scope {scope:?} pace with other settings: this one has \
         [{ours}], the scope has [{theirs}]"
    )]
    ConfigMismatch {
        /// The scope (with its key prefix) whose record disagreed.
        scope: String,
        /// This limiter's settings, as recorded.
        ours: String,
        /// The settings recorded in the scope by another replica.
        theirs: String,
    },
}

impl Error {
    /// Wraps a backend failure of `op` as [`Error::Unavailable`].
    pub fn unavailable(op: Op, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            op,
            source: source.into(),
        }
    }

    /// True for [`Error::Unavailable`]: the limiter could not decide, and a
    /// fallback may.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Whether this is [`Error::Unavailable`] for a call that was not made:
    /// the backend failed to answer moments ago, and only one call a second
    /// asks it again (see [`Skipped`]).
    pub(crate) fn is_skipped(&self) -> bool {
        matches!(self, Self::Unavailable { source, .. } if source.is::<Skipped>())
    }
}

/// The source of [`Error::Unavailable`] for a call skipped because the
/// backend failed to answer moments ago: the call was not made.
#[derive(Debug, thiserror::Error)]
#[error("Redis failed to answer moments ago; it is asked again once a second")]
pub(crate) struct Skipped;

/// What [`Error::Misconfigured`] found wrong with the backend's setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Misconfiguration {
    /// The server refused the credentials (`WRONGPASS`), or wants some and
    /// was given none (`NOAUTH`).
    Authentication,
    /// The user may not run a command the limiter needs (`NOPERM`).
    Permission,
    /// The server has no database of the index asked for.
    Database,
    /// What answered does not speak RESP (an HTTP server, say).
    NotRedis,
    /// TLS does not work with this server: it speaks plain RESP on a port
    /// given as `rediss://`, or its certificate is not trusted.
    Tls,
}

impl Misconfiguration {
    /// A short name, as used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Authentication => "authentication",
            Self::Permission => "permission",
            Self::Database => "database",
            Self::NotRedis => "not Redis",
            Self::Tls => "TLS",
        }
    }
}

impl std::fmt::Display for Misconfiguration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operation of a limiter that an error or a hook refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Waiting for admission.
    Acquire,
    /// Returning a permit.
    Release,
    /// Extending a lease that is still held.
    Renew,
    /// Holding a host back (Retry-After).
    Penalize,
    /// Checking that the backend answers.
    Ping,
    /// Shutting the limiter down (waiting for its pending releases).
    Close,
    /// Reading or keeping a value shared by the replicas
    /// (`SharedCache`).
    Shared,
    /// Publishing policies to the scope, or reading them back
    /// (`LiveLimiter`).
    Policies,
}

impl Op {
    /// The operation's name as used in hooks, metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Release => "release",
            Self::Renew => "renew",
            Self::Penalize => "penalize",
            Self::Ping => "ping",
            Self::Close => "close",
            Self::Shared => "shared",
            Self::Policies => "policies",
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pacing configuration that was refused, and why.
///
/// Anything that would silently switch pacing off, or that the Redis scripts
/// could not represent exactly, is refused here rather than enforced
/// approximately.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `quota` was set without a `window` to count it in.
    #[error("quota {quota} has no window: set a window for it")]
    QuotaWithoutWindow {
        /// The quota that was given.
        quota: u32,
    },
    /// `window` was set without a `quota` to count in it.
    #[error("window {window:?} has no quota: set a quota, or drop the window")]
    WindowWithoutQuota {
        /// The window that was given.
        window: Duration,
    },
    /// A count that must be at least one was zero.
    #[error("{field} must be at least 1 (0 would admit nothing or pace nothing)")]
    Zero {
        /// The name of the field.
        field: &'static str,
    },
    /// A duration whose microsecond count exceeds 2^53-1, the largest integer
    /// a Lua number (an IEEE-754 double) holds exactly.
    #[error("{field} of {value:?} is out of range: at most 2^53-1 microseconds (about 285 years)")]
    OutOfRange {
        /// The name of the field.
        field: &'static str,
        /// The value that was given.
        value: Duration,
    },
    /// A nonzero duration below one microsecond, the resolution pacing keeps:
    /// it would round to zero and switch the control off.
    #[error("{field} of {value:?} is below the 1µs resolution and would round to zero")]
    BelowResolution {
        /// The name of the field.
        field: &'static str,
        /// The value that was given.
        value: Duration,
    },
    /// A duration below the smallest value that works.
    #[error("{field} of {value:?} is too short: at least {min:?}")]
    TooShort {
        /// The name of the field.
        field: &'static str,
        /// The value that was given.
        value: Duration,
        /// The smallest value accepted.
        min: Duration,
    },
    /// A duration above the largest value that works with the others.
    #[error("{field} of {value:?} is too long: at most {max:?}")]
    TooLong {
        /// The name of the field.
        field: &'static str,
        /// The value that was given.
        value: Duration,
        /// The largest value accepted.
        max: Duration,
    },
    /// A Redis URL or pool setting that the client refused.
    #[error("invalid Redis connection settings: {reason}")]
    InvalidRedis {
        /// What the Redis client or the pool said.
        reason: String,
    },
    /// A per-host rule that cannot be used: its pattern is not a host or
    /// `*.` and a suffix, repeats another rule's, or its settings are
    /// refused.
    #[error("rule {rule:?}: {reason}")]
    InvalidRule {
        /// The rule's pattern as given.
        rule: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Published policies (see `RedisLimiter::publish_policies`) that
    /// cannot be read back: not written by this crate, written by a
    /// version that knows settings this one does not, or altered.
    #[error("the published policies cannot be read: {reason}")]
    InvalidPublished {
        /// What is wrong with them.
        reason: String,
    },
    /// A Redis key prefix or scope that could break the key layout.
    #[error("{field} {value:?} is not a valid name: use 1 to 64 ASCII letters, digits or -_.:/")]
    InvalidName {
        /// The name of the field.
        field: &'static str,
        /// The value that was given.
        value: String,
    },
}

/// Shows an error with its causes, each once (`outer: cause: root`), for
/// logs and reports: [`Error::Unavailable`] keeps the backend's error as
/// its [`source`](std::error::Error::source), and HTTP clients nest theirs
/// the same way. A cause whose text its outer error already printed is
/// left out.
///
/// ```
/// use redislimit::error::Causes;
/// use redislimit::{Error, Op};
///
/// let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
/// let err = Error::unavailable(Op::Acquire, refused);
/// assert_eq!(
///     Causes(&err).to_string(),
///     "pacing backend unavailable during acquire: connection refused"
/// );
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Causes<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut last = self.0.to_string();
        f.write_str(&last)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            let text = e.to_string();
            // Some errors print their cause as part of their own message.
            if !last.contains(&text) {
                write!(f, ": {text}")?;
            }
            last = text;
            next = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_shown_once_each() {
        let err = Error::unavailable(
            Op::Acquire,
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"),
        );
        assert_eq!(
            Causes(&err).to_string(),
            "pacing backend unavailable during acquire: connection refused"
        );
        assert_eq!(Causes(&Error::Closed).to_string(), "the limiter is closed");
    }

    #[test]
    fn a_cause_its_outer_error_already_printed_is_left_out() {
        #[derive(Debug)]
        struct E(&'static str, Option<Box<E>>);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for E {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let root = E("connection refused", None);
        let mid = E(
            "tcp connect error: connection refused",
            Some(Box::new(root)),
        );
        let top = E("error sending request", Some(Box::new(mid)));
        assert_eq!(
            Causes(&top).to_string(),
            "error sending request: tcp connect error: connection refused"
        );
    }
}

//! The per-host pacing configuration, validated once at construction.

use std::time::Duration;

use crate::ConfigError;

/// The largest microsecond count a Lua number (an IEEE-754 double) holds
/// exactly: 2^53-1. Durations cross into the Redis scripts as microseconds,
/// so anything above it is refused rather than enforced approximately.
pub(crate) const MAX_MICROS: u64 = (1 << 53) - 1;

/// What [`min_delay`](PacingBuilder::min_delay) is counted from.
///
/// This is for in-process limiters; a Redis-backed limiter's mode decides
/// it across replicas (serialized: sends and completions; lease: sends),
/// and [`RedisLimiter::fallback_pacing`](crate::RedisLimiter::fallback_pacing)
/// matches its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Spacing {
    /// From the previous send and from the latest completion: the polite
    /// default, and what serialized mode does across replicas.
    #[default]
    SendsAndCompletions,
    /// From the previous send only: what lease mode does across replicas,
    /// where up to `cluster_concurrency` requests run at once.
    Sends,
}

/// How requests to one host are paced.
///
/// Every control applies per host; a limiter keeps one state per host key
/// and never lets one host's traffic delay another's.
///
/// | control | meaning | default |
/// |---|---|---|
/// | [`max_concurrent`](PacingBuilder::max_concurrent) | requests in flight per host in this process (at least 1) | 1 |
/// | [`min_delay`](PacingBuilder::min_delay) | gap before the next send: after the previous send and after the latest completion | 0 (off) |
/// | [`spacing`](PacingBuilder::spacing) | whether `min_delay` also counts from completions | sends and completions |
/// | [`quota`](PacingBuilder::quota) / [`window`](PacingBuilder::window) | at most `quota` admissions in any sliding `window` | 0 (off) |
/// | [`jitter`](PacingBuilder::jitter) | a random extra of up to this much on every nonzero wait | 0 |
/// | [`max_penalty`](PacingBuilder::max_penalty) | cap on a single penalty (`Retry-After`) | 10 minutes |
/// | [`max_queued`](PacingBuilder::max_queued) | acquires waiting per host in this process; one more fails at once with [`Error::QueueFull`](crate::Error::QueueFull) | unbounded |
/// | [`max_bytes_per_sec`](PacingBuilder::max_bytes_per_sec) | response bytes per second per host: each response's bytes hold the next send back | 0 (off) |
///
/// Zero disables `min_delay`, `quota` (with `window` left at zero too),
/// `jitter` and `max_bytes_per_sec`, and nothing else: a zero `max_concurrent` or `max_penalty` is
/// refused, as are a quota without a window and a window without a quota.
///
/// ```
/// use std::time::Duration;
/// use redislimit::Pacing;
///
/// let pacing = Pacing::builder()
///     .max_concurrent(2)
///     .min_delay(Duration::from_millis(250))
///     .quota(60)
///     .window(Duration::from_secs(60))
///     .jitter(Duration::from_millis(50))
///     .build()?;
/// assert_eq!(pacing.quota(), 60);
///
/// // A quota with nothing to count it in is refused, not ignored.
/// assert!(Pacing::builder().quota(10).build().is_err());
/// # Ok::<(), redislimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pacing {
    max_concurrent: u32,
    min_delay: Duration,
    spacing: Spacing,
    quota: u32,
    window: Duration,
    jitter: Duration,
    max_penalty: Duration,
    max_queued: Option<u32>,
    max_bytes_per_sec: u64,
}

impl Pacing {
    /// The default cap on one penalty.
    pub const DEFAULT_MAX_PENALTY: Duration = Duration::from_secs(600);

    /// Starts a configuration from the defaults in the table above.
    pub fn builder() -> PacingBuilder {
        PacingBuilder {
            pacing: Self {
                max_concurrent: 1,
                min_delay: Duration::ZERO,
                spacing: Spacing::SendsAndCompletions,
                quota: 0,
                window: Duration::ZERO,
                jitter: Duration::ZERO,
                max_penalty: Self::DEFAULT_MAX_PENALTY,
                max_queued: None,
                max_bytes_per_sec: 0,
            },
        }
    }

    /// Requests in flight per host in this process.
    pub fn max_concurrent(&self) -> u32 {
        self.max_concurrent
    }

    /// Minimum gap before the next send to a host.
    pub fn min_delay(&self) -> Duration {
        self.min_delay
    }

    /// What `min_delay` is counted from.
    pub fn spacing(&self) -> Spacing {
        self.spacing
    }

    /// Admissions allowed per host in any sliding [`window`](Self::window);
    /// 0 when the quota is off.
    pub fn quota(&self) -> u32 {
        self.quota
    }

    /// The width of the sliding window the quota counts in; zero when the
    /// quota is off.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The largest random extra added to a nonzero wait.
    pub fn jitter(&self) -> Duration {
        self.jitter
    }

    /// The cap on a single penalty.
    pub fn max_penalty(&self) -> Duration {
        self.max_penalty
    }

    /// How many acquires may wait per host in this process; `None` when
    /// unbounded.
    pub fn max_queued(&self) -> Option<u32> {
        self.max_queued
    }

    /// Response bytes a second allowed per host; 0 when bytes are not
    /// counted.
    pub fn max_bytes_per_sec(&self) -> u64 {
        self.max_bytes_per_sec
    }

    /// How long `bytes` of a response hold the host under
    /// [`max_bytes_per_sec`](Self::max_bytes_per_sec); zero when bytes are
    /// not counted. Rounded up to a microsecond, capped at [`MAX_MICROS`].
    pub(crate) fn bytes_cost(&self, bytes: u64) -> Duration {
        if self.max_bytes_per_sec == 0 || bytes == 0 {
            return Duration::ZERO;
        }
        let us = (u128::from(bytes) * 1_000_000).div_ceil(u128::from(self.max_bytes_per_sec));
        Duration::from_micros(us.min(u128::from(MAX_MICROS)) as u64)
    }

    /// `wait` plus a uniformly drawn extra in `0..=jitter`, or zero when
    /// `wait` is zero: only a caller that has to wait anyway is spread out.
    pub(crate) fn jittered(&self, wait: Duration) -> Duration {
        if wait.is_zero() || self.jitter.is_zero() {
            return wait;
        }
        // `jitter` is at most MAX_MICROS microseconds, validated at build.
        let extra = fastrand::u64(0..=self.jitter.as_micros() as u64);
        wait.saturating_add(Duration::from_micros(extra))
    }

    /// This pacing's share when `n` replicas divide it: `min_delay` times
    /// `n`, `quota`, `max_bytes_per_sec` and `max_concurrent` divided by
    /// `n` (at least 1). Callers check that the quota divides (see
    /// [`divides`](Self::divides)).
    pub(crate) fn shared_by(&self, n: u32) -> Self {
        let n = n.max(1);
        let mut share = self.clone();
        share.min_delay = self
            .min_delay
            .saturating_mul(n)
            .min(Duration::from_micros(MAX_MICROS));
        if self.quota > 0 {
            share.quota = (self.quota / n).max(1);
        }
        share.max_concurrent = (self.max_concurrent / n).max(1);
        if self.max_bytes_per_sec > 0 {
            share.max_bytes_per_sec = (self.max_bytes_per_sec / u64::from(n)).max(1);
        }
        share
    }

    /// Whether `n` replicas can divide this pacing's quota and an in-flight
    /// cap of `cap` among them, each getting at least one.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn divides(&self, n: u32, cap: u32) -> bool {
        (self.quota == 0 || self.quota >= n) && cap >= n
    }

    /// The same pacing with `min_delay` counted from `spacing`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_spacing(mut self, spacing: Spacing) -> Self {
        self.spacing = spacing;
        self
    }

    /// The same pacing with another bound on waiting acquires.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_max_queued(mut self, n: Option<u32>) -> Self {
        self.max_queued = n;
        self
    }

    /// The same pacing with another per-process concurrency (at least 1).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_max_concurrent(mut self, n: u32) -> Self {
        self.max_concurrent = n.max(1);
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.max_concurrent == 0 {
            return Err(ConfigError::Zero {
                field: "max_concurrent",
            });
        }
        if self.max_penalty.is_zero() {
            return Err(ConfigError::Zero {
                field: "max_penalty",
            });
        }
        for (field, value) in [
            ("min_delay", self.min_delay),
            ("window", self.window),
            ("jitter", self.jitter),
            ("max_penalty", self.max_penalty),
        ] {
            micros(field, value)?;
        }
        match (self.quota, self.window.is_zero()) {
            (0, false) => Err(ConfigError::WindowWithoutQuota {
                window: self.window,
            }),
            (quota @ 1.., true) => Err(ConfigError::QuotaWithoutWindow { quota }),
            _ => Ok(()),
        }
    }
}

impl Default for Pacing {
    /// The builder's defaults: one request in flight per host, nothing else.
    fn default() -> Self {
        Self::builder().pacing
    }
}

/// `at + d`, saturating at a far-future instant instead of overflowing.
pub(crate) fn after(at: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    at.checked_add(d)
        .unwrap_or_else(|| at + Duration::from_secs(86_400 * 365 * 300))
}

/// The microsecond count of `value`, the unit durations cross into Lua in.
///
/// Refuses a value above [`MAX_MICROS`] and a nonzero value below one
/// microsecond (which would round to zero and switch its control off).
pub(crate) fn micros(field: &'static str, value: Duration) -> Result<u64, ConfigError> {
    let us = value.as_micros();
    if us > u128::from(MAX_MICROS) {
        return Err(ConfigError::OutOfRange { field, value });
    }
    if us == 0 && !value.is_zero() {
        return Err(ConfigError::BelowResolution { field, value });
    }
    Ok(us as u64)
}

/// Builds a [`Pacing`]; see its documentation for the controls.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct PacingBuilder {
    pacing: Pacing,
}

impl PacingBuilder {
    /// Requests in flight per host in this process; at least 1.
    pub fn max_concurrent(mut self, n: u32) -> Self {
        self.pacing.max_concurrent = n;
        self
    }

    /// Minimum gap before the next send to a host, counted from the previous
    /// send and from the latest completion; zero turns it off.
    pub fn min_delay(mut self, d: Duration) -> Self {
        self.pacing.min_delay = d;
        self
    }

    /// What `min_delay` is counted from (default: sends and completions).
    pub fn spacing(mut self, spacing: Spacing) -> Self {
        self.pacing.spacing = spacing;
        self
    }

    /// At most `n` admissions per host in any sliding [`window`](Self::window);
    /// zero (with a zero window) turns it off.
    pub fn quota(mut self, n: u32) -> Self {
        self.pacing.quota = n;
        self
    }

    /// The width of the sliding window the [`quota`](Self::quota) counts in.
    pub fn window(mut self, d: Duration) -> Self {
        self.pacing.window = d;
        self
    }

    /// Every nonzero wait gets a random extra of up to `d`, so replicas that
    /// were told to wait the same time do not retry in lockstep.
    pub fn jitter(mut self, d: Duration) -> Self {
        self.pacing.jitter = d;
        self
    }

    /// The cap on a single penalty, so a hostile or absurd `Retry-After`
    /// cannot park a host for longer; must be nonzero.
    pub fn max_penalty(mut self, d: Duration) -> Self {
        self.pacing.max_penalty = d;
        self
    }

    /// At most `n` acquires waiting per host in this process: one more
    /// fails at once with [`Error::QueueFull`](crate::Error::QueueFull),
    /// booking nothing, so a caller can shed load instead of piling up
    /// waiters. 0 lets nobody wait: an acquire is admitted at once or
    /// refused. Unbounded by default. The bound counts every waiter,
    /// whatever its [priority](crate::RequestPacing): a high-priority
    /// acquire that meets a full queue is refused too. With a Redis
    /// limiter, requests admitted in this process and asking Redis count
    /// against the in-flight cap, not this bound.
    pub fn max_queued(mut self, n: u32) -> Self {
        self.pacing.max_queued = Some(n);
        self
    }

    /// At most `n` response bytes a second per host, 0 (the default) for
    /// no limit. A response's bytes are counted as its body is read
    /// (through `http::PermitBody`, with the `http` feature); once it ends,
    /// the host's next send waits until every byte counted so far fits in
    /// the rate: each response adds `bytes / n` seconds to a debt that
    /// runs down in real time, and that no hold or penalty shortens. With
    /// a Redis limiter the debt is kept in Redis, so replicas share it.
    ///
    /// A response is charged when it is complete, so the requests already
    /// in flight (up to the host's in-flight cap) may overrun the rate by
    /// their bodies before the first of them lands; a cap of 1 keeps the
    /// overrun to one response.
    pub fn max_bytes_per_sec(mut self, n: u64) -> Self {
        self.pacing.max_bytes_per_sec = n;
        self
    }

    /// Validates and returns the configuration.
    pub fn build(self) -> Result<Pacing, ConfigError> {
        self.pacing.validate()?;
        Ok(self.pacing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let p = Pacing::builder().build().unwrap();
        assert_eq!(p, Pacing::default());
        assert_eq!(p.max_concurrent(), 1);
        assert_eq!(p.max_penalty(), Pacing::DEFAULT_MAX_PENALTY);
    }

    #[test]
    fn quota_and_window_come_together() {
        assert_eq!(
            Pacing::builder().quota(5).build(),
            Err(ConfigError::QuotaWithoutWindow { quota: 5 })
        );
        assert_eq!(
            Pacing::builder().window(Duration::from_secs(1)).build(),
            Err(ConfigError::WindowWithoutQuota {
                window: Duration::from_secs(1)
            })
        );
        let p = Pacing::builder()
            .quota(5)
            .window(Duration::from_secs(1))
            .build()
            .unwrap();
        assert_eq!((p.quota(), p.window()), (5, Duration::from_secs(1)));
    }

    #[test]
    fn zero_counts_that_would_switch_pacing_off_are_refused() {
        assert_eq!(
            Pacing::builder().max_concurrent(0).build(),
            Err(ConfigError::Zero {
                field: "max_concurrent"
            })
        );
        assert_eq!(
            Pacing::builder().max_penalty(Duration::ZERO).build(),
            Err(ConfigError::Zero {
                field: "max_penalty"
            })
        );
    }

    #[test]
    fn durations_lua_cannot_hold_exactly_are_refused() {
        let edge = Duration::from_micros(MAX_MICROS);
        let over = edge + Duration::from_micros(1);
        assert!(Pacing::builder().min_delay(edge).build().is_ok());
        assert_eq!(
            Pacing::builder().min_delay(over).build(),
            Err(ConfigError::OutOfRange {
                field: "min_delay",
                value: over
            })
        );
        assert!(matches!(
            Pacing::builder().quota(1).window(over).build(),
            Err(ConfigError::OutOfRange {
                field: "window",
                ..
            })
        ));
        assert!(matches!(
            Pacing::builder().jitter(Duration::MAX).build(),
            Err(ConfigError::OutOfRange {
                field: "jitter",
                ..
            })
        ));
        assert!(matches!(
            Pacing::builder().max_penalty(over).build(),
            Err(ConfigError::OutOfRange {
                field: "max_penalty",
                ..
            })
        ));
    }

    #[test]
    fn sub_microsecond_durations_are_refused_not_rounded_to_zero() {
        assert_eq!(
            Pacing::builder()
                .min_delay(Duration::from_nanos(999))
                .build(),
            Err(ConfigError::BelowResolution {
                field: "min_delay",
                value: Duration::from_nanos(999)
            })
        );
        assert!(
            Pacing::builder()
                .min_delay(Duration::from_nanos(1_000))
                .build()
                .is_ok()
        );
    }

    #[test]
    fn jitter_applies_only_to_nonzero_waits_and_stays_in_range() {
        let p = Pacing::builder()
            .jitter(Duration::from_millis(10))
            .build()
            .unwrap();
        assert_eq!(p.jittered(Duration::ZERO), Duration::ZERO);
        let base = Duration::from_millis(100);
        let mut seen_extra = false;
        for _ in 0..1000 {
            let w = p.jittered(base);
            assert!(w >= base && w <= base + Duration::from_millis(10), "{w:?}");
            seen_extra |= w > base;
        }
        assert!(seen_extra, "jitter never added anything");
        let none = Pacing::default();
        assert_eq!(none.jittered(base), base);
    }
}

//! `RedisLimiterBuilder`: a `RedisLimiter`'s settings, validated when it
//! is built.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::agreement::Agreement;
use super::backend::Backend;
use super::core::{Core, Queues};
use super::gathered::Gathered;
use super::keys::check_name;
use super::lateness::Lateness;
use super::limiter::RedisLimiter;
use super::pool::RedisPool;
use super::registry::Registry;
use super::renew::Renewals;
use super::roster::Turns;
use super::settings::{Args, LINE_SLACK, Mode, Settings, quota_buckets};
use super::tuning::Tuning;
use crate::fallback::FallbackPolicy;
use crate::pacing::micros;
use crate::{ConfigError, DomainLimiter, Hooks, NoHooks, Pacing, Policies};

impl RedisLimiter {
    /// Starts a limiter for `scope` (e.g. `domain` for crawling, `search`
    /// for API queries; two scopes never consume each other's quota) over
    /// `pool`.
    pub fn builder(pool: RedisPool, scope: impl Into<String>) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            pool,
            prefix: "redislimit".to_owned(),
            scope: scope.into(),
            policies: Policies::default(),
            cluster_concurrency: 0,
            lease_ttl: Self::DEFAULT_LEASE_TTL,
            tuning: Tuning::default(),
            hooks: Arc::new(NoHooks),
            fallback_policy: FallbackPolicy::default(),
            expected_replicas: 1,
            policy_version: 0,
        }
    }

    /// A builder of a limiter like this one (its pool, scope, hooks and
    /// settings) with `policies`, published to the scope as `version`
    /// (see `LiveLimiter`).
    pub(super) fn rebuilder(&self, policies: Policies, version: u64) -> RedisLimiterBuilder {
        let s = &self.core.settings;
        RedisLimiterBuilder {
            pool: self.core.backend.pool().clone(),
            prefix: s.prefix.clone(),
            scope: s.scope.clone(),
            policies,
            cluster_concurrency: s.cluster_concurrency,
            lease_ttl: s.lease_ttl,
            tuning: s.tuning,
            hooks: Arc::clone(&self.core.hooks),
            fallback_policy: s.fallback_policy,
            expected_replicas: s.expected_replicas,
            policy_version: version,
        }
    }
}

/// Builds a [`RedisLimiter`]; see its documentation for the controls.
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedisLimiterBuilder {
    pool: RedisPool,
    prefix: String,
    scope: String,
    policies: Policies,
    cluster_concurrency: u32,
    lease_ttl: Duration,
    tuning: Tuning,
    hooks: Arc<dyn Hooks>,
    fallback_policy: FallbackPolicy,
    expected_replicas: u32,
    policy_version: u64,
}

impl fmt::Debug for RedisLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiterBuilder")
            .field("prefix", &self.prefix)
            .field("scope", &self.scope)
            .field("policies", &self.policies)
            .field("cluster_concurrency", &self.cluster_concurrency)
            .field("lease_ttl", &self.lease_ttl)
            .field("tuning", &self.tuning)
            .field("fallback_policy", &self.fallback_policy)
            .field("expected_replicas", &self.expected_replicas)
            .finish_non_exhaustive()
    }
}

impl RedisLimiterBuilder {
    /// What the fallback of [`RedisLimiter::with_fallback`] does while Redis
    /// is unavailable (default [`FallbackPolicy::Share`]); see
    /// [`FallbackPolicy`]. Not part of the configuration agreement: it
    /// shapes this process only.
    pub fn fallback_policy(mut self, policy: FallbackPolicy) -> Self {
        self.fallback_policy = policy;
        self
    }

    /// How many replicas the fallback policy assumes when this limiter never
    /// saw the replica registry (it started while Redis was away); default
    /// 1. Set it to the number of replicas you run.
    pub fn expected_replicas(mut self, n: u32) -> Self {
        self.expected_replicas = n.max(1);
        self
    }

    /// The key namespace shared by every scope (default `redislimit`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The pacing of every host (default: [`Pacing::default`]); replaces
    /// any [`policies`](Self::policies) set before.
    pub fn pacing(mut self, pacing: Pacing) -> Self {
        self.policies = Policies::new(pacing);
        self
    }

    /// A default pacing, per-host rules and keying (see [`Policies`]); the
    /// rules are part of the configuration agreement, so replicas with
    /// other rules are refused as with other settings. A rule's own
    /// [`cluster_concurrency`](crate::Rule::with_cluster_concurrency)
    /// replaces this builder's for its hosts.
    pub fn policies(mut self, policies: Policies) -> Self {
        self.policies = policies;
        self
    }

    /// The cap on requests in flight per host across all replicas; 0 (the
    /// default) selects serialized mode. Also raises the per-process
    /// `max_concurrent` when it is smaller, so one process never keeps the
    /// cluster below its cap.
    pub fn cluster_concurrency(mut self, n: u32) -> Self {
        self.cluster_concurrency = n;
        self
    }

    /// How long a slot stays booked without a release or a renewal
    /// (default 30 s); see "Sizing `lease_ttl`" on [`RedisLimiter`].
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// The timing of this process's acquires (see [`Tuning`]): how soon
    /// it asks again, how far ahead it books, how late its sends may leave.
    /// Not part of the configuration agreement: replicas may differ in it,
    /// as it shapes only this process's calls and sends.
    pub fn tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = tuning;
        self
    }

    /// Where decisions and failures are reported (default: nowhere).
    pub fn hooks(mut self, hooks: Arc<dyn Hooks>) -> Self {
        self.hooks = hooks;
        self
    }

    /// Validates the configuration and builds the limiter. Nothing is sent
    /// to Redis until the first acquire.
    pub fn build(self) -> Result<RedisLimiter, ConfigError> {
        check_name("prefix", &self.prefix)?;
        check_name("scope", &self.scope)?;
        let lease_ttl_us = micros("lease_ttl", self.lease_ttl)?;
        if lease_ttl_us == 0 {
            return Err(ConfigError::Zero { field: "lease_ttl" });
        }
        if self.lease_ttl < RedisLimiter::MIN_LEASE_TTL {
            return Err(ConfigError::TooShort {
                field: "lease_ttl",
                value: self.lease_ttl,
                min: RedisLimiter::MIN_LEASE_TTL,
            });
        }
        let tuning = self.tuning;
        let Tuning {
            concurrency_retry,
            book_ahead,
            slot_margin,
            max_lateness,
        } = tuning;
        let concurrency_retry = concurrency_retry.unwrap_or_else(|| {
            let min_delay = self.policies.default_pacing().min_delay();
            if min_delay.is_zero() {
                Tuning::DEFAULT_CONCURRENCY_RETRY
            } else {
                min_delay.clamp(Duration::from_millis(1), Tuning::DEFAULT_CONCURRENCY_RETRY)
            }
        });
        micros("book_ahead", book_ahead)?;
        micros("slot_margin", slot_margin)?;
        if max_lateness.is_zero() {
            return Err(ConfigError::Zero {
                field: "max_lateness",
            });
        }
        if book_ahead > self.lease_ttl {
            // A booked lease must outlive the wait for its slot.
            return Err(ConfigError::TooLong {
                field: "book_ahead",
                value: book_ahead,
                max: self.lease_ttl,
            });
        }
        if micros("concurrency_retry", concurrency_retry)? == 0 {
            return Err(ConfigError::Zero {
                field: "concurrency_retry",
            });
        }
        let policies = self.policies;
        let default_cap = self.cluster_concurrency;
        let args: Box<[Args]> = (0..policies.len())
            .map(|i| {
                // Validated by `Pacing`'s own builder.
                let pacing = policies.at(i);
                let min_delay_us = pacing.min_delay().as_micros() as u64;
                let window_us = pacing.window().as_micros() as u64;
                let max_penalty_us = pacing.max_penalty().as_micros() as u64;
                Args {
                    mode: Mode::from_cap(policies.cluster_concurrency_at(i, default_cap)),
                    min_delay_us,
                    quota: pacing.quota(),
                    window_us,
                    max_wait_us: max_penalty_us
                        .max(lease_ttl_us.saturating_add(min_delay_us))
                        .max(window_us)
                        .min(crate::MAX_MICROS),
                    weight: 1,
                    bucket_us: quota_buckets(pacing.quota(), window_us),
                    admitted_us: 0,
                    room_us: 0,
                    patience_us: (concurrency_retry + pacing.jitter() + slot_margin + LINE_SLACK)
                        .as_micros()
                        .min(u128::from(crate::MAX_MICROS)) as u64,
                    shun_n: 0,
                    shun_turns: Turns::default(),
                }
            })
            .collect();
        // Hosts of one domain (or address) share one gate: a serialized host's holder
        // would mean nothing to a lease-mode host beside it.
        if policies.key_by().merges_hosts()
            && let Some(i) = (1..args.len())
                .find(|&i| (args[i].mode == Mode::Serialized) != (args[0].mode == Mode::Serialized))
        {
            return Err(ConfigError::InvalidRule {
                rule: policies.rules()[i - 1].pattern().to_owned(),
                reason: "keyed by domain or address, the hosts of one key share one state in \
                         Redis: a rule cannot be serialized when the default is in lease mode, \
                         or the other way round",
            });
        }
        // ... and one quota record: kept per admission (up to
        // EXACT_QUOTA_MAX) or in buckets, the same way for all of them.
        let bucketed = |a: &Args| (a.quota > 0).then_some(a.bucket_us > 0);
        if policies.key_by().merges_hosts()
            && let Some(first) = args.iter().find_map(bucketed)
            && let Some(i) = (1..args.len()).find(|&i| bucketed(&args[i]) == Some(!first))
        {
            return Err(ConfigError::InvalidRule {
                rule: policies.rules()[i - 1].pattern().to_owned(),
                reason: "keyed by domain or address, the hosts of one key share one quota \
                         record in Redis: quotas of up to 16 per window (kept per admission) and larger \
                         ones (kept in buckets) cannot be mixed",
            });
        }
        // ... whose records each acquire trims to its own window: a shorter
        // window would drop what a longer one still counts.
        let window = |a: &Args| (a.quota > 0).then_some(a.window_us);
        if policies.key_by().merges_hosts()
            && let Some(first) = args.iter().find_map(window)
            && let Some(i) = (1..args.len()).find(|&i| window(&args[i]).is_some_and(|w| w != first))
        {
            return Err(ConfigError::InvalidRule {
                rule: policies.rules()[i - 1].pattern().to_owned(),
                reason: "keyed by domain or address, the hosts of one key share one quota \
                         record in Redis: their quotas must count in the same window",
            });
        }
        // The per-process cap of each policy, raised to its cluster cap.
        let local = policies.map(|i, pacing| {
            Pacing::default()
                .with_max_concurrent(pacing.max_concurrent().max(args[i].mode.script_cap()))
                .with_max_queued(pacing.max_queued())
        });
        let pollers = policies.map(|_, _| Pacing::default());
        let agreement = Arc::new(Agreement::new(
            &self.prefix,
            &self.scope,
            &policies,
            |i| args[i].mode,
            self.lease_ttl,
            self.policy_version,
        ));
        let registry = Arc::new(Registry::new(&self.prefix, &self.scope, self.lease_ttl));
        let settings = Settings {
            prefix: self.prefix,
            scope: self.scope,
            policies,
            cluster_concurrency: self.cluster_concurrency,
            lease_ttl: self.lease_ttl,
            lease_ttl_us,
            concurrency_retry,
            book_ahead,
            slot_margin,
            max_lateness,
            fallback_policy: self.fallback_policy,
            expected_replicas: self.expected_replicas,
            args,
            tuning,
            policy_version: self.policy_version,
        };
        let core = Core {
            settings: Arc::new(settings),
            backend: Arc::new(Backend::new(self.pool)),
            hooks: self.hooks,
            queues: Queues {
                local: DomainLimiter::new(local),
                pollers: DomainLimiter::tracking_in_flight(pollers.clone()),
                heavy: DomainLimiter::tracking_in_flight(pollers),
            },
            agreement,
            registry,
            renewals: Arc::new(Renewals::new(self.lease_ttl / 2)),
            lateness: Lateness::new(self.lease_ttl / 2),
            lifecycle: Arc::default(),
            gathered: Gathered::default(),
        };
        Ok(RedisLimiter::from_core(core))
    }
}

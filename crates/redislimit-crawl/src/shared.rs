//! Pacing shared through Redis (feature `redis`): the Redis-backed limiter
//! the flags describe, with its in-process fallback.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, bail};
use redislimit::error::Causes;
use redislimit::{
    FallbackLimiter, Hooks, Policies, RedisLimiter, RedisPool, RedisTimeouts, Tuning,
};

use super::args::Args;
use super::policy_file::Settings;
use super::run::Pacer;

impl Args {
    /// The Redis-backed limiter (`--redis`, `--redis-cluster` or
    /// `--redis-sentinel`), after checking that Redis answers and that the
    /// scope's settings agree; while Redis is unavailable, only with
    /// `--expected-replicas`.
    pub(crate) async fn shared_pacer(
        &self,
        default: &Settings,
        policies: Policies,
        hooks: Arc<dyn Hooks>,
    ) -> anyhow::Result<Pacer> {
        let pool = self.redis_pool()?;
        let mut builder = RedisLimiter::builder(pool, self.scope.clone());
        if let Some(n) = self.expected_replicas {
            builder = builder.expected_replicas(n);
        }
        let keys = policies.clone();
        let limiter = builder
            .policies(policies)
            .hooks(hooks)
            .cluster_concurrency(default.cluster_concurrency)
            .lease_ttl(self.lease_ttl)
            .tuning(
                Tuning::default()
                    .with_slot_margin(self.slot_margin)
                    .with_max_lateness(self.max_lateness)
                    .with_book_ahead(self.book_ahead),
            )
            .fallback_policy(self.fallback.into())
            .build()?;
        match limiter.ping().await {
            // Refuse to start beside replicas that pace this scope otherwise.
            Ok(()) => limiter.check_config().await?,
            Err(err) if err.is_unavailable() => match self.expected_replicas {
                Some(n) => tracing::warn!(
                    error = %Causes(&err),
                    "Redis is unavailable at start: pacing in-process at 1/{n} of each \
                     limit (--expected-replicas {n}) until it answers"
                ),
                None => {
                    return Err(err).context(
                        "Redis is unreachable (with --expected-replicas N the crawl starts \
                         anyway, at 1/N of each limit, and joins Redis when it answers)",
                    );
                }
            },
            // Misconfigured (a refused password, a missing database, not
            // Redis, TLS to a plain port): no waiting mends it.
            Err(err) => return Err(err.into()),
        }
        let robots = limiter.shared_cache("robots");
        let limiter: Arc<FallbackLimiter<RedisLimiter>> = Arc::new(limiter.with_fallback());
        let probe = Arc::clone(&limiter);
        let seen = std::sync::atomic::AtomicU64::new(0);
        Ok(Pacer {
            limiter,
            keys,
            robots: Some(robots),
            // Between two progress lines: all through Redis, or how many
            // went without it (a Cluster with one master away paces only
            // that master's hosts in-process).
            mode: Arc::new(move || {
                let alone = probe.in_process_admissions();
                let since = alone.saturating_sub(seen.swap(alone, Ordering::Relaxed));
                match (since, probe.is_degraded()) {
                    (0, false) => "shared through Redis".to_owned(),
                    (0, true) => "in-process (Redis unavailable)".to_owned(),
                    (n, true) => {
                        format!("in-process (Redis unavailable; {n} requests since the last line)")
                    }
                    (n, false) => format!(
                        "partly in-process ({n} requests since the last line without Redis, \
                         unavailable for their hosts)"
                    ),
                }
            }),
        })
    }

    /// The Redis pool the flags name (`--redis-ca` for TLS with a CA of
    /// your own, with the `tls` feature).
    fn redis_pool(&self) -> anyhow::Result<RedisPool> {
        let timeouts = RedisTimeouts::default();
        let nodes: Vec<&str> = self.redis_cluster.iter().map(String::as_str).collect();
        if !self.redis_sentinel.is_empty() {
            if self.redis_ca.is_some() {
                bail!(
                    "--redis-ca does not apply to --redis-sentinel: point SSL_CERT_FILE at the CA \
                     instead"
                );
            }
            let sentinels: Vec<&str> = self.redis_sentinel.iter().map(String::as_str).collect();
            return Ok(RedisPool::sentinel(
                &sentinels,
                &self.redis_master,
                timeouts,
            )?);
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = self.redis_tls()? {
            return Ok(match &self.redis {
                Some(url) => RedisPool::standalone_tls(url, &tls, timeouts)?,
                None => RedisPool::cluster_tls(&nodes, &tls, timeouts)?,
            });
        }
        #[cfg(not(feature = "tls"))]
        if self.redis_ca.is_some() {
            bail!("--redis-ca needs the crawl built with its `tls` feature");
        }
        Ok(match &self.redis {
            Some(url) => RedisPool::standalone(url, timeouts)?,
            None => RedisPool::cluster(&nodes, timeouts)?,
        })
    }
}

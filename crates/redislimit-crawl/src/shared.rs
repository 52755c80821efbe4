//! Pacing shared through Redis (feature `redis`): the Redis-backed limiter
//! the flags describe, with its in-process fallback.

use std::sync::Arc;

use anyhow::Context;
#[cfg(not(feature = "tls"))]
use anyhow::bail;
use redislimit::{
    FallbackLimiter, Hooks, Policies, RedisLimiter, RedisPool, RedisTimeouts, Tuning,
};

use super::args::Args;
use super::policy_file::Settings;
use super::run::Pacer;

impl Args {
    /// The Redis-backed limiter (`--redis` or `--redis-cluster`), after
    /// checking that Redis answers and that the scope's settings agree.
    pub(crate) async fn shared_pacer(
        &self,
        default: &Settings,
        policies: Policies,
        hooks: Arc<dyn Hooks>,
    ) -> anyhow::Result<Pacer> {
        let pool = self.redis_pool()?;
        let limiter = RedisLimiter::builder(pool, self.scope.clone())
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
        limiter.ping().await.context("Redis is unreachable")?;
        // Refuse to start beside replicas that pace this scope otherwise.
        limiter.check_config().await?;
        let limiter: Arc<FallbackLimiter<RedisLimiter>> = Arc::new(limiter.with_fallback());
        let probe = Arc::clone(&limiter);
        Ok(Pacer {
            limiter,
            mode: Arc::new(move || {
                if probe.is_degraded() {
                    "in-process (Redis unavailable)"
                } else {
                    "shared through Redis"
                }
            }),
        })
    }

    /// The Redis pool the flags name (`--redis-ca` for TLS with a CA of
    /// your own, with the `tls` feature).
    fn redis_pool(&self) -> anyhow::Result<RedisPool> {
        let timeouts = RedisTimeouts::default();
        let nodes: Vec<&str> = self.redis_cluster.iter().map(String::as_str).collect();
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

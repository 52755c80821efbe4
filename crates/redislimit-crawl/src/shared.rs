//! Pacing shared through Redis (feature `redis`): the Redis-backed limiter
//! the flags describe, with its in-process fallback, following the policies
//! published to its scope; and `crawl policy`, which publishes them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, bail};
use redislimit::error::Causes;
use redislimit::hooks::NoHooks;
use redislimit::{Hooks, Policies, RedisLimiter, RedisPool, RedisTimeouts, Tuning};

use super::args::{Args, RedisTarget};
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
        let keys = policies.clone();
        let limiter = self.redis_limiter(default, policies, hooks)?;
        let robots = limiter.shared_cache("robots");
        let live = limiter.with_fallback().live();
        match live.redis().ping().await {
            // Pace with the policies published to the scope, if any; and
            // refuse to start beside replicas that pace it otherwise.
            Ok(()) => {
                match live.refresh().await {
                    Ok(_) => {}
                    Err(err) if err.is_unavailable() && self.expected_replicas.is_some() => {
                        tracing::warn!(error = %Causes(&err), "cannot read the published policies yet");
                    }
                    Err(err) => return Err(err).context("cannot pace with the published policies"),
                }
                // A record naming policies Redis lost is waited for (see
                // `LiveLimiter::check_config`), and they are switched to.
                live.check_config(None).await?;
                let version = live.version();
                if version > 0 {
                    tracing::info!(
                        version,
                        "policies were published to the scope: pacing with them, not with \
                         --policy and the pacing flags"
                    );
                }
            }
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
        let limiter = Arc::new(live);
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
                let Some(fallback) = probe.fallback() else {
                    return "shared through Redis".to_owned();
                };
                let alone = fallback.in_process_admissions();
                let since = alone.saturating_sub(seen.swap(alone, Ordering::Relaxed));
                match (since, fallback.is_degraded()) {
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

    /// The Redis limiter the flags describe, with `policies`.
    fn redis_limiter(
        &self,
        default: &Settings,
        policies: Policies,
        hooks: Arc<dyn Hooks>,
    ) -> anyhow::Result<RedisLimiter> {
        let mut builder = RedisLimiter::builder(self.redis.pool()?, self.scope.clone());
        if let Some(n) = self.expected_replicas {
            builder = builder.expected_replicas(n);
        }
        Ok(builder
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
            .build()?)
    }
}

impl RedisTarget {
    /// The Redis pool the flags name (`--redis-ca` for TLS with a CA of
    /// your own, with the `tls` feature).
    fn pool(&self) -> anyhow::Result<RedisPool> {
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
        if let Some(tls) = self.tls()? {
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

/// `crawl policy push` and `crawl policy show`.
pub(crate) async fn policy(action: crate::PolicyCommand) -> anyhow::Result<()> {
    use crate::PolicyCommand;
    // The replicas' own command line, so that the file is read and the
    // limiter built exactly as theirs are.
    let (file, redis, scope, flags) = match action {
        PolicyCommand::Push {
            file,
            redis,
            scope,
            cluster_concurrency,
            lease_ttl,
            key_by,
        } => (
            Some(file),
            redis,
            scope,
            vec![
                "--cluster-concurrency".to_owned(),
                cluster_concurrency,
                "--lease-ttl".to_owned(),
                lease_ttl,
                "--key-by".to_owned(),
                key_by,
            ],
        ),
        PolicyCommand::Show { redis, scope } => (None, redis, scope, Vec::new()),
    };
    let mut line = vec!["crawl".to_owned(), "--scope".to_owned(), scope];
    line.extend(redis.flags());
    line.extend(flags);
    if let Some(file) = &file {
        line.push("--policy".to_owned());
        line.push(file.display().to_string());
    }
    let args = <Args as clap::Parser>::try_parse_from(line)?;
    let (default, policies) = args.policies()?;
    let limiter = args.redis_limiter(&default, policies.clone(), Arc::new(NoHooks))?;
    limiter.ping().await.context("Redis does not answer")?;
    if file.is_some() {
        let version = limiter.publish_policies(&policies).await?;
        println!("published version {version} to scope {:?}", args.scope);
        return Ok(());
    }
    match limiter.published_policies().await? {
        Some((version, policies)) => print!("{}", describe(version, &args.scope, &policies)),
        None => println!("no policies are published to scope {:?}", args.scope),
    }
    Ok(())
}

/// The published policies as a policy file (`--policy FILE`) that gives
/// them back: every setting of the default and of each rule written out,
/// so that a rule does not take one of the default's. `key_by` is not a
/// setting of the file (it is `--key-by`), so it is a comment.
fn describe(version: u64, scope: &str, policies: &Policies) -> String {
    use std::fmt::Write;
    let mut text = format!(
        "# version {version} of the policies published to scope {}\n\
         # key_by: {} (give `crawl policy push` --key-by {1} with this file)\n\
         [default]\n",
        // On the comment's one line, whatever the scope holds.
        quoted(scope).replace(['\n', '\r'], " "),
        policies.key_by().as_str()
    );
    settings(&mut text, policies.default_pacing());
    for rule in policies.rules() {
        let _ = write!(text, "\n[[rule]]\nmatch = {}\n", quoted(rule.pattern()));
        if let Some(cap) = rule.cluster_concurrency() {
            let _ = writeln!(text, "cluster_concurrency = {cap}");
        }
        settings(&mut text, rule.pacing());
    }
    text
}

/// `text` as a TOML string (Rust's `{:?}` escapes some characters in ways
/// TOML does not read).
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// One pacing's settings, a `key = value` line each.
fn settings(text: &mut String, pacing: &redislimit::Pacing) {
    use std::fmt::Write;
    let duration = |d| quoted(&humantime::format_duration(d).to_string());
    let _ = writeln!(text, "min_delay = {}", duration(pacing.min_delay()));
    let _ = writeln!(text, "max_concurrent = {}", pacing.max_concurrent());
    let _ = writeln!(text, "quota = {}", pacing.quota());
    if pacing.quota() > 0 {
        let _ = writeln!(text, "window = {}", duration(pacing.window()));
    }
    let _ = writeln!(text, "jitter = {}", duration(pacing.jitter()));
    let _ = writeln!(text, "max_penalty = {}", duration(pacing.max_penalty()));
    let _ = writeln!(text, "max_bytes_per_sec = {}", pacing.max_bytes_per_sec());
}

#[cfg(test)]
mod tests {
    use super::quoted;

    /// What `crawl policy show` quotes reads back as it was, whatever it holds.
    #[test]
    fn quoted_text_reads_back_as_toml() {
        for text in [
            "*.example.com",
            "a\"b\\c",
            "tab\there",
            "\u{1b}[0m",
            "é\u{7f}",
        ] {
            let line = format!("x = {}", quoted(text));
            let value: toml::Table = toml::from_str(&line).unwrap();
            assert_eq!(value["x"].as_str(), Some(text), "{line}");
        }
    }
}

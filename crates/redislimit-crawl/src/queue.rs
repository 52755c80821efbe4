//! `--queue`: a crawl's URLs kept in Redis for any number of replicas
//! (redislimit's `SharedQueue`), taken a batch at a time, acknowledged once
//! reported; and `crawl enqueue`, which fills it.

use std::path::PathBuf;

use crate::args::RedisTarget;

/// A task other than crawling.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Add the URLs of FILE (one per line, optionally followed by a
    /// priority; `-` for stdin) to the shared queue that `crawl --queue`
    /// replicas take them from. Bad lines are reported and skipped.
    Enqueue {
        /// The file of URLs.
        file: PathBuf,
        /// The Redis holding the queue (`redis://` or `rediss://`).
        #[arg(long, value_name = "URL")]
        queue: String,
        /// The key space, as the replicas' `--scope`.
        #[arg(long, default_value = "domain")]
        scope: String,
    },
    /// The policies every replica of a scope paces with, published in
    /// Redis (`crawl policy push FILE --redis URL`, or `--redis-cluster`,
    /// `--redis-sentinel` as the replicas name it).
    Policy {
        /// What to do with them.
        #[command(subcommand)]
        action: PolicyCommand,
    },
}

/// `--redis`, `--redis-cluster` and `--redis-sentinel` as `crawl policy`
/// describes them (the main command's words are about the crawl itself).
const REDIS_HELP: &str =
    "The replicas' Redis server (`redis://host:port/`, or `rediss://` for TLS)";
const CLUSTER_HELP: &str =
    "The replicas' Redis Cluster, seeded from these nodes (repeatable; `rediss://` for TLS)";
const SENTINEL_HELP: &str = "The Sentinels that know the replicas' Redis master as \
    `--redis-master` (repeatable; `rediss://` for TLS)";

/// `crawl policy ...`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum PolicyCommand {
    /// Publish the policy file FILE (as `--policy` reads it) to the scope:
    /// every replica started with `--redis` paces with it within a quarter
    /// of its `--lease-ttl`, keeping each host's state, and replicas
    /// started later take it instead of their own `--policy` and flags.
    /// Settings FILE does not name take the crawl's defaults (not the
    /// replicas' flags). A file the replicas would refuse is refused here,
    /// and nothing is published. Prints the version published.
    #[command(group = clap::ArgGroup::new("shared").args(["redis", "redis_cluster", "redis_sentinel"]).required(true))]
    #[command(mut_arg("redis", |a| a.help(REDIS_HELP)))]
    #[command(mut_arg("redis_cluster", |a| a.help(CLUSTER_HELP)))]
    #[command(mut_arg("redis_sentinel", |a| a.help(SENTINEL_HELP)))]
    Push {
        /// The policy file (TOML).
        file: PathBuf,
        /// The replicas' Redis.
        #[command(flatten)]
        redis: RedisTarget,
        /// The replicas' `--scope`.
        #[arg(long, default_value = "domain")]
        scope: String,
        /// The replicas' `--cluster-concurrency` (for the hosts no rule
        /// gives one).
        #[arg(long, default_value = "0")]
        cluster_concurrency: String,
        /// The replicas' `--lease-ttl`.
        #[arg(long, default_value = "30s")]
        lease_ttl: String,
        /// How the published policies key hosts (`host`, `domain`,
        /// `host-port`, `ip`).
        #[arg(long, default_value = "host")]
        key_by: String,
    },
    /// Print the policies published to the scope as a policy file (every
    /// setting written out, the version and `key_by` as comments): pushed
    /// again, it publishes the same policies.
    #[command(group = clap::ArgGroup::new("shared").args(["redis", "redis_cluster", "redis_sentinel"]).required(true))]
    #[command(mut_arg("redis", |a| a.help(REDIS_HELP)))]
    #[command(mut_arg("redis_cluster", |a| a.help(CLUSTER_HELP)))]
    #[command(mut_arg("redis_sentinel", |a| a.help(SENTINEL_HELP)))]
    Show {
        /// The replicas' Redis.
        #[command(flatten)]
        redis: RedisTarget,
        /// The replicas' `--scope`.
        #[arg(long, default_value = "domain")]
        scope: String,
    },
}

impl Command {
    /// Runs the task.
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            #[cfg(feature = "redis")]
            Self::Enqueue { file, queue, scope } => shared::enqueue(&file, &queue, &scope).await,
            #[cfg(not(feature = "redis"))]
            Self::Enqueue { .. } => {
                anyhow::bail!("enqueue needs the crawl built with its `redis` feature")
            }
            #[cfg(feature = "redis")]
            Self::Policy { action } => crate::shared::policy(action).await,
            #[cfg(not(feature = "redis"))]
            Self::Policy { .. } => {
                anyhow::bail!("policy needs the crawl built with its `redis` feature")
            }
        }
    }
}

#[cfg(feature = "redis")]
pub(crate) use self::shared::crawl_queue;

#[cfg(feature = "redis")]
mod shared {
    use std::collections::{HashMap, HashSet};
    use std::io::BufRead;
    use std::path::Path;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use anyhow::Context;
    use redislimit::redis::{QueueItem, SharedQueue};
    use redislimit::{RedisPool, RedisTimeouts};
    use tokio::sync::mpsc;

    use crate::input::check_line;
    use crate::{Args, Crawler, Frontier, StopLevel, Tally, redact};

    /// The queue's name in its scope.
    const NAME: &str = "urls";
    /// The longest pause between two looks at a queue others are still
    /// working through.
    const MAX_PAUSE: Duration = Duration::from_secs(1);

    fn open(url: &str, scope: &str) -> anyhow::Result<SharedQueue> {
        let pool = RedisPool::standalone(url, RedisTimeouts::default())
            .with_context(|| format!("--queue {url}"))?;
        Ok(SharedQueue::new(pool, scope, NAME)?)
    }

    /// `crawl enqueue FILE --queue URL`.
    pub(super) async fn enqueue(file: &Path, url: &str, scope: &str) -> anyhow::Result<()> {
        let queue = open(url, scope)?;
        let context = || format!("cannot read {}", file.display());
        let reader: Box<dyn BufRead> = if file == Path::new("-") {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(file).with_context(context)?,
            ))
        };
        let mut lines = Vec::new();
        let mut skipped = 0;
        for (n, line) in reader.split(b'\n').enumerate() {
            let line = line.with_context(context)?;
            let Ok(text) = std::str::from_utf8(&line) else {
                tracing::warn!("skipped {}:{}: not UTF-8", file.display(), n + 1);
                skipped += 1;
                continue;
            };
            let text = text.trim();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            match check_line(text) {
                Ok(_) => lines.push(text.to_owned()),
                Err(why) => {
                    tracing::warn!("skipped {}:{}: {why}", file.display(), n + 1);
                    skipped += 1;
                }
            }
        }
        queue
            .push(&lines)
            .await
            .context("cannot add to the queue")?;
        println!(
            "{} URLs added to the queue ({skipped} lines skipped)",
            lines.len()
        );
        Ok(())
    }

    /// A name for this replica in the queue's group: its process and a
    /// random part (another replica may have had the same process id).
    fn consumer() -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        format!("crawl-{}-{nanos:08x}", std::process::id())
    }

    /// Crawls batches of the queue at `url` until it is empty and nothing
    /// in it is being fetched, or the crawl is stopped; returns how many
    /// URLs it took.
    pub(crate) async fn crawl_queue(
        args: &Args,
        url: &str,
        crawler: &Crawler,
        tally: &mut Tally,
    ) -> anyhow::Result<usize> {
        let queue = open(url, &args.scope)?;
        let me = consumer();
        let batch = args.queue_batch.unwrap_or(args.concurrency * 16).max(1);
        let stop = crawler.stop_handle();
        let look_again = (args.claim_after / 4).min(MAX_PAUSE);
        let mut took = 0;
        let mut pause = Duration::from_millis(50);
        while stop.level() == StopLevel::Run && crawler.fatal().is_none() {
            let items = match next_items(&queue, &me, batch, args.claim_after).await {
                Ok(Some(items)) => items,
                Ok(None) => break,
                Err(err) => {
                    tracing::warn!(
                        error = %redislimit::error::Causes(&err),
                        "the queue could not be read; asking again"
                    );
                    Vec::new()
                }
            };
            if items.is_empty() {
                sleep_unless_stopped(&stop, pause).await;
                pause = (pause * 2).min(look_again);
                continue;
            }
            pause = Duration::from_millis(50);
            took += items.len();
            crawl_batch(crawler, &queue, &me, items, args.claim_after, tally).await?;
        }
        // Out of the queue's group; what a stop kept it from finishing stays
        // with it, for another replica to take over.
        if let Err(err) = queue.leave(&me).await {
            tracing::debug!(error = %redislimit::error::Causes(&err), "could not leave the queue's group");
        }
        Ok(took)
    }

    /// Items to crawl: new ones, else a dead replica's; `None` when the
    /// queue is empty and nothing in it is taken; none when others still
    /// hold items.
    async fn next_items(
        queue: &SharedQueue,
        me: &str,
        batch: usize,
        claim_after: Duration,
    ) -> Result<Option<Vec<QueueItem>>, redislimit::Error> {
        let items = queue.take(me, batch).await?;
        if !items.is_empty() {
            return Ok(Some(items));
        }
        let items = queue.claim_stale(me, claim_after, batch).await?;
        if !items.is_empty() {
            tracing::info!(
                urls = items.len(),
                "took over URLs another replica left unfinished"
            );
            return Ok(Some(items));
        }
        Ok((!queue.is_empty().await?).then(Vec::new))
    }

    async fn sleep_unless_stopped(stop: &crate::Stop, pause: Duration) {
        let until = tokio::time::Instant::now() + pause;
        while stop.level() == StopLevel::Run && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50).min(pause)).await;
        }
    }

    /// Crawls `items`, keeping them every quarter of `claim_after` (soon
    /// again after a failure) until each is reported and acknowledged;
    /// those a stop kept from starting stay in the queue for another
    /// replica. An item reported is kept until its acknowledgement lands,
    /// so that a Redis that stops answering for a while does not have
    /// another replica fetch it again.
    async fn crawl_batch(
        crawler: &Crawler,
        queue: &SharedQueue,
        me: &str,
        items: Vec<QueueItem>,
        claim_after: Duration,
        tally: &mut Tally,
    ) -> anyhow::Result<()> {
        let mut frontier = Frontier::new();
        let mut priorities = HashMap::new();
        // Each URL's items (the same URL may have been queued twice).
        let mut ids: HashMap<String, Vec<String>> = HashMap::new();
        let mut bad = Vec::new();
        for item in items {
            match check_line(&item.text) {
                Ok((url, priority)) => {
                    if frontier.push(&url)
                        && let Some(priority) = priority
                    {
                        priorities.insert(url.clone(), priority);
                    }
                    ids.entry(redact(&url)).or_default().push(item.id);
                }
                Err(why) => {
                    tracing::warn!(line = %item.text, "a queued line is no URL ({why}): dropped");
                    bad.push(item.id);
                }
            }
        }
        let held: Arc<Mutex<HashSet<String>>> =
            Arc::new(Mutex::new(ids.values().flatten().cloned().collect()));
        let keeper = tokio::spawn({
            let (queue, me, held) = (queue.clone(), me.to_owned(), Arc::clone(&held));
            async move {
                // Every quarter of `claim_after`; after a failure, soon
                // again, so that the URLs are kept as soon as Redis is back.
                let mut pause = claim_after / 4;
                loop {
                    tokio::time::sleep(pause).await;
                    let ids: Vec<String> = lock(&held).iter().cloned().collect();
                    pause = claim_after / 4;
                    if let Err(err) = queue.keep(&me, &ids).await {
                        tracing::warn!(error = %redislimit::error::Causes(&err), "could not keep this replica's URLs in the queue");
                        pause = pause.min(Duration::from_millis(500));
                    }
                }
            }
        });
        let (done, mut acks) = mpsc::unbounded_channel::<Vec<String>>();
        let acker = tokio::spawn({
            let (queue, held, stop) = (queue.clone(), Arc::clone(&held), crawler.stop_handle());
            async move {
                while let Some(mut batch) = acks.recv().await {
                    while let Ok(more) = acks.try_recv() {
                        batch.extend(more);
                    }
                    ack(&queue, &batch, claim_after, &stop).await;
                    lock(&held).retain(|id| !batch.contains(id));
                }
            }
        });
        let _ = done.send(bad);
        let crawler = crawler.clone().with_priorities(priorities);
        let crawled = crawler
            .run_each(frontier, true, |fetched| {
                tally.add(&fetched);
                // Reported (the report line is written): done with it.
                if !fetched.not_started
                    && crawler.fatal().is_none()
                    && let Some(finished) = ids.remove(&fetched.url)
                {
                    let _ = done.send(finished);
                }
            })
            .await;
        drop(done);
        let _ = acker.await;
        keeper.abort();
        crawled.map(drop)
    }

    /// Acknowledges `ids`, trying again (200 ms apart, then longer, at
    /// most 2 s) for up to `claim_after`: past that another replica may
    /// have taken them over anyway. Once the crawl is stopped, three tries
    /// at most, so that a stop does not wait on a Redis that is away.
    async fn ack(queue: &SharedQueue, ids: &[String], claim_after: Duration, stop: &crate::Stop) {
        let give_up = tokio::time::Instant::now() + claim_after;
        let mut pause = Duration::from_millis(200);
        for attempt in 1.. {
            let Err(err) = queue.ack(ids).await else {
                return;
            };
            // Only a Redis away is worth waiting for.
            let stopped = stop.level() != StopLevel::Run && attempt >= 3;
            if stopped || !err.is_unavailable() || tokio::time::Instant::now() + pause >= give_up {
                tracing::warn!(attempt, error = %redislimit::error::Causes(&err), urls = ids.len(), "could not acknowledge URLs in the queue; they may be fetched again");
                return;
            }
            if attempt == 1 {
                tracing::warn!(error = %redislimit::error::Causes(&err), urls = ids.len(), "could not acknowledge URLs in the queue; trying again");
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::args::RedisTarget;

    #[derive(Debug, Parser)]
    #[command(group = clap::ArgGroup::new("shared").args(["redis", "redis_cluster", "redis_sentinel"]))]
    struct Flags {
        #[command(flatten)]
        redis: RedisTarget,
    }

    #[test]
    fn a_sentinel_master_name_beside_another_redis_is_refused() {
        for other in ["--redis", "--redis-cluster"] {
            let argv = ["t", other, "redis://127.0.0.1/", "--redis-master", "m"];
            let err = Flags::try_parse_from(argv).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{argv:?}: {err}"
            );
        }
        let flags = Flags::try_parse_from([
            "t",
            "--redis-sentinel",
            "redis://127.0.0.1:26379/",
            "--redis-master",
            "m",
        ])
        .unwrap();
        assert_eq!(flags.redis.redis_master, "m");
        // `crawl policy` needs a Redis, named as the replicas name theirs.
        for argv in [
            &["crawl", "policy", "show"][..],
            &["crawl", "policy", "push", "p.toml", "--scope", "s"],
        ] {
            let err = crate::Args::try_parse_from(argv).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::MissingRequiredArgument,
                "{argv:?}: {err}"
            );
        }
        let args = crate::Args::try_parse_from([
            "crawl",
            "policy",
            "show",
            "--redis-cluster",
            "redis://127.0.0.1:7000/",
            "--redis-cluster",
            "redis://127.0.0.1:7001/",
        ])
        .unwrap();
        let Some(crate::Command::Policy {
            action: crate::PolicyCommand::Show { redis, .. },
        }) = args.command
        else {
            panic!("{args:?}");
        };
        assert_eq!(redis.redis_cluster.len(), 2);
        // The default name does not count as given.
        let flags = Flags::try_parse_from(["t", "--redis", "redis://127.0.0.1/"]).unwrap();
        assert_eq!(flags.redis.redis.as_deref(), Some("redis://127.0.0.1/"));
    }
}

//! `RedisPool`: one type over standalone, Sentinel and Cluster deployments.

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use deadpool::managed;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::cluster::{ClusterClient, ClusterClientBuilder};
use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, FromRedisValue,
    IntoConnectionInfo, Pipeline, RedisError, ServerErrorKind,
};

#[cfg(feature = "tls-rustls")]
use super::tls::RedisTls;
use crate::{BoxError, ConfigError, Misconfiguration};

mod functions;
pub(crate) use self::functions::Functions;

/// Timeouts and size of the pools the `RedisPool` constructors build.
///
/// A deadpool pool waits forever by default, and a Redis connection without
/// a response timeout waits forever on a frozen server; a pacing limiter in
/// front of every request must not. These defaults bound every Redis call
/// to about a second, after which the limiter reports
/// [`Error::Unavailable`](crate::Error::Unavailable) and a
/// [`FallbackLimiter`](crate::FallbackLimiter) paces in-process instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisTimeouts {
    /// Establishing a connection (TCP connect and handshake).
    pub connect: Duration,
    /// Waiting for the reply to one command.
    pub response: Duration,
    /// Waiting for a free connection in the pool.
    pub pool_wait: Duration,
    /// Connections the pool keeps at most.
    pub max_connections: usize,
}

impl Default for RedisTimeouts {
    /// Connect 1 s, response 500 ms, pool wait 1 s, 16 connections.
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(1),
            response: Duration::from_millis(500),
            pool_wait: Duration::from_secs(1),
            max_connections: 16,
        }
    }
}

impl RedisTimeouts {
    /// Sets these timeouts and size on a deadpool pool builder.
    fn apply<M: managed::Manager, W: From<managed::Object<M>>>(
        &self,
        builder: managed::PoolBuilder<M, W>,
    ) -> managed::PoolBuilder<M, W> {
        builder
            .max_size(self.max_connections)
            .wait_timeout(Some(self.pool_wait))
            .create_timeout(Some(self.connect))
            .recycle_timeout(Some(self.response))
            .runtime(deadpool_redis::Runtime::Tokio1)
    }
}

/// A pool of connections to one Redis deployment.
///
/// `rediss://` URLs connect over TLS (feature `tls-rustls`): standalone,
/// Sentinel and Cluster; `RedisTls` names a CA to
/// trust instead of the system's certificates (not for Sentinel, whose
/// deadpool-redis pool takes none; `SSL_CERT_FILE` works for all three).
///
/// The limiter only runs scripts on it and does not care which deployment
/// it is. The constructors build pools with timeouts set; a deadpool-redis
/// pool passed in (`from_deadpool*`) is used exactly as configured: set its
/// timeouts (see [`RedisTimeouts`] for why).
///
/// ```no_run
/// use redislimit::{RedisPool, RedisTimeouts};
///
/// let standalone = RedisPool::standalone("redis://127.0.0.1:6379/", RedisTimeouts::default())?;
/// let cluster = RedisPool::cluster(&["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"], RedisTimeouts::default())?;
/// let sentinel = RedisPool::sentinel(&["redis://10.0.0.1:26379/"], "mymaster", RedisTimeouts::default())?;
///
/// // TLS (feature `tls-rustls`): `rediss://` trusts the system's certificates,
/// // `RedisTls` your own CA.
/// # #[cfg(feature = "tls-rustls")] {
/// let public = RedisPool::standalone("rediss://redis.example.com:6380/", RedisTimeouts::default())?;
/// let tls = redislimit::RedisTls::ca_file("/etc/redis/tls/ca.crt")?;
/// let private = RedisPool::standalone_tls("rediss://10.0.0.1:6380/", &tls, RedisTimeouts::default())?;
/// # }
///
/// // Or bring your own deadpool-redis pool, with your own timeouts:
/// use redislimit::deadpool_redis::{Config, Runtime, PoolConfig, Timeouts};
/// use std::time::Duration;
/// let mut config = Config::from_url("redis://127.0.0.1:6379/");
/// config.pool = Some(PoolConfig {
///     timeouts: Timeouts {
///         wait: Some(Duration::from_secs(1)),
///         create: Some(Duration::from_secs(1)),
///         recycle: Some(Duration::from_millis(500)),
///     },
///     ..PoolConfig::default()
/// });
/// let mine = RedisPool::from_deadpool(config.create_pool(Some(Runtime::Tokio1)).unwrap());
/// # Ok::<(), redislimit::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RedisPool {
    pools: Pools,
    /// For a standalone `rediss://` pool, the server's `host:port`: a
    /// connection that times out there is checked for plain RESP (see
    /// `misconfig::speaks_plain_resp`).
    tls_at: Option<String>,
}

/// The deployment a [`RedisPool`] reaches, and through what.
#[derive(Clone)]
enum Pools {
    /// One Redis server.
    Standalone(deadpool_redis::Pool),
    /// A master found through Sentinel; connections that meet `READONLY`
    /// after a failover are dropped, so the next call finds the new master.
    Sentinel(deadpool_redis::sentinel::Pool),
    /// A Redis Cluster through a [`ClusterClient`] with a response timeout;
    /// what [`RedisPool::cluster`] builds.
    Cluster(ClusterPool),
    /// A Redis Cluster through deadpool-redis' own cluster pool, which
    /// cannot set a response timeout: a frozen node stalls a call until the
    /// operating system gives up.
    DeadpoolCluster(deadpool_redis::cluster::Pool),
}

impl fmt::Debug for RedisPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, status) = match &self.pools {
            Pools::Standalone(p) => ("Standalone", p.status()),
            Pools::Sentinel(p) => ("Sentinel", p.status()),
            Pools::Cluster(p) => ("Cluster", p.status()),
            Pools::DeadpoolCluster(p) => ("DeadpoolCluster", p.status()),
        };
        f.debug_tuple(kind).field(&status).finish()
    }
}

fn invalid(err: impl fmt::Display) -> ConfigError {
    ConfigError::InvalidRedis {
        reason: err.to_string(),
    }
}

/// Whether `url` asks for TLS (`rediss://`, or `valkeys://`).
fn is_tls(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
}

/// Gets ready for the TLS that any of `urls` asks for, or says that this
/// build cannot speak it.
fn prepare_tls<'a>(urls: impl IntoIterator<Item = &'a str>) -> Result<(), ConfigError> {
    if !urls.into_iter().any(is_tls) {
        return Ok(());
    }
    #[cfg(feature = "tls-rustls")]
    {
        super::tls::ensure_crypto_provider();
        Ok(())
    }
    #[cfg(not(feature = "tls-rustls"))]
    Err(invalid(
        "a rediss:// URL needs TLS: enable the `tls-rustls` feature of redislimit",
    ))
}

impl RedisPool {
    /// A pool of connections to one server at `url` (`redis://host:port/db`,
    /// or `rediss://` for TLS, trusting the system's certificates; see
    /// `RedisPool::standalone_tls` to trust your own CA).
    pub fn standalone(url: &str, timeouts: RedisTimeouts) -> Result<Self, ConfigError> {
        prepare_tls([url])?;
        Self::standalone_at(url, timeouts)
    }

    /// A pool of TLS connections to one server at `url` (`rediss://...`)
    /// that trust the CA certificates of `tls` (feature `tls-rustls`).
    #[cfg(feature = "tls-rustls")]
    pub fn standalone_tls(
        url: &str,
        tls: &RedisTls,
        timeouts: RedisTimeouts,
    ) -> Result<Self, ConfigError> {
        if !is_tls(url) {
            return Err(invalid(format!("{url}: a TLS pool needs a rediss:// URL")));
        }
        prepare_tls([url])?;
        let client = redis::Client::build_with_tls(url, tls.certificates()).map_err(invalid)?;
        Self::standalone_at(client.get_connection_info().clone(), timeouts)
    }

    /// Whether it reaches a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.pools, Pools::Cluster(_) | Pools::DeadpoolCluster(_))
    }

    fn of(pools: Pools) -> Self {
        Self {
            pools,
            tls_at: None,
        }
    }

    fn standalone_at(
        info: impl IntoConnectionInfo,
        timeouts: RedisTimeouts,
    ) -> Result<Self, ConfigError> {
        let info = info.into_connection_info().map_err(invalid)?;
        let tls_at = match info.addr() {
            ConnectionAddr::TcpTls { host, port, .. } => Some(format!("{host}:{port}")),
            _ => None,
        };
        let connection = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response));
        let manager =
            deadpool_redis::Manager::new_with_config(info, connection).map_err(invalid)?;
        let pool = timeouts
            .apply(deadpool_redis::Pool::builder(manager))
            .build()
            .map_err(invalid)?;
        Ok(Self {
            pools: Pools::Standalone(pool),
            tls_at,
        })
    }

    /// A pool of connections to the master that the Sentinels at
    /// `sentinels` know as `master_name`. Connections use the Redis
    /// client's default timeouts (1 s connect, 500 ms response).
    ///
    /// With `rediss://` Sentinel URLs, the master is reached over TLS as
    /// well; both trust the system's certificates (deadpool-redis' Sentinel
    /// pool takes no CA of its own: point `SSL_CERT_FILE` at your CA).
    pub fn sentinel(
        sentinels: &[&str],
        master_name: &str,
        timeouts: RedisTimeouts,
    ) -> Result<Self, ConfigError> {
        prepare_tls(sentinels.iter().copied())?;
        let node = sentinels.iter().any(|url| is_tls(url)).then_some(
            deadpool_redis::sentinel::SentinelNodeConnectionInfo {
                tls_mode: Some(deadpool_redis::sentinel::TlsMode::Secure),
                redis_connection_info: None,
            },
        );
        let manager = deadpool_redis::sentinel::Manager::new(
            sentinels.to_vec(),
            master_name.to_owned(),
            node,
            deadpool_redis::sentinel::SentinelServerType::Master,
        )
        .map_err(invalid)?;
        let pool = timeouts
            .apply(deadpool_redis::sentinel::Pool::builder(manager))
            .build()
            .map_err(invalid)?;
        Ok(Self::of(Pools::Sentinel(pool)))
    }

    /// A pool of cluster connections seeded from `nodes` (`rediss://` URLs
    /// for TLS, trusting the system's certificates; see
    /// `RedisPool::cluster_tls` to trust your own CA).
    pub fn cluster(nodes: &[&str], timeouts: RedisTimeouts) -> Result<Self, ConfigError> {
        prepare_tls(nodes.iter().copied())?;
        Self::cluster_with(ClusterClientBuilder::new(nodes.to_vec()), timeouts)
    }

    /// A pool of TLS cluster connections seeded from `nodes`
    /// (`rediss://...`) that trust the CA certificates of `tls` (feature
    /// `tls-rustls`).
    #[cfg(feature = "tls-rustls")]
    pub fn cluster_tls(
        nodes: &[&str],
        tls: &RedisTls,
        timeouts: RedisTimeouts,
    ) -> Result<Self, ConfigError> {
        prepare_tls(nodes.iter().copied())?;
        if let Some(plain) = nodes.iter().find(|url| !is_tls(url)) {
            return Err(invalid(format!(
                "{plain}: a TLS cluster needs rediss:// node URLs"
            )));
        }
        let builder = ClusterClientBuilder::new(nodes.to_vec()).certs(tls.certificates());
        Self::cluster_with(builder, timeouts)
    }

    /// A pool of your own, to one server, used exactly as configured (set
    /// its wait, create and recycle timeouts, and its connections'
    /// response timeout: see [`RedisTimeouts`] for why).
    pub fn from_deadpool(pool: deadpool_redis::Pool) -> Self {
        Self::of(Pools::Standalone(pool))
    }

    /// A Sentinel pool of your own, used exactly as configured.
    pub fn from_deadpool_sentinel(pool: deadpool_redis::sentinel::Pool) -> Self {
        Self::of(Pools::Sentinel(pool))
    }

    /// deadpool-redis' own Cluster pool, used exactly as configured. It
    /// cannot set a response timeout, so a frozen node stalls a call until
    /// the operating system gives up; prefer [`RedisPool::cluster`].
    pub fn from_deadpool_cluster(pool: deadpool_redis::cluster::Pool) -> Self {
        Self::of(Pools::DeadpoolCluster(pool))
    }

    fn cluster_with(
        builder: ClusterClientBuilder,
        timeouts: RedisTimeouts,
    ) -> Result<Self, ConfigError> {
        let client = builder
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.response)
            .retries(2)
            .build()
            .map_err(invalid)?;
        let pool = timeouts
            .apply(ClusterPool::builder(ClusterManager::new(client)))
            .build()
            .map_err(invalid)?;
        Ok(Self::of(Pools::Cluster(pool)))
    }
}

/// One multiplexed connection taken from the pool and shared by every call
/// (a multiplexed connection pipelines concurrent commands), so a call
/// costs one round trip and no pool check-out (deadpool pings a connection
/// each time it hands it out). A connection that failed in a way that can
/// outlive the call (I/O, timeout, `READONLY` after a failover) is dropped,
/// and the next call takes a fresh one from the pool, within the pool's
/// own timeouts.
pub(crate) struct Connections {
    pool: RedisPool,
    /// The shared connection and its generation.
    current: Mutex<(u64, Option<Conn>)>,
    /// Held while a replacement connection is being made, so a crowd of
    /// callers after a failure makes one connection, not one each.
    connecting: tokio::sync::Mutex<()>,
    /// How scripts are run through these connections (see
    /// [`Functions`]).
    functions: Functions,
}

#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Connections {
    pub(crate) fn new(pool: RedisPool) -> Self {
        Self {
            pool,
            current: Mutex::new((0, None)),
            connecting: tokio::sync::Mutex::new(()),
            functions: Functions::new(),
        }
    }

    /// How scripts are run through these connections.
    pub(crate) fn functions(&self) -> &Functions {
        &self.functions
    }

    pub(crate) fn pool(&self) -> &RedisPool {
        &self.pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Option<Conn>)> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn cached(&self) -> Option<(u64, Conn)> {
        let current = self.lock();
        current.1.clone().map(|conn| (current.0, conn))
    }

    /// The shared connection, made first if there is none. Only the
    /// making is a future of its own (boxed: the pools' futures are kilobytes,
    /// and every call's future would otherwise carry them).
    async fn connection(&self) -> Result<(u64, Conn), QueryError> {
        match self.cached() {
            Some(cached) => Ok(cached),
            None => Box::pin(self.connect()).await,
        }
    }

    async fn connect(&self) -> Result<(u64, Conn), QueryError> {
        let _connecting = self.connecting.lock().await;
        if let Some(cached) = self.cached() {
            return Ok(cached);
        }
        let pool_err = |e: deadpool_redis::PoolError| QueryError::Pool(Box::new(e));
        let conn = match &self.pool.pools {
            Pools::Standalone(p) => match p.get().await {
                Ok(conn) => Conn::Single(deadpool_redis::Connection::take(conn)),
                Err(e) => return Err(self.diagnose_tls(e).await),
            },
            Pools::Sentinel(p) => Conn::Single(deadpool_redis::sentinel::Connection::take(
                p.get().await.map_err(pool_err)?,
            )),
            Pools::Cluster(p) => Conn::Cluster(managed::Object::take(
                p.get().await.map_err(|e| QueryError::Pool(Box::new(e)))?,
            )),
            Pools::DeadpoolCluster(p) => Conn::Cluster(deadpool_redis::cluster::Connection::take(
                p.get().await.map_err(pool_err)?,
            )),
        };
        let mut current = self.lock();
        current.0 += 1;
        current.1 = Some(conn.clone());
        Ok((current.0, conn))
    }

    /// A TLS connection that timed out may have been a TLS hello waiting
    /// on a plain port for an answer that never comes: ask the port in
    /// plain RESP, so that the caller learns of the misconfiguration
    /// instead of an outage.
    async fn diagnose_tls(&self, err: deadpool_redis::PoolError) -> QueryError {
        let timed_out = matches!(
            &err,
            deadpool_redis::PoolError::Backend(e) if e.is_timeout()
        ) || matches!(&err, deadpool_redis::PoolError::Timeout(_));
        if let (true, Some(addr)) = (timed_out, &self.pool.tls_at)
            && super::misconfig::speaks_plain_resp(addr).await
        {
            return QueryError::Misconfigured(
                Misconfiguration::Tls,
                format!(
                    "the server at {addr} answers plain RESP: it does not speak TLS \
                     (use redis:// for it, or point rediss:// at its TLS port)"
                )
                .into(),
            );
        }
        QueryError::Pool(Box::new(err))
    }

    /// Runs `cmd` on the shared connection.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, QueryError> {
        let (generation, mut conn) = self.connection().await?;
        let result = match &mut conn {
            Conn::Single(c) => cmd.query_async::<T>(c).await,
            Conn::Cluster(c) => cmd.query_async::<T>(c).await,
        };
        result.map_err(|err| self.failed(generation, err))
    }

    /// Runs `pipe` on the shared connection, as [`Self::query`] runs a
    /// command.
    pub(crate) async fn query_pipe<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
    ) -> Result<T, QueryError> {
        let (generation, mut conn) = self.connection().await?;
        let result = match &mut conn {
            Conn::Single(c) => pipe.query_async::<T>(c).await,
            Conn::Cluster(c) => pipe.query_async::<T>(c).await,
        };
        result.map_err(|err| self.failed(generation, err))
    }

    /// `err`, from a call on the connection of `generation`, which is
    /// dropped (the next call connects again) when `err` says it is lost.
    fn failed(&self, generation: u64, err: RedisError) -> QueryError {
        if should_discard(&err) {
            let mut current = self.lock();
            if current.0 == generation {
                current.1 = None;
            }
        }
        QueryError::Redis(err)
    }
}

fn should_discard(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || matches!(
            err.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
        // Before Redis 7, a write refused inside a script comes back as a
        // script error whose text carries the READONLY.
        || err.to_string().contains("READONLY")
}

/// Why a Redis call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QueryError {
    /// No connection could be had from the pool.
    #[error("no Redis connection: {0}")]
    Pool(#[source] BoxError),
    /// The command failed.
    #[error(transparent)]
    Redis(RedisError),
    /// What answered showed that the limiter is set up wrong for it.
    #[error("{1}")]
    Misconfigured(Misconfiguration, #[source] BoxError),
}

impl QueryError {
    /// The error as the `source` of the limiter's own.
    pub(crate) fn into_source(self) -> BoxError {
        match self {
            Self::Pool(e) | Self::Misconfigured(_, e) => e,
            Self::Redis(e) => Box::new(e),
        }
    }

    pub(crate) fn is_noscript(&self) -> bool {
        matches!(self, Self::Redis(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript))
    }
}

/// A deadpool pool of Redis Cluster connections with a response timeout.
type ClusterPool = managed::Pool<ClusterManager>;

/// Creates and recycles [`ClusterConnection`]s for a [`ClusterPool`].
struct ClusterManager {
    client: ClusterClient,
}

impl ClusterManager {
    /// A manager opening connections with `client`.
    fn new(client: ClusterClient) -> Self {
        Self { client }
    }
}

impl fmt::Debug for ClusterManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterManager").finish_non_exhaustive()
    }
}

impl managed::Manager for ClusterManager {
    type Type = ClusterConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<ClusterConnection, RedisError> {
        self.client.get_async_connection().await
    }

    async fn recycle(
        &self,
        conn: &mut ClusterConnection,
        _: &managed::Metrics,
    ) -> managed::RecycleResult<RedisError> {
        redis::cmd("PING").query_async::<()>(conn).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::is_tls;

    #[test]
    fn tls_urls_are_recognised_by_scheme() {
        assert!(is_tls("rediss://127.0.0.1:6380/"));
        assert!(is_tls("REDISS://example.com/"));
        assert!(is_tls("valkeys://example.com/"));
        assert!(!is_tls("redis://rediss.example.com/"));
        assert!(!is_tls("127.0.0.1:6379"));
    }

    #[cfg(not(feature = "tls-rustls"))]
    #[test]
    fn a_tls_url_without_the_feature_names_the_feature() {
        use super::{RedisPool, RedisTimeouts};
        use crate::ConfigError;

        let err = RedisPool::standalone("rediss://127.0.0.1:6380/", RedisTimeouts::default())
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::InvalidRedis { reason } if reason.contains("tls-rustls")),
            "{err}"
        );
    }
}

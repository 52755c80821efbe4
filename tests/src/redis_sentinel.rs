//! [`RedisSentinel`]: a master, one replica and one Sentinel monitoring them as `mymaster`.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use crate::{
    RedisServer, TestCa,
    redis_server::{Launch, info_field},
    resp::Reply,
    wait::wait_until,
};

/// How long replication and Sentinel discovery get before the start panics.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);

/// A Sentinel deployment on free loopback ports: a master, a replica of it
/// (`--replicaof`), and one `redis-sentinel` with
///
/// ```text
/// sentinel monitor mymaster 127.0.0.1 <master port> 1
/// sentinel down-after-milliseconds mymaster 1000
/// sentinel failover-timeout mymaster 5000
/// ```
///
/// With a quorum of 1, killing the master makes the Sentinel promote the replica within a
/// few seconds; [`RedisSentinel::wait_for_master`] waits for that. Every process is a
/// [`RedisServer`], so each can be killed, paused or restarted. Dropping the deployment
/// kills all three.
#[derive(Debug)]
pub struct RedisSentinel {
    master: RedisServer,
    replica: RedisServer,
    sentinel: RedisServer,
}

impl RedisSentinel {
    /// The name the Sentinel monitors the master under.
    pub const MASTER_NAME: &'static str = "mymaster";

    /// Starts the master, the replica and the Sentinel, and waits (at most 20 s each)
    /// until the replica is in sync and the Sentinel reports the master and sees the
    /// replica (so a failover can happen); panics otherwise.
    pub fn start() -> Self {
        Self::start_down_after(1000)
    }

    /// Like [`RedisSentinel::start`], with the Sentinel taking the master for down
    /// after `down_after_ms` without an answer (and promoting the replica then).
    pub fn start_down_after(down_after_ms: u64) -> Self {
        Self::create(down_after_ms, None)
    }

    /// Like [`RedisSentinel::start`], every process speaking TLS only (the Sentinel
    /// too, and replication between the servers), with certificates of one fresh
    /// [`TestCa`]: clients must trust [`RedisSentinel::ca`].
    pub fn start_tls() -> Self {
        Self::create(1000, Some(Arc::new(TestCa::new())))
    }

    /// The CA of a [`RedisSentinel::start_tls`] deployment.
    pub fn ca(&self) -> Option<&TestCa> {
        self.sentinel.tls()
    }

    fn create(down_after_ms: u64, tls: Option<Arc<TestCa>>) -> Self {
        // Either may serve a full sync (the replica after a failover): no 5 s batching delay.
        let no_delay = ["--repl-diskless-sync-delay", "0"];
        let start = |args: &[&str]| match &tls {
            Some(ca) => {
                RedisServer::start_tls_with(&[args, &["--tls-replication", "yes"]].concat(), ca)
            }
            None => RedisServer::start_with(args),
        };
        let master = start(&no_delay);
        let master_port = master.port().to_string();
        let replica = start(&[&no_delay[..], &["--replicaof", "127.0.0.1", &master_port]].concat());
        wait_until(
            &format!("{} to replicate {}", replica.addr(), master.addr()),
            SETUP_TIMEOUT,
            || {
                let info = replica.query(&["INFO", "replication"]);
                let info = info.as_str().unwrap_or_default();
                match info_field(info, "master_link_status") {
                    Some("up") => Ok(()),
                    other => Err(format!("master_link_status is {other:?}")),
                }
            },
        );

        let name = Self::MASTER_NAME;
        let mut config = format!(
            "sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds {name} {down_after_ms}\n\
             sentinel failover-timeout {name} 5000\n"
        );
        let mut launch = Launch::sentinel(String::new());
        if tls.is_some() {
            // The Sentinel talks TLS to the servers it watches.
            config.push_str("tls-replication yes\n");
            launch.tls = tls;
        }
        launch.config = Some(config);
        let sentinel = RedisServer::launch(launch);
        let deployment = Self {
            master,
            replica,
            sentinel,
        };
        deployment.wait_for_master(deployment.master.addr(), SETUP_TIMEOUT);

        let replica_port = deployment.replica.port().to_string();
        wait_until(
            &format!("the sentinel to see replica {replica_port}"),
            SETUP_TIMEOUT,
            || {
                let replicas = deployment.sentinel.query(&["SENTINEL", "REPLICAS", name]);
                let found = replicas.as_array().unwrap_or_default().iter().any(|entry| {
                    field(entry, "port") == Some(replica_port.as_str())
                        && field(entry, "flags") == Some("slave")
                });
                if found {
                    Ok(())
                } else {
                    Err(format!("SENTINEL REPLICAS answered {replicas:?}"))
                }
            },
        );
        deployment
    }

    /// The process started as the master (after a failover it may be a replica or dead).
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// The process started as the replica (the one a failover promotes).
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// The Sentinel process.
    pub fn sentinel(&self) -> &RedisServer {
        &self.sentinel
    }

    /// [`RedisSentinel::MASTER_NAME`].
    pub fn master_name(&self) -> &'static str {
        Self::MASTER_NAME
    }

    /// The master's address as the Sentinel reports it now
    /// (`SENTINEL get-master-addr-by-name mymaster`), `None` if it reports none. Panics if
    /// the Sentinel cannot be reached.
    pub fn master_addr(&self) -> Option<SocketAddr> {
        let reply =
            self.sentinel
                .query(&["SENTINEL", "get-master-addr-by-name", Self::MASTER_NAME]);
        match reply.as_array()? {
            [ip, port] => {
                let ip: IpAddr = ip.as_str()?.parse().ok()?;
                Some(SocketAddr::new(ip, port.as_str()?.parse().ok()?))
            }
            _ => None,
        }
    }

    /// Waits (at most `timeout`) until the Sentinel reports `addr` as the master, e.g.
    /// the replica's after killing the master; panics otherwise.
    pub fn wait_for_master(&self, addr: SocketAddr, timeout: Duration) {
        wait_until(
            &format!("the sentinel to report master {addr}"),
            timeout,
            || match self.master_addr() {
                Some(reported) if reported == addr => Ok(()),
                other => Err(format!("it reports {other:?}")),
            },
        );
    }
}

/// The value of `name` in a flat field/value array such as one `SENTINEL REPLICAS` entry.
fn field<'a>(entry: &'a Reply, name: &str) -> Option<&'a str> {
    entry
        .as_array()?
        .chunks(2)
        .find(|pair| pair[0].as_str() == Some(name))
        .and_then(|pair| pair.get(1)?.as_str())
}

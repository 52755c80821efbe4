//! Shared support for redislimit's integration tests: real Redis processes to test against.
//!
//! - [`RedisServer`]: a standalone `redis-server` on a free loopback port that a test can
//!   kill, pause, resume and restart; [`RedisServer::start_tls`] serves TLS only, with a
//!   certificate of a [`TestCa`] made at run time;
//! - [`RedisCluster`]: three Cluster masters covering every slot, with a replica each
//!   when asked;
//! - [`RedisSentinel`]: a master, a replica and a Sentinel monitoring them;
//! - [`resp`]: a tiny blocking RESP2 client to poke at them directly;
//! - [`model`]: a reference model of one host's state in Redis, which the differential
//!   test runs beside the real scripts;
//! - [`Upstream`]: a real HTTP server on loopback that serves any host name and records
//!   when each request arrived and when its response ended;
//! - [`StallProxy`]: a TCP proxy that can hold the traffic it carries, one way or both (a stalled connection), delay its replies, or cut it;
//! - [`Nginx`]: a real nginx whose `limit_req` and `limit_conn` judge the clients in front of it;
//! - [`record`]: what an upstream saw, and the checks of the pacing invariants on it;
//! - [`keys`]: the Redis keys of a host, from the documented layout;
//! - [`StallProbe`]: how late the runtime's timers fire, to tell a busy machine from a
//!   defect in a test of timing.
//!
//! Everything waits for its processes with a bound and panics with the server's log when
//! they do not come up: a Redis-backed test fails, it never skips. The binaries
//! (`redis-server`, `redis-cli`, `redis-sentinel`) must be on `PATH`; `cargo xtask test`
//! installs them. [`SERVER_ENV`] (`REDISLIMIT_REDIS_SERVER`) names another server binary
//! to start instead, such as a `valkey-server`.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod keys;
pub mod model;
mod nginx;
mod port;
mod proxy;
pub mod record;
mod redis_cluster;
mod redis_sentinel;
mod redis_server;
pub mod resp;
mod stalls;
mod tls;
mod upstream;
mod wait;

pub use self::{
    nginx::{Logged, Nginx, NginxConfig},
    proxy::StallProxy,
    redis_cluster::RedisCluster,
    redis_sentinel::RedisSentinel,
    redis_server::{RedisServer, SERVER_ENV},
    stalls::{Stall, StallProbe},
    tls::TestCa,
    upstream::{Upstream, body_size},
};

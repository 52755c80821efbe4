//! `SharedQueue`: work items (a crawl's URL lines) in a Redis stream with
//! one consumer group, taken by any number of replicas.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{Cmd, FromRedisValue, Value, cmd};

use super::backend::{Backend, CallError};
use super::keys::{RedisKeys, check_name};
use super::pool::{QueryError, RedisPool};
use crate::{ConfigError, Error, Op};

/// The consumer group every replica reads the stream through.
const GROUP: &str = "workers";
/// Items added by one call.
const PUSH_BATCH: usize = 1000;
/// The most `XAUTOCLAIM` pages one [`SharedQueue::claim_stale`] reads.
const CLAIM_PAGES: usize = 16;

/// Adds `ARGV` to the stream `KEYS[1]`, each as field `i`.
const PUSH: &str = "for i = 1, #ARGV do redis.call('XADD', KEYS[1], '*', 'i', ARGV[i]) end \
                    return #ARGV";
/// Acknowledges items `ARGV[1..]` and deletes them, at once: the stream
/// holds what is left to do, and its length says when all is done.
const ACK: &str = "local n = redis.call('XACK', KEYS[1], 'workers', unpack(ARGV)) \
                   redis.call('XDEL', KEYS[1], unpack(ARGV)) return n";
/// Resets the idle time of the items `ARGV[2..]` that consumer `ARGV[1]`
/// still holds (not those another has taken over); returns how many.
const KEEP: &str = "local n = 0 for i = 2, #ARGV do \
                    local p = redis.call('XPENDING', KEYS[1], 'workers', ARGV[i], ARGV[i], 1) \
                    if p[1] and p[1][2] == ARGV[1] then \
                    redis.call('XCLAIM', KEYS[1], 'workers', ARGV[1], 0, ARGV[i], 'JUSTID') \
                    n = n + 1 end end return n";
/// Deletes consumer `ARGV[1]` from the group when it holds no items;
/// returns 1 when it is out of the group, 0 when it still holds items.
const LEAVE: &str = "local ok, p = pcall(redis.call, 'XPENDING', KEYS[1], 'workers', '-', '+', 1, ARGV[1]) \
                     if not ok then local e = type(p) == 'table' and p.err or tostring(p) \
                     if string.find(e, 'NOGROUP', 1, true) then return 1 end \
                     return redis.error_reply(e) end \
                     if #p > 0 then return 0 end \
                     redis.call('XGROUP', 'DELCONSUMER', KEYS[1], 'workers', ARGV[1]) return 1";
/// Deletes the group's consumers that hold no items and have been idle
/// for `ARGV[1]` ms as `XINFO CONSUMERS` counts it (replicas that ended
/// without leaving, or died and had their items taken over); returns how
/// many. One that holds nothing loses nothing, and one that asks again is
/// added back.
const REAP: &str = "local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], 'workers') \
                    if not ok then return 0 end \
                    local n = 0 for _, c in ipairs(consumers) do \
                    local f = {} for i = 1, #c, 2 do f[c[i]] = c[i + 1] end \
                    if f['pending'] == 0 and f['idle'] >= tonumber(ARGV[1]) then \
                    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], 'workers', f['name']) \
                    n = n + 1 end end return n";

/// Work items shared by any number of replicas: a Redis stream with one
/// consumer group, as scrapy-redis and URLFrontier keep a crawl's URLs.
///
/// [`push`](Self::push) adds items; [`take`](Self::take) gives a replica
/// items no one has had; an item stays pending on its replica until
/// [`ack`](Self::ack) (which also deletes it, so the stream holds what is
/// left to do and [`len`](Self::len) says when all is done). A replica
/// [`keep`](Self::keep)s its items while it works on them; those of a
/// replica that died stop being kept, and [`claim_stale`](Self::claim_stale)
/// gives them to another once they have been idle long enough. An item is
/// so taken at most once at a time, unless its replica stalls past the
/// idle time. A replica that is done [`leave`](Self::leave)s the group;
/// `claim_stale` also removes those that hold nothing and have been idle
/// as long (a replica that died), so the group does not grow with every
/// replica ever started.
///
/// Cheap to clone. Errors are [`Error::Unavailable`] (as `Op::Shared`)
/// when Redis could not be asked.
#[derive(Clone)]
pub struct SharedQueue {
    backend: Arc<Backend>,
    stream: Arc<str>,
}

/// An item taken from a [`SharedQueue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueItem {
    /// Its id in the stream, to [`ack`](SharedQueue::ack) or
    /// [`keep`](SharedQueue::keep) it.
    pub id: String,
    /// What was pushed.
    pub text: String,
}

impl SharedQueue {
    /// The queue `name` of `scope` (a scope as [`RedisLimiter`](crate::RedisLimiter)
    /// takes it) on the Redis `pool` reaches, under the default prefix
    /// (`redislimit`); a bad scope is refused.
    pub fn new(pool: RedisPool, scope: &str, name: &str) -> Result<Self, ConfigError> {
        check_name("scope", scope)?;
        Ok(Self {
            backend: Arc::new(Backend::new(pool)),
            stream: RedisKeys::queue("redislimit", scope, name).into(),
        })
    }

    /// Adds `items`, in order (one script call per thousand).
    pub async fn push(&self, items: &[String]) -> Result<(), Error> {
        self.ensure_group().await?;
        for chunk in items.chunks(PUSH_BATCH) {
            let mut push = eval(PUSH, &self.stream);
            push.arg(chunk);
            self.call::<i64>(&push).await?;
        }
        Ok(())
    }

    /// Up to `count` items no replica has had yet, for `consumer` (a name
    /// unique to the replica); none when there are none.
    pub async fn take(&self, consumer: &str, count: usize) -> Result<Vec<QueueItem>, Error> {
        let mut read = cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(count.max(1))
            .arg("STREAMS")
            .arg(&*self.stream)
            .arg(">");
        let reply = match self.raw::<Value>(&read).await {
            Err(err) if has_code(&err, "NOGROUP") => {
                self.ensure_group().await?;
                self.call::<Value>(&read).await?
            }
            reply => reply.map_err(|e| e.into_error(Op::Shared))?,
        };
        // [[stream, [entry, ...]]], or nil when there is nothing new.
        Ok(match reply {
            Value::Array(streams) => streams
                .into_iter()
                .filter_map(|s| match s {
                    Value::Array(mut pair) if pair.len() == 2 => pair.pop(),
                    _ => None,
                })
                .flat_map(entries)
                .collect(),
            _ => Vec::new(),
        })
    }

    /// Up to `count` items another replica took and has not kept for
    /// `idle`, now `consumer`'s. Then the replicas that hold nothing and
    /// have been idle for `idle` as Redis counts it (a replica asking an
    /// empty queue may count as idle) are taken out of the group (best
    /// effort: a failure there is logged, not returned). Taking one out
    /// loses nothing: asking for items again puts it back.
    pub async fn claim_stale(
        &self,
        consumer: &str,
        idle: Duration,
        count: usize,
    ) -> Result<Vec<QueueItem>, Error> {
        let mut claimed = Vec::new();
        let mut cursor = "0-0".to_owned();
        for _ in 0..CLAIM_PAGES {
            let mut claim = cmd("XAUTOCLAIM");
            claim
                .arg(&*self.stream)
                .arg(GROUP)
                .arg(consumer)
                .arg(idle.as_millis().min(u128::from(u64::MAX)) as u64)
                .arg(&cursor)
                .arg("COUNT")
                .arg(count.saturating_sub(claimed.len()).max(1));
            let reply = match self.raw::<Value>(&claim).await {
                Err(err) if has_code(&err, "NOGROUP") => return Ok(claimed),
                reply => reply.map_err(|e| e.into_error(Op::Shared))?,
            };
            // [next cursor, [entry, ...], (deleted ids)]
            let Value::Array(mut parts) = reply else {
                break;
            };
            if parts.len() < 2 {
                break;
            }
            let found = parts.swap_remove(1);
            cursor = String::from_redis_value(parts.swap_remove(0)).unwrap_or_default();
            claimed.extend(entries(found));
            if cursor == "0-0" || cursor.is_empty() || claimed.len() >= count {
                break;
            }
        }
        let mut reap = eval(REAP, &self.stream);
        reap.arg(idle.as_millis().min(u128::from(u64::MAX)) as u64);
        match self.call::<i64>(&reap).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::debug!(stream = %self.stream, n, "idle queue consumers holding nothing removed")
            }
            Err(err) => {
                tracing::debug!(stream = %self.stream, error = %crate::error::Causes(&err), "could not remove idle queue consumers")
            }
        }
        Ok(claimed)
    }

    /// Takes `consumer` out of the group when it holds no items; whether
    /// it is out of it now (`false`: it still holds items, which stay with
    /// it for [`claim_stale`](Self::claim_stale) to give to another). A
    /// replica calls it when it is done; asking for items again puts it
    /// back.
    pub async fn leave(&self, consumer: &str) -> Result<bool, Error> {
        let mut leave = eval(LEAVE, &self.stream);
        leave.arg(consumer);
        match self.raw::<i64>(&leave).await {
            Err(err) if has_code(&err, "NOGROUP") => Ok(true),
            left => left.map(|n| n == 1).map_err(|e| e.into_error(Op::Shared)),
        }
    }

    /// Resets the idle time of the items among `ids` that `consumer` still
    /// holds, so that no other replica claims them; returns how many it
    /// still holds.
    pub async fn keep(&self, consumer: &str, ids: &[String]) -> Result<usize, Error> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut keep = eval(KEEP, &self.stream);
        keep.arg(consumer).arg(ids);
        self.call::<i64>(&keep)
            .await
            .map(|n| usize::try_from(n).unwrap_or(0))
    }

    /// Acknowledges the items `ids` (done) and deletes them.
    pub async fn ack(&self, ids: &[String]) -> Result<(), Error> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut ack = eval(ACK, &self.stream);
        ack.arg(ids);
        self.call::<i64>(&ack).await.map(drop)
    }

    /// Items not yet acknowledged: those no one has had, and those taken.
    pub async fn len(&self) -> Result<u64, Error> {
        let mut len = cmd("XLEN");
        len.arg(&*self.stream);
        self.call(&len).await
    }

    /// Whether [`len`](Self::len) is 0.
    pub async fn is_empty(&self) -> Result<bool, Error> {
        self.len().await.map(|n| n == 0)
    }

    /// Creates the stream and its group when missing.
    async fn ensure_group(&self) -> Result<(), Error> {
        let mut create = cmd("XGROUP");
        create
            .arg("CREATE")
            .arg(&*self.stream)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM");
        match self.raw::<Value>(&create).await {
            Err(err) if has_code(&err, "BUSYGROUP") => Ok(()),
            done => done.map(drop).map_err(|e| e.into_error(Op::Shared)),
        }
    }

    async fn call<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, Error> {
        self.raw(cmd).await.map_err(|e| e.into_error(Op::Shared))
    }

    async fn raw<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, CallError> {
        self.backend.command(&self.stream, cmd).await
    }
}

/// `EVAL script 1 key`, arguments to follow.
fn eval(script: &str, key: &str) -> Cmd {
    let mut eval = cmd("EVAL");
    eval.arg(script).arg(1).arg(key);
    eval
}

/// Whether `err` is Redis's error reply `code` (`NOGROUP`, `BUSYGROUP`).
fn has_code(err: &CallError, code: &str) -> bool {
    matches!(err, CallError::Failed { err: QueryError::Redis(e), .. } if e.code() == Some(code))
}

/// The items of a stream reply's entries (`[[id, [field, value]]...]`;
/// a deleted entry, nil or without fields, is left out).
fn entries(list: Value) -> Vec<QueueItem> {
    let Value::Array(list) = list else {
        return Vec::new();
    };
    list.into_iter()
        .filter_map(|entry| {
            let (id, fields) = <(String, Vec<String>)>::from_redis_value(entry).ok()?;
            let text = fields.into_iter().nth(1)?;
            Some(QueueItem { id, text })
        })
        .collect()
}

impl fmt::Debug for SharedQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedQueue")
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

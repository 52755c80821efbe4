//! The circuit: how a `RedisLimiter` stops asking a Redis that failed to
//! answer, and how it learns that Redis is back.
//!
//! It reads Redis, never the caller: it opens on failures of Redis itself
//! (no connection, refused, reset, a response timeout of the pool's
//! connections) and on nothing a caller did (a call its own deadline cut
//! short says nothing about Redis). Any answer from Redis closes it, from
//! any operation, an error reply included: an answer means Redis is there.
//!
//! A Cluster has one circuit per master node ([`Circuits`]): a key's call
//! observes the circuit of the node that serves its slot, as the last slot
//! map read says, so a dead master sends only its own hosts to the
//! fallback. Until a map is read (and for standalone and Sentinel), one
//! circuit stands for the whole of Redis.

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use deadpool_redis::redis::RedisError;
use tokio::time::Instant;

use super::pool::QueryError;

/// How long calls skip a Redis that failed to answer before one probes it.
const REPROBE: Duration = Duration::from_secs(1);

/// Whether Redis is skipped for now, shared by every caller of one limiter.
#[derive(Debug)]
pub(crate) struct Circuit {
    /// Until when (µs since `epoch`) calls skip Redis; 0 while it answers.
    until: AtomicU64,
    epoch: Instant,
}

impl Circuit {
    pub(crate) fn new() -> Self {
        Self {
            until: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Microseconds since this circuit was made.
    fn clock_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX - 1)
    }

    /// Whether a call should skip Redis for now because it just failed to
    /// answer. Once a second one caller is let through to probe it: a frozen
    /// Redis costs one timeout a second, not one per request.
    pub(crate) fn open(&self) -> bool {
        let until = self.until.load(Ordering::Acquire);
        if until == 0 {
            return false;
        }
        let now = self.clock_us();
        if now < until {
            return true;
        }
        let probe_until = now.saturating_add(REPROBE.as_micros() as u64);
        // Whoever moves the mark forward is the probe; everyone else waits.
        self.until
            .compare_exchange(until, probe_until, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    }

    /// Whether the circuit is open and not yet due for a probe (no side
    /// effect: the probe is chosen by [`open`](Self::open)).
    pub(crate) fn waiting(&self) -> bool {
        let until = self.until.load(Ordering::Acquire);
        until != 0 && self.clock_us() < until
    }

    /// Whether the last call answered (no failure since, nor a probe
    /// under way).
    pub(crate) fn closed(&self) -> bool {
        self.until.load(Ordering::Acquire) == 0
    }

    /// Redis answered (an error reply included): the circuit closes.
    pub(crate) fn answered(&self) {
        if self.until.load(Ordering::Acquire) != 0 {
            self.until.store(0, Ordering::Release);
        }
    }

    /// A call failed with `err`: the circuit opens if Redis did not answer,
    /// and closes if it did (an error reply).
    ///
    /// An open circuit's next probe stays where it is: a second after the
    /// probe under way started, not after it timed out. So once Redis
    /// answers again, a caller reaches it within a second, even when the
    /// last probe before was lost with the connection (it times out after
    /// the response timeout, half a second by default).
    pub(crate) fn observe_failure(&self, err: &QueryError) {
        if not_answering(err) {
            let now = self.clock_us();
            let reopen = now.saturating_add(REPROBE.as_micros() as u64).max(1);
            let _ = self
                .until
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |until| {
                    (until <= now).then_some(reopen)
                });
        } else {
            self.answered();
        }
    }
}

/// The number of Cluster hash slots.
const SLOTS: usize = 16384;

/// Node circuits kept for a Cluster; masters beyond this share them.
const NODES: usize = 64;

/// The circuits of one limiter: one for the whole of Redis, and for a
/// Cluster one per master node, found through a slot map.
#[derive(Debug)]
pub(crate) struct Circuits {
    whole: Circuit,
    nodes: Option<Nodes>,
}

/// A Cluster's node circuits and the slot map that leads to them.
struct Nodes {
    /// Slot -> 1 + the index of its node in `names` (0: not known).
    slots: Box<[AtomicU16]>,
    /// Slot -> the failure domain it was first seen in (0: not known). It
    /// stays when a failover moves the slot to another node: the hosts an
    /// outage sent to their shares keep taking turns through the failover.
    domains: Box<[AtomicU16]>,
    circuits: Box<[Circuit]>,
    /// The nodes' addresses, by index; a node keeps its index (and its
    /// circuit) across maps.
    names: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nodes")
            .field(
                "names",
                &*self.names.lock().unwrap_or_else(PoisonError::into_inner),
            )
            .finish_non_exhaustive()
    }
}

impl Circuits {
    /// One circuit for the whole of Redis, and node circuits when
    /// `cluster`.
    pub(crate) fn new(cluster: bool) -> Self {
        Self {
            whole: Circuit::new(),
            nodes: cluster.then(|| Nodes {
                slots: (0..SLOTS).map(|_| AtomicU16::new(0)).collect(),
                domains: (0..SLOTS).map(|_| AtomicU16::new(0)).collect(),
                circuits: (0..NODES).map(|_| Circuit::new()).collect(),
                names: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Whether node circuits are kept (a Cluster).
    pub(crate) fn per_node(&self) -> bool {
        self.nodes.is_some()
    }

    /// The circuit for calls on `key`: its node's, once the slot map
    /// names one, else the whole's.
    pub(crate) fn of(&self, key: &str) -> &Circuit {
        let Some(nodes) = &self.nodes else {
            return &self.whole;
        };
        match nodes.slots[slot(key)].load(Ordering::Relaxed) {
            0 => &self.whole,
            node => &nodes.circuits[usize::from(node - 1) % NODES],
        }
    }

    /// The failure domain of `key`: 0 for the whole of Redis (or before a
    /// slot map), else 1 + the index of the node that served its slot when
    /// it was first mapped (kept through failovers).
    pub(crate) fn domain(&self, key: &str) -> u32 {
        let Some(nodes) = &self.nodes else {
            return 0;
        };
        u32::from(nodes.domains[slot(key)].load(Ordering::Relaxed))
    }

    /// The circuit of calls on no key (`PING`): the whole's.
    pub(crate) fn whole(&self) -> &Circuit {
        &self.whole
    }

    /// Whether any circuit holds calls off now: the slot map may be stale
    /// (a failover moves slots).
    pub(crate) fn any_waiting(&self) -> bool {
        self.whole.waiting()
            || self
                .nodes
                .as_ref()
                .is_some_and(|n| n.circuits.iter().any(Circuit::waiting))
    }

    /// Whether a slot map was read.
    pub(crate) fn mapped(&self) -> bool {
        self.nodes.as_ref().is_some_and(|n| {
            !n.names
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty()
        })
    }

    /// Takes a slot map: ranges of slots (inclusive) and the address of
    /// the master serving each.
    pub(crate) fn learn(&self, map: &[(u16, u16, String)]) {
        let Some(nodes) = &self.nodes else {
            return;
        };
        let mut names = nodes.names.lock().unwrap_or_else(PoisonError::into_inner);
        for (start, end, addr) in map {
            let index = match names.iter().position(|n| n == addr) {
                Some(i) => i,
                None => {
                    names.push(addr.clone());
                    names.len() - 1
                }
            };
            let node = u16::try_from(index % NODES + 1).unwrap_or(1);
            for slot in usize::from(*start)..=usize::from(*end).min(SLOTS - 1) {
                nodes.slots[slot].store(node, Ordering::Relaxed);
                let _ = nodes.domains[slot].compare_exchange(
                    0,
                    node,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
        }
    }
}

/// The slot ranges and master addresses of a `CLUSTER SLOTS` reply (what
/// cannot be read is left out).
pub(crate) fn slot_map(reply: &deadpool_redis::redis::Value) -> Vec<(u16, u16, String)> {
    use deadpool_redis::redis::Value;
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let (start, end) = (int(fields.first()?)?, int(fields.get(1)?)?);
            let Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let host = text(master.first()?)?;
            let port = match master.get(1)? {
                Value::Int(p) => *p,
                _ => return None,
            };
            Some((start, end, format!("{host}:{port}")))
        })
        .collect()
}

/// The Cluster hash slot of `key` (CRC16 of its hash tag, as Redis reads
/// it: the first `{...}` with something inside, else the whole key).
fn slot(key: &str) -> usize {
    let bytes = key.as_bytes();
    let tagged = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    usize::from(crc16::State::<crc16::XMODEM>::calculate(tagged)) % SLOTS
}

/// Whether a failure says Redis could not be reached or did not answer (as
/// opposed to an answer that was an error reply).
pub(crate) fn not_answering(err: &QueryError) -> bool {
    if super::misconfig::diagnose(err).is_some() {
        // It answered: wrongly set up, not away.
        return false;
    }
    match err {
        QueryError::Misconfigured(..) => false,
        QueryError::Pool(_) => true,
        QueryError::Redis(e) => connection_error(e),
    }
}

/// Whether a Redis error is about the connection, not an answer.
fn connection_error(e: &RedisError) -> bool {
    e.is_timeout() || e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> QueryError {
        QueryError::Redis(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )))
    }

    fn error_reply() -> QueryError {
        QueryError::Redis(RedisError::from((
            deadpool_redis::redis::ErrorKind::Server(
                deadpool_redis::redis::ServerErrorKind::ResponseError,
            ),
            "WRONGTYPE",
        )))
    }

    #[test]
    fn slots_are_redis_slots() {
        // Redis's own answers (CLUSTER KEYSLOT).
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), 3443);
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}"));
        assert_eq!(slot("foo{}{bar}"), 8363);
        assert_eq!(slot("foo{{bar}}zap"), 4015);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_node_opens_only_its_own_slots() {
        let c = Circuits::new(true);
        assert!(std::ptr::eq(c.of("{a}"), c.whole()), "no map yet");
        c.learn(&[
            (0, 8191, "10.0.0.1:7000".into()),
            (8192, 16383, "10.0.0.2:7000".into()),
        ]);
        let (low, high) = ("foo", "{user1000}.following");
        assert!(slot(high) < 8192 && slot(low) >= 8192);
        c.of(low).observe_failure(&refused());
        assert!(c.of(low).waiting() && !c.of(high).waiting());
        assert!(c.any_waiting() && !c.whole().waiting());
        // A failover moves the slots to another node, whose circuit is
        // closed; the dead node keeps its index.
        let domain = c.domain(low);
        assert!(domain != 0 && domain != c.domain(high));
        c.learn(&[(8192, 16383, "10.0.0.3:7000".into())]);
        assert!(!c.of(low).waiting());
        assert_eq!(c.domain(low), domain, "a failover keeps the domain");
        let standalone = Circuits::new(false);
        assert!(std::ptr::eq(standalone.of(low), standalone.whole()));
    }

    #[tokio::test(start_paused = true)]
    async fn opens_on_failures_to_answer_and_closes_on_any_answer() {
        let c = Circuit::new();
        assert!(!c.open());
        c.observe_failure(&refused());
        assert!(c.open() && c.waiting());
        c.observe_failure(&error_reply());
        assert!(!c.open(), "an error reply is an answer");
        c.observe_failure(&refused());
        tokio::time::advance(REPROBE).await;
        assert!(!c.waiting());
        assert!(!c.open(), "the first caller after a second probes");
        assert!(c.open(), "the others keep skipping while it does");
        c.answered();
        assert!(!c.open());
    }

    /// A probe that times out (half a second later, the default response
    /// timeout) does not push the next one back: it comes a second after
    /// the failed one started, as do the probes of a Redis that stays
    /// away (one timeout a second).
    #[tokio::test(start_paused = true)]
    async fn a_probe_that_times_out_keeps_the_next_a_second_after_it_started() {
        let c = Circuit::new();
        c.observe_failure(&refused());
        tokio::time::advance(REPROBE).await;
        assert!(!c.open(), "the probe");
        tokio::time::advance(REPROBE / 2).await;
        c.observe_failure(&refused());
        assert!(c.open() && c.waiting());
        tokio::time::advance(REPROBE / 2 - Duration::from_millis(1)).await;
        assert!(c.open(), "not before a second after the probe started");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!c.open(), "the next probe, a second after the last began");
        // A circuit due for a probe that nobody has taken yet reopens for
        // a full second on a failure (a call sent before it opened).
        tokio::time::advance(REPROBE * 3).await;
        c.observe_failure(&refused());
        tokio::time::advance(REPROBE - Duration::from_millis(1)).await;
        assert!(c.open());
    }
}

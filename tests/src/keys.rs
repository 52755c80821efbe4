//! [`HostKeys`]: the Redis keys of one host's state, computed from the
//! layout `docs/DESIGN.md` describes ("Keys in Redis"), so that a test can
//! read or corrupt them; that the limiter uses these names is checked by
//! every test that does.

use sha2::{Digest, Sha256};

/// The keys of one host's state in one scope (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostKeys {
    /// The HASH with `next`, the serialized holder, the backoff gap.
    pub gate: String,
    /// The ZSET of leases (lease mode).
    pub leases: String,
    /// The quota's admissions (a ZSET, or a HASH of buckets).
    pub admits: String,
    /// The ZSET of voided tokens.
    pub void: String,
    /// The HASH of the waiting line across replicas.
    pub waiting: String,
}

impl HostKeys {
    /// The keys of `host` (its key, as the limiter keys it) in `scope`
    /// under the default prefix, `redislimit`.
    pub fn of(scope: &str, host: &str) -> Self {
        Self::with_prefix("redislimit", scope, host)
    }

    /// The keys of `host` in `scope` under `prefix`.
    pub fn with_prefix(prefix: &str, scope: &str, host: &str) -> Self {
        let base = format!("{prefix}:{scope}:{{{}}}", tag(&[prefix, scope, host]));
        Self {
            gate: format!("{base}:gate"),
            leases: format!("{base}:leases"),
            admits: format!("{base}:admits"),
            void: format!("{base}:void"),
            waiting: format!("{base}:waiting"),
        }
    }

    /// These keys with the waiting line of the rule `pattern` (hosts keyed
    /// by registrable domain wait in a line per rule; `""` is the default
    /// pacing's).
    pub fn in_lane(mut self, pattern: &str) -> Self {
        self.waiting = format!("{}:{}", self.waiting, &tag(&[pattern])[..16]);
        self
    }
}

/// The keys of the value `name` of kind `kind` that a `SharedCache` of
/// `scope` under the default prefix keeps: the value, and the claim of the
/// replica fetching it.
pub fn shared(scope: &str, kind: &str, name: &str) -> (String, String) {
    let prefix = "redislimit";
    let base = format!(
        "{prefix}:{scope}:{{{}}}:shared",
        tag(&[prefix, scope, "shared", kind, name])
    );
    (base.clone(), format!("{base}:claim"))
}

/// The registry of the replicas of `scope` under the default prefix (a
/// ZSET of replica id to expiry), and beside it when each entry was added
/// (a HASH).
pub fn registry(scope: &str) -> (String, String) {
    let prefix = "redislimit";
    let replicas = format!("{prefix}:{scope}:{{{}}}:replicas", tag(&[prefix, scope]));
    (replicas.clone(), format!("{replicas}:joined"))
}

/// The stream of the `SharedQueue` `name` of `scope` under the default
/// prefix.
pub fn queue(scope: &str, name: &str) -> String {
    let prefix = "redislimit";
    format!(
        "{prefix}:{scope}:{{{}}}:queue",
        tag(&[prefix, scope, "queue", name])
    )
}

/// The first 128 bits of SHA-256 over the length-prefixed `parts`, in hex.
fn tag(parts: &[&str]) -> String {
    let mut digest = Sha256::new();
    for part in parts {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part.as_bytes());
    }
    digest.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

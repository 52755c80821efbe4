//! The Redis key layout: one hash tag per (prefix, scope, host), derived by hashing.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::{ConfigError, HostKey};

/// The Redis keys holding one host's pacing state in one scope.
///
/// Every key is `<prefix>:<scope>:{<tag>}:<role>`, where `<tag>` is derived
/// by hashing the prefix, scope and host: all keys of a host share one hash
/// tag (one Cluster slot), and a host name can neither pick its slot nor
/// produce another host's key. What each key holds is described once, in
/// `docs/DESIGN.md` ("Keys in Redis").
///
/// The five keys are one string, one after another (one allocation: the
/// keys are made for every acquire).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RedisKeys {
    /// The keys in the order of [`all`](Self::all).
    text: String,
    /// Where each key ends in `text`.
    ends: [usize; 5],
}

/// The keys' roles, in the order the scripts take them:
/// - `gate`: the HASH with the host's next allowed send (and the
///   serialized holder);
/// - `leases`: the ZSET of leases in flight (lease mode);
/// - `admits`: the ZSET of admission instants inside the quota window;
/// - `void`: the ZSET of abandoned acquires that must book nothing if they
///   run;
/// - `waiting`: the HASH of the waiting line across replicas, the acquires
///   told to wait, by when they joined, kept while they keep asking. Keyed
///   by registrable domain, hosts of one domain under different rules wait
///   in lines of their own (see [`RedisKeys::in_lane`]).
const ROLES: [&str; 5] = ["gate", "leases", "admits", "void", "waiting"];

impl fmt::Debug for RedisKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys = f.debug_struct("RedisKeys");
        for (role, key) in ROLES.iter().zip(self.all()) {
            keys.field(role, &key);
        }
        keys.finish()
    }
}

impl RedisKeys {
    /// The keys of `host` in `scope` under `prefix`.
    pub(crate) fn new(prefix: &str, scope: &str, host: &HostKey) -> Self {
        let tag = tag_hex(&[prefix, scope, host.as_str()]);
        let tag = std::str::from_utf8(&tag).expect("hex digits are ASCII");
        let base = prefix.len() + scope.len() + tag.len() + 5;
        let roles: usize = ROLES.iter().map(|r| r.len()).sum();
        // Room for a lane as well (see `in_lane`).
        let mut text = String::with_capacity(ROLES.len() * base + roles + 17);
        let mut ends = [0; 5];
        for (end, role) in ends.iter_mut().zip(ROLES) {
            for part in [prefix, ":", scope, ":{", tag, "}:", role] {
                text.push_str(part);
            }
            *end = text.len();
        }
        Self { text, ends }
    }

    /// The key in place `i` of [`all`](Self::all).
    fn key(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start..self.ends[i]]
    }

    /// The HASH with the host's next allowed send (and the serialized holder).
    pub(crate) fn gate(&self) -> &str {
        self.key(0)
    }

    /// The ZSET of leases in flight (lease mode).
    pub(crate) fn leases(&self) -> &str {
        self.key(1)
    }

    /// The key recording the settings every replica of `scope` under
    /// `prefix` admits with (see `RedisLimiter::check_config`): a STRING,
    /// under a hash tag of its own that no host's tag can equal.
    pub(crate) fn config(prefix: &str, scope: &str) -> String {
        format!("{prefix}:{scope}:{{{}}}:config", tag(&[prefix, scope]))
    }

    /// When the settings in [`config`](Self::config) were first recorded
    /// (a STRING of µs on the server's clock), under the same hash tag.
    pub(crate) fn config_since(prefix: &str, scope: &str) -> String {
        format!("{}:since", Self::config(prefix, scope))
    }

    /// The HASH of the policies published to `scope` under `prefix`
    /// (`version`, `text`), under the hash tag of [`config`](Self::config).
    pub(crate) fn policy(prefix: &str, scope: &str) -> String {
        format!("{}:policy", Self::config(prefix, scope))
    }

    /// The registry of the replicas of `scope` under `prefix` (a ZSET of
    /// replica id to expiry), under a hash tag of its own.
    pub(crate) fn replicas(prefix: &str, scope: &str) -> String {
        format!("{prefix}:{scope}:{{{}}}:replicas", tag(&[prefix, scope]))
    }

    /// When each entry of the [`replicas`](Self::replicas) registry was
    /// added (a HASH of replica id to µs on the server's clock), under its
    /// hash tag.
    pub(crate) fn joined(prefix: &str, scope: &str) -> String {
        format!("{}:joined", Self::replicas(prefix, scope))
    }

    /// The STRING holding the value `name` of kind `kind` shared by the
    /// replicas of `scope` (see `SharedCache`), and the STRING naming the
    /// replica fetching it: under one hash tag of their own, which the
    /// name (a robots.txt's origin, say) cannot choose.
    pub(crate) fn shared(prefix: &str, scope: &str, kind: &str, name: &str) -> (String, String) {
        let base = format!(
            "{prefix}:{scope}:{{{}}}:shared",
            tag(&[prefix, scope, "shared", kind, name])
        );
        let claim = format!("{base}:claim");
        (base, claim)
    }

    /// The stream of the `SharedQueue` `name` of `scope`, under a hash
    /// tag of its own.
    pub(crate) fn queue(prefix: &str, scope: &str, name: &str) -> String {
        format!(
            "{prefix}:{scope}:{{{}}}:queue",
            tag(&[prefix, scope, "queue", name])
        )
    }

    /// These keys with a waiting line of their own for `lane` (a rule's
    /// pattern), beside the one state: hosts that share a key but not a
    /// rule must not wait behind each other, since each is admitted on its
    /// own rule's terms (a quota one has and the other has not, say).
    pub(crate) fn in_lane(mut self, lane: &str) -> Self {
        // The waiting line is the last key: the lane is appended to it.
        let tag = tag_hex(&[lane]);
        self.text.push(':');
        self.text
            .push_str(std::str::from_utf8(&tag[..16]).expect("hex digits are ASCII"));
        self.ends[4] = self.text.len();
        self
    }

    /// The keys in the order the scripts take them.
    pub(crate) fn all(&self) -> [&str; 5] {
        std::array::from_fn(|i| self.key(i))
    }
}

/// The first 128 bits of SHA-256 over the length-prefixed `parts`, in hex:
/// different lists of parts never give the same input.
fn tag(parts: &[&str]) -> String {
    String::from_utf8(tag_hex(parts).to_vec()).expect("hex digits are ASCII")
}

/// [`tag`]'s hex digits, without an allocation.
fn tag_hex(parts: &[&str]) -> [u8; 32] {
    let mut digest = Sha256::new();
    for part in parts {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part.as_bytes());
    }
    let digest = digest.finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0; 32];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(&digest[..16]) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
    hex
}

/// Refuses a prefix or scope that could break the key layout: empty, longer
/// than 64 bytes, or holding anything but ASCII letters, digits and `-_.:/`
/// (a `{` would choose the Cluster slot).
pub(crate) fn check_name(field: &'static str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidName {
            field,
            value: value.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn keys(host: &str) -> RedisKeys {
        RedisKeys::new(
            "redislimit",
            "domain",
            &HostKey::parse(&format!("http://{host}/")).unwrap(),
        )
    }

    /// The text between the first `{` and the next `}`: what Redis Cluster hashes.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').unwrap();
        let close = open + key[open..].find('}').unwrap();
        &key[open + 1..close]
    }

    #[test]
    fn all_keys_of_a_host_share_one_tag() {
        let k = keys("example.com");
        let tag = hash_tag(k.gate());
        assert_eq!(tag.len(), 32);
        assert!(k.all().iter().all(|key| hash_tag(key) == tag));
        assert!(k.gate().starts_with("redislimit:domain:{"));
        // The layout, against a tag computed another way.
        let mut digest = Sha256::new();
        for part in ["redislimit", "domain", "example.com"] {
            digest.update((part.len() as u64).to_be_bytes());
            digest.update(part.as_bytes());
        }
        let hex: String = digest.finalize()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let base = format!("redislimit:domain:{{{hex}}}:");
        let roles = ["gate", "leases", "admits", "void", "waiting"];
        let expected: Vec<String> = roles.iter().map(|r| format!("{base}{r}")).collect();
        assert_eq!(k.all().to_vec(), expected);
    }

    #[test]
    fn a_lane_gives_the_waiting_line_alone_a_key_of_its_own() {
        let k = keys("example.com");
        let (a, b) = (k.clone().in_lane("*.example.com"), k.clone().in_lane(""));
        for lane in [&a, &b] {
            assert_eq!(lane.all()[..4], k.all()[..4]);
            let waiting = lane.all()[4];
            let suffix = waiting.strip_prefix(k.all()[4]).unwrap();
            assert_eq!(suffix.len(), 17, "{waiting}");
            assert!(suffix.starts_with(':'));
            assert_eq!(hash_tag(waiting), hash_tag(k.gate()));
        }
        assert_ne!(a.all()[4], b.all()[4]);
        assert_eq!(a, k.in_lane("*.example.com"));
        assert!(format!("{a:?}").contains(a.all()[4]));
    }

    #[test]
    fn hosts_cannot_steer_or_collide() {
        // `url` percent-encodes most of these, but a host key is only ever
        // hashed, so even hostile text stays out of the key's structure.
        let hostile = [
            "example.com",
            "{example.com}",
            "a}b{c",
            "example.com:gate",
            "xn--bcher-kva.example",
            "[::1]",
            "127.0.0.1",
        ];
        let mut tags = HashSet::new();
        for h in hostile {
            let host = match HostKey::parse(&format!("http://{h}/")) {
                Ok(host) => host,
                Err(_) => continue,
            };
            let k = RedisKeys::new("redislimit", "domain", &host);
            for key in k.all() {
                assert_eq!(key.matches('{').count(), 1, "{key}");
                assert!(!key.contains(host.as_str()), "{key} embeds the host");
            }
            tags.insert(hash_tag(k.gate()).to_owned());
        }
        assert!(tags.len() >= 5, "{tags:?}");
    }

    #[test]
    fn scope_and_prefix_separate_key_spaces() {
        let host = HostKey::parse("http://example.com/").unwrap();
        let a = RedisKeys::new("p", "domain", &host);
        let b = RedisKeys::new("p", "search", &host);
        let c = RedisKeys::new("q", "domain", &host);
        assert_ne!(a.gate(), b.gate());
        assert_ne!(a.gate(), c.gate());
        // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
        assert_ne!(
            RedisKeys::new("ab", "c", &host).gate()[5..],
            RedisKeys::new("a", "bc", &host).gate()[5..]
        );
    }

    #[test]
    fn names_that_could_break_the_layout_are_refused() {
        for bad in [
            "",
            "a{b",
            "a}b",
            "with space",
            "tab\t",
            "é",
            &"x".repeat(65),
        ] {
            assert!(check_name("scope", bad).is_err(), "{bad:?}");
        }
        for good in ["domain", "search-api", "omni.feed:ratelimit", "a/b_c"] {
            assert!(check_name("scope", good).is_ok(), "{good:?}");
        }
    }
}

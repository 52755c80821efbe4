//! `Policies`: a default [`Pacing`] and rules for exact hosts or suffixes,
//! and [`KeyBy`], what one paced "host" is.

use std::collections::HashMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;

use crate::address::{AddressBook, SharedBook};
use crate::{AddressResolver, BoxFuture, ConfigError, HostKey, Pacing, SystemResolver};

#[cfg(feature = "redis")]
mod record;

type RuleMap = HashMap<Box<str>, usize, foldhash::fast::RandomState>;

/// What the state a request is paced against is kept under: its key.
///
/// Hooks, reports and Redis keys name the key; [`Policies`] rules still
/// match the request's own host. Crawlers choose differently: Nutch and
/// StormCrawler queue by host, by domain or by IP (`partition.url.mode`
/// `byHost`, `byDomain`, `byIP`); Heritrix keys its queues by the SURT
/// authority, host and port (its default, `HostnameQueueAssignmentPolicy`);
/// Scrapy's download slots are per host name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KeyBy {
    /// The host ([`HostKey`]): `a.example.com` and `b.example.com` are
    /// paced apart; ports are not told apart. The default.
    #[default]
    Host,
    /// The registrable domain: the public suffix plus one label, from the
    /// public suffix list embedded in the `psl` crate, so `a.example.co.uk`
    /// and `b.example.co.uk` are paced as `example.co.uk`. IP literals,
    /// single-label names such as `localhost`, names that are themselves
    /// a public suffix and names under a suffix the list does not know
    /// fall back to the host.
    RegistrableDomain,
    /// The host and its port (explicit, or the scheme's default):
    /// `a.test:8080` and `a.test:8081` are paced apart, as Heritrix does.
    /// A key made without a URL (no port known) is the host.
    HostPort,
    /// The host's address, as Nutch's and StormCrawler's `byIP` queues
    /// and Heritrix's IP policy: host names served by one machine share
    /// one limit. Names are resolved by the policies'
    /// [`AddressResolver`](crate::AddressResolver) ([`SystemResolver`](crate::SystemResolver)
    /// unless [`Policies::with_address_resolver`] gives another) once per
    /// TTL (the system's resolver tells none: 60 s), when a request to
    /// them is acquired; a name with several addresses is keyed by the
    /// lowest (IPv4 before IPv6), whatever order they come in, so that
    /// replicas agree (those given different subsets of a name's addresses
    /// may not). A name that cannot be resolved is keyed by itself (with a
    /// warning) until it resolves; one that resolved before keeps its last
    /// address. IP literals are their own key. `KeyBy::key` alone (without
    /// [`Policies::key`]'s lookups) keys a name by itself.
    Ip,
}

impl KeyBy {
    /// The key `host` is paced under.
    ///
    /// ```
    /// use redislimit::{HostKey, KeyBy};
    ///
    /// let host = HostKey::parse("https://b.example.co.uk:8443/").unwrap();
    /// assert_eq!(KeyBy::Host.key(&host).as_str(), "b.example.co.uk");
    /// assert_eq!(KeyBy::RegistrableDomain.key(&host).as_str(), "example.co.uk");
    /// assert_eq!(KeyBy::HostPort.key(&host).as_str(), "b.example.co.uk:8443");
    /// ```
    pub fn key(self, host: &HostKey) -> HostKey {
        match self {
            Self::Host | Self::Ip => host.clone(),
            Self::HostPort => match host.port() {
                Some(port) => HostKey::named(format!("{host}:{port}")),
                None => host.clone(),
            },
            Self::RegistrableDomain => {
                let name = host.as_str();
                if name.starts_with('[') || name.parse::<Ipv4Addr>().is_ok() {
                    return host.clone();
                }
                match psl::domain(name.as_bytes()) {
                    Some(domain) if domain.suffix().is_known() => {
                        let domain = domain.as_bytes();
                        if domain.len() == name.len() {
                            host.clone()
                        } else {
                            // A tail of an ASCII name: ASCII too.
                            HostKey::named(String::from_utf8_lossy(domain).into_owned())
                        }
                    }
                    _ => host.clone(),
                }
            }
        }
    }

    /// The name used in configuration: `host`, `domain`, `host-port` or
    /// `ip`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::RegistrableDomain => "domain",
            Self::HostPort => "host-port",
            Self::Ip => "ip",
        }
    }

    /// Whether hosts under different rules can share one key (a domain,
    /// an address).
    #[cfg(feature = "redis")]
    pub(crate) fn merges_hosts(self) -> bool {
        matches!(self, Self::RegistrableDomain | Self::Ip)
    }
}

impl std::str::FromStr for KeyBy {
    type Err = ConfigError;

    /// `host`, `domain`, `host-port` or `ip`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "host" => Ok(Self::Host),
            "domain" => Ok(Self::RegistrableDomain),
            "host-port" => Ok(Self::HostPort),
            "ip" => Ok(Self::Ip),
            _ => Err(ConfigError::InvalidRule {
                rule: s.to_owned(),
                reason: "key-by must be host, domain, host-port or ip",
            }),
        }
    }
}

/// One rule of [`Policies`]: the pacing of the hosts `pattern` matches.
///
/// A pattern is an exact host (`api.example.com`) or `*.` and a suffix
/// (`*.example.com`), which matches every host *below* that suffix
/// (`a.example.com`, `b.a.example.com`) but not the suffix itself: the
/// apex `example.com` takes a rule of its own, as with TLS wildcard
/// certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pattern: String,
    pacing: Pacing,
    cluster_concurrency: Option<u32>,
}

impl Rule {
    /// `pacing` for the hosts `pattern` matches (checked when the rule is
    /// added to [`Policies`]).
    pub fn new(pattern: impl Into<String>, pacing: Pacing) -> Self {
        Self {
            pattern: pattern.into(),
            pacing,
            cluster_concurrency: None,
        }
    }

    /// For a Redis limiter: the cross-replica in-flight cap of these
    /// hosts (0 serializes them), in place of the limiter's own.
    pub fn with_cluster_concurrency(mut self, n: u32) -> Self {
        self.cluster_concurrency = Some(n);
        self
    }

    /// The pattern, as normalized when the rule was added.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The pacing of the hosts it matches.
    pub fn pacing(&self) -> &Pacing {
        &self.pacing
    }

    /// Its own cross-replica in-flight cap, when it sets one.
    pub fn cluster_concurrency(&self) -> Option<u32> {
        self.cluster_concurrency
    }
}

/// The pacing of every host: a default, and [`Rule`]s for exact hosts and
/// host suffixes, the most specific match winning (an exact host over any
/// suffix, a longer suffix over a shorter one); and what a host is keyed
/// by ([`KeyBy`]).
///
/// Looking a host up costs a hash lookup per label of its name, however
/// many rules there are. Cloning is cheap (a reference count).
///
/// ```
/// use std::time::Duration;
/// use redislimit::{HostKey, Pacing, Policies, Rule};
///
/// # fn main() -> Result<(), redislimit::ConfigError> {
/// let polite = Pacing::builder().min_delay(Duration::from_secs(2)).build()?;
/// let api = Pacing::builder()
///     .min_delay(Duration::ZERO)
///     .quota(5_000)
///     .window(Duration::from_secs(3600))
///     .build()?;
/// let policies = Policies::new(polite)
///     .with_rule(Rule::new("api.example.com", api.clone()))?
///     .with_rule(Rule::new("*.cdn.example.com", Pacing::default()))?;
/// let host = |u: &str| HostKey::parse(u).unwrap();
/// assert_eq!(policies.pacing_for(&host("https://api.example.com/v1")), &api);
/// assert_eq!(policies.rule_for(&host("http://x.cdn.example.com/")).unwrap().pattern(), "*.cdn.example.com");
/// assert!(policies.rule_for(&host("http://cdn.example.com/")).is_none(), "not the apex");
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Policies {
    table: Arc<Table>,
}

#[derive(Clone, PartialEq, Eq)]
struct Table {
    default: Pacing,
    rules: Vec<Rule>,
    /// Exact host -> index in `rules`. A fast hash: only the rules are
    /// stored, so a hostile host name can slow no lookup but its own.
    exact: RuleMap,
    /// Suffix (without `*.`) -> index in `rules`.
    suffix: RuleMap,
    /// How many labels the suffixes in `suffix` have: bit `n` for `n`
    /// (bit 63 for 63 or more). A host's walk over its own suffixes looks
    /// up only those with as many labels as some rule's.
    suffix_labels: u64,
    key_by: KeyBy,
    /// Addresses of names, with [`KeyBy::Ip`].
    addresses: Option<SharedBook>,
}

impl Policies {
    /// `default` for every host, keyed by host.
    pub fn new(default: Pacing) -> Self {
        Self {
            table: Arc::new(Table {
                default,
                rules: Vec::new(),
                exact: RuleMap::default(),
                suffix: RuleMap::default(),
                suffix_labels: 0,
                key_by: KeyBy::Host,
                addresses: None,
            }),
        }
    }

    /// Adds `rule`, or refuses it, naming it, when its pattern is not an
    /// exact host or `*.` and a suffix in normalized form (lower case,
    /// IDNA as punycode, no port, no trailing dot) or repeats another
    /// rule's pattern.
    pub fn with_rule(self, mut rule: Rule) -> Result<Self, ConfigError> {
        let pattern = normalize(&rule.pattern)?;
        let mut table = Arc::unwrap_or_clone(self.table);
        let (name, map) = match pattern.strip_prefix("*.") {
            Some(suffix) => (suffix.to_owned(), &mut table.suffix),
            None => (pattern.clone(), &mut table.exact),
        };
        if map.contains_key(name.as_str()) {
            return Err(ConfigError::InvalidRule {
                rule: rule.pattern,
                reason: "another rule has the same pattern",
            });
        }
        if pattern.starts_with("*.") {
            table.suffix_labels |= label_bit(labels(&name));
        }
        map.insert(name.into_boxed_str(), table.rules.len());
        rule.pattern = pattern;
        table.rules.push(rule);
        Ok(Self {
            table: Arc::new(table),
        })
    }

    /// Keys hosts by `key_by` (default [`KeyBy::Host`]).
    pub fn with_key_by(self, key_by: KeyBy) -> Self {
        let mut table = Arc::unwrap_or_clone(self.table);
        table.key_by = key_by;
        if key_by == KeyBy::Ip && table.addresses.is_none() {
            table.addresses = Some(SharedBook(Arc::new(AddressBook::new(Arc::new(
                SystemResolver,
            )))));
        }
        Self {
            table: Arc::new(table),
        }
    }

    /// Resolves names with `resolver` for [`KeyBy::Ip`] (give it the
    /// resolution the HTTP client uses, overrides included). The addresses
    /// found are kept for these policies and their clones: a limiter and
    /// whatever else keys hosts through them agree.
    pub fn with_address_resolver(self, resolver: Arc<dyn AddressResolver>) -> Self {
        let mut table = Arc::unwrap_or_clone(self.table);
        table.addresses = Some(SharedBook(Arc::new(AddressBook::new(resolver))));
        Self {
            table: Arc::new(table),
        }
    }

    /// The pacing of hosts no rule matches.
    pub fn default_pacing(&self) -> &Pacing {
        &self.table.default
    }

    /// The rules, in the order they were added.
    pub fn rules(&self) -> &[Rule] {
        &self.table.rules
    }

    /// What hosts are keyed by.
    pub fn key_by(&self) -> KeyBy {
        self.table.key_by
    }

    /// The key `host`'s requests are paced under (see [`KeyBy`]). Keyed
    /// by [`KeyBy::Ip`], the address `host` was last resolved to (limiters
    /// resolve it when a request to it is acquired), else the host.
    pub fn key(&self, host: &HostKey) -> HostKey {
        match &self.table.addresses {
            Some(book) if self.table.key_by == KeyBy::Ip => {
                book.0.cached(host).unwrap_or_else(|| host.clone())
            }
            _ => self.table.key_by.key(host),
        }
    }

    /// [`key`](Self::key), consuming `host`: no copy when it is its own key.
    pub(crate) fn key_of(&self, host: HostKey) -> HostKey {
        match self.table.key_by {
            KeyBy::Host => host,
            _ => self.key(&host),
        }
    }

    /// A lookup of `host`'s address to wait for before it is keyed:
    /// `None` unless keyed by [`KeyBy::Ip`] and its address is unknown or
    /// expired.
    pub(crate) fn resolving(&self, host: &HostKey) -> Option<BoxFuture<'static, ()>> {
        match &self.table.addresses {
            Some(book) if self.table.key_by == KeyBy::Ip => book.0.resolving(host),
            _ => None,
        }
    }

    /// The rule that decides `host`'s pacing, `None` for the default.
    pub fn rule_for(&self, host: &HostKey) -> Option<&Rule> {
        self.index(host)
            .checked_sub(1)
            .map(|i| &self.table.rules[i])
    }

    /// The pacing of `host`: its rule's, or the default.
    pub fn pacing_for(&self, host: &HostKey) -> &Pacing {
        self.at(self.index(host))
    }

    /// Which policy decides `host`: 0 for the default, `i + 1` for rule
    /// `i`. Rules match the host's name (a `host:port` key's host part).
    pub(crate) fn index(&self, host: &HostKey) -> usize {
        let t = &*self.table;
        if t.rules.is_empty() {
            return 0;
        }
        let name = host_part(host.as_str());
        if let Some(&i) = t.exact.get(name) {
            return i + 1;
        }
        if t.suffix_labels == 0 {
            return 0;
        }
        let mut rest = name;
        let mut left = labels(name);
        while let Some(dot) = rest.find('.') {
            rest = &rest[dot + 1..];
            left -= 1;
            if t.suffix_labels & label_bit(left) != 0
                && let Some(&i) = t.suffix.get(rest)
            {
                return i + 1;
            }
        }
        0
    }

    /// The pacing of policy `index` (see [`index`](Self::index)).
    pub(crate) fn at(&self, index: usize) -> &Pacing {
        match index.checked_sub(1) {
            Some(i) => &self.table.rules[i].pacing,
            None => &self.table.default,
        }
    }

    /// Of policies `a` and `b`, the one whose state lasts longer once idle
    /// (the longer quota window, then the longer gap).
    pub(crate) fn longer_lived(&self, a: usize, b: usize) -> usize {
        if a == b {
            return a;
        }
        let lasts = |i: usize| {
            let p = self.at(i);
            (p.window(), p.min_delay())
        };
        if lasts(b) > lasts(a) { b } else { a }
    }

    /// The cross-replica cap of policy `index`, `default` when it sets none.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn cluster_concurrency_at(&self, index: usize, default: u32) -> u32 {
        index
            .checked_sub(1)
            .and_then(|i| self.table.rules[i].cluster_concurrency)
            .unwrap_or(default)
    }

    /// How many policies there are (the default and the rules).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn len(&self) -> usize {
        self.table.rules.len() + 1
    }

    /// The same rules and keying with each policy's pacing replaced by
    /// `f(index, pacing)`.
    pub(crate) fn map(&self, f: impl Fn(usize, &Pacing) -> Pacing) -> Self {
        let mut table = (*self.table).clone();
        table.default = f(0, &self.table.default);
        for (i, rule) in table.rules.iter_mut().enumerate() {
            rule.pacing = f(i + 1, &rule.pacing);
        }
        Self {
            table: Arc::new(table),
        }
    }

    /// The rules in a canonical text, one per line, in the order added:
    /// what the configuration record digests.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn canonical_rules(&self, describe: impl Fn(usize) -> String) -> String {
        let mut text = String::new();
        for (i, rule) in self.table.rules.iter().enumerate() {
            text.push_str(&rule.pattern);
            text.push(' ');
            text.push_str(&describe(i + 1));
            text.push('\n');
        }
        text
    }
}

impl From<Pacing> for Policies {
    fn from(default: Pacing) -> Self {
        Self::new(default)
    }
}

impl Default for Policies {
    /// [`Pacing::default`] for every host.
    fn default() -> Self {
        Self::new(Pacing::default())
    }
}

impl fmt::Debug for Policies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policies")
            .field("default", &self.table.default)
            .field("rules", &self.table.rules)
            .field("key_by", &self.table.key_by)
            .finish()
    }
}

/// How many dot-separated labels `name` has.
fn labels(name: &str) -> usize {
    name.bytes().filter(|&b| b == b'.').count() + 1
}

/// The bit of [`Table::suffix_labels`] for `labels` labels.
fn label_bit(labels: usize) -> u64 {
    1 << labels.min(63)
}

/// The host part of a key: without a `:port`.
fn host_part(key: &str) -> &str {
    if let Some(v6) = key.strip_prefix('[') {
        return match v6.find(']') {
            Some(end) => &key[..end + 2],
            None => key,
        };
    }
    key.rsplit_once(':').map_or(key, |(host, _)| host)
}

/// A rule's pattern in the form host keys take, or why it is refused.
fn normalize(pattern: &str) -> Result<String, ConfigError> {
    let refuse = |reason| ConfigError::InvalidRule {
        rule: pattern.to_owned(),
        reason,
    };
    let (wild, name) = match pattern.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, pattern),
    };
    if name.is_empty() {
        return Err(refuse("the pattern names no host"));
    }
    if name.contains('*') {
        return Err(refuse(
            "a wildcard may only open the pattern, as *.example.com",
        ));
    }
    if name
        .bytes()
        .any(|b| matches!(b, b':' | b'/' | b'@' | b'?' | b'#') || b.is_ascii_whitespace())
        && !name.starts_with('[')
    {
        return Err(refuse(
            "a pattern is a host name, without scheme, port or path",
        ));
    }
    let key = HostKey::parse(&format!("http://{name}/"))
        .map_err(|_| refuse("the pattern is not a valid host name"))?;
    if wild && (key.as_str().starts_with('[') || key.as_str().parse::<Ipv4Addr>().is_ok()) {
        return Err(refuse("an IP address has no subdomains to match"));
    }
    Ok(if wild {
        format!("*.{key}")
    } else {
        key.to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pacing(ms: u64) -> Pacing {
        Pacing::builder()
            .min_delay(Duration::from_millis(ms))
            .build()
            .unwrap()
    }

    fn host(name: &str) -> HostKey {
        HostKey::parse(&format!("http://{name}/")).unwrap()
    }

    #[test]
    fn the_most_specific_rule_wins() {
        let p = Policies::new(pacing(1))
            .with_rule(Rule::new("*.example.com", pacing(2)))
            .unwrap()
            .with_rule(Rule::new("*.a.example.com", pacing(3)))
            .unwrap()
            .with_rule(Rule::new("b.a.example.com", pacing(4)))
            .unwrap()
            .with_rule(Rule::new("Example.COM.", pacing(5)))
            .unwrap();
        let ms = |name: &str| p.pacing_for(&host(name)).min_delay().as_millis();
        assert_eq!(ms("other.test"), 1);
        assert_eq!(ms("x.example.com"), 2);
        assert_eq!(ms("c.a.example.com"), 3);
        assert_eq!(ms("a.example.com"), 2, "the apex of *.a is not below it");
        assert_eq!(ms("b.a.example.com"), 4, "exact beats any suffix");
        assert_eq!(ms("x.b.a.example.com"), 3);
        assert_eq!(ms("example.com"), 5, "normalized: lower case, no dot");
        assert_eq!(ms("notexample.com"), 1, "labels, not characters");
        assert_eq!(p.rules()[3].pattern(), "example.com");
        // A host:port key matches as its host.
        assert_eq!(p.index(&HostKey::named("x.example.com:8080")), 1);
        assert_eq!(p.index(&HostKey::named("[::1]:80")), 0);
    }

    #[test]
    fn suffixes_of_any_number_of_labels_match() {
        // One rule at a time, so that only its number of labels is known
        // (a walk that miscounted would skip the lookup that finds it), and
        // all together.
        let long: String = (0..70).map(|i| format!("l{i}.")).collect();
        let long = long.trim_end_matches('.');
        let (long_rule, below_long) = (format!("*.{long}"), format!("x.{long}"));
        let further_below_long = format!("x.y.{long}");
        let cases = [
            ("*.com", vec!["x.com", "x.y.z.com"], vec!["com", "x.org"]),
            ("*.example.org", vec!["x.example.org"], vec!["example.org"]),
            (
                "*.a.b.c.example.net",
                vec!["x.y.a.b.c.example.net"],
                vec!["b.c.example.net", "x.example.net"],
            ),
            (
                long_rule.as_str(),
                vec![below_long.as_str(), further_below_long.as_str()],
                vec![long],
            ),
        ];
        let mut all = Policies::new(pacing(1));
        for (pattern, below, not) in &cases {
            let one = Policies::new(pacing(1))
                .with_rule(Rule::new(*pattern, pacing(2)))
                .unwrap();
            all = all.with_rule(Rule::new(*pattern, pacing(2))).unwrap();
            for p in [&one, &all] {
                let ms = |name: &str| p.pacing_for(&host(name)).min_delay().as_millis();
                for name in below {
                    assert_eq!(ms(name), 2, "{name} is below {pattern}");
                }
                for name in not {
                    assert_eq!(ms(name), 1, "{name} is not below {pattern}");
                }
            }
        }
    }

    #[test]
    fn bad_patterns_are_refused_by_name() {
        let base = || Policies::new(pacing(1));
        for bad in [
            "",
            "*.",
            "*",
            "a.*.com",
            "*.*.com",
            "http://a.test",
            "a.test:80",
            "a.test/x",
            "a b",
            "*.1.2.3.4",
            "*.[::1]",
            // No host name once its trailing dots are dropped.
            "a.1..",
            "*.a.0x..",
        ] {
            match base().with_rule(Rule::new(bad, pacing(2))) {
                Err(ConfigError::InvalidRule { rule, .. }) => assert_eq!(rule, bad),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        let twice = base()
            .with_rule(Rule::new("a.test", pacing(2)))
            .unwrap()
            .with_rule(Rule::new("A.test", pacing(3)));
        assert!(
            matches!(twice, Err(ConfigError::InvalidRule { reason, .. }) if reason.contains("same pattern"))
        );
        // IDNA becomes punycode, IP addresses are exact hosts.
        let p = base()
            .with_rule(Rule::new("*.bücher.example", pacing(2)))
            .unwrap()
            .with_rule(Rule::new("127.0.0.1", pacing(3)))
            .unwrap();
        assert_eq!(p.rules()[0].pattern(), "*.xn--bcher-kva.example");
        assert_eq!(p.pacing_for(&host("127.0.0.1")), &pacing(3));
        // A normalized pattern is accepted as it is.
        for rule in p.rules() {
            let again = base().with_rule(rule.clone()).unwrap();
            assert_eq!(again.rules()[0].pattern(), rule.pattern());
        }
        let dots = base().with_rule(Rule::new("A.test..", pacing(2))).unwrap();
        assert_eq!(dots.rules()[0].pattern(), "a.test");
    }

    #[test]
    fn keys_by_host_domain_or_port() {
        let k = |by: KeyBy, url: &str| by.key(&HostKey::parse(url).unwrap()).to_string();
        let d = KeyBy::RegistrableDomain;
        assert_eq!(k(d, "http://a.example.co.uk/"), "example.co.uk");
        assert_eq!(k(d, "http://b.example.co.uk/"), "example.co.uk");
        assert_eq!(k(d, "http://example.co.uk/"), "example.co.uk");
        assert_eq!(
            k(d, "http://x.github.io/"),
            "x.github.io",
            "a private suffix"
        );
        for own in [
            "http://localhost/",
            "http://127.0.0.1/",
            "http://[::1]/",
            "http://a.b.unknown-tld/",
            "http://co.uk/",
            "http://a.test/",
        ] {
            let key = k(d, own);
            assert_eq!(key, HostKey::parse(own).unwrap().as_str(), "{own}");
        }
        let p = KeyBy::HostPort;
        assert_eq!(k(p, "http://a.test/"), "a.test:80");
        assert_eq!(k(p, "https://a.test:8443/"), "a.test:8443");
        assert_eq!(k(p, "http://[::1]:81/"), "[::1]:81");
        assert_eq!(k(KeyBy::Host, "http://a.test:9/"), "a.test");
        assert_eq!("domain".parse::<KeyBy>().unwrap(), d);
        assert_eq!("ip".parse::<KeyBy>().unwrap(), KeyBy::Ip);
        assert!("address".parse::<KeyBy>().is_err());
        // Without its policies' lookups a name is its own key.
        assert_eq!(k(KeyBy::Ip, "http://a.test:9/"), "a.test");
    }
}

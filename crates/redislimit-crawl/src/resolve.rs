//! `--resolve` patterns: `*.SUFFIX:ADDR` sends every name under `SUFFIX`
//! (at any depth) to `ADDR`, and `*:ADDR` every name; other names go to
//! the system's resolver. Exact names are reqwest's own overrides, which
//! are looked up first. [`Addresses`] resolves the same way for
//! `--key-by ip`.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use redislimit::{AddressResolver, BoxFuture, Resolved, SystemResolver};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// How long an address `--resolve` gives is kept: it never changes.
const OVERRIDE_TTL: Duration = Duration::from_secs(24 * 3600);

/// The patterns of `--resolve`, the first that matches a name deciding.
#[derive(Debug)]
pub(crate) struct Patterns {
    /// Each pattern's suffix (`.mem.test` for `*.mem.test`; empty for
    /// `*`), as URLs' hosts are keyed, and its address.
    patterns: Vec<(String, IpAddr)>,
}

impl Patterns {
    /// The patterns among `resolve` (as `Args::resolve` holds them: names
    /// keyed, patterns starting with `*`); `None` when there are none.
    pub(crate) fn new(resolve: &[(String, IpAddr)]) -> Option<Self> {
        let patterns: Vec<_> = resolve
            .iter()
            .filter_map(|(host, ip)| Some((host.strip_prefix('*')?.to_owned(), *ip)))
            .collect();
        (!patterns.is_empty()).then_some(Self { patterns })
    }

    /// The address a pattern gives `name`, if one matches.
    fn lookup(&self, name: &str) -> Option<IpAddr> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.patterns
            .iter()
            .find(|(suffix, _)| name.ends_with(suffix.as_str()) && name.len() > suffix.len())
            .map(|(_, ip)| *ip)
    }

    /// `pattern` (`*` or `*.SUFFIX`) checked and keyed, or why not;
    /// `None` when it is not a pattern.
    pub(crate) fn parse(pattern: &str) -> Option<Result<String, String>> {
        let suffix = pattern.strip_prefix('*')?;
        if suffix.is_empty() {
            return Some(Ok("*".to_owned()));
        }
        let Some(name) = suffix.strip_prefix('.') else {
            return Some(Err(format!(
                "{pattern:?} is not a pattern: `*` or `*.SUFFIX`"
            )));
        };
        Some(
            redislimit::HostKey::parse(&format!("http://{name}/"))
                .map(|key| format!("*.{}", key.as_str()))
                .map_err(|e| format!("{name:?} is not a host name: {e}")),
        )
    }
}

impl Resolve for Patterns {
    fn resolve(&self, name: Name) -> Resolving {
        let found = self.lookup(name.as_str());
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Addrs = match found {
                Some(ip) => Box::new(std::iter::once(SocketAddr::new(ip, 0))),
                None => Box::new(
                    tokio::net::lookup_host((name.as_str(), 0))
                        .await?
                        .collect::<Vec<_>>()
                        .into_iter(),
                ),
            };
            Ok(addrs)
        })
    }
}

/// Names to addresses as the crawl's client resolves them (`--resolve`
/// names, then patterns, then the system's resolver): the keys of
/// `--key-by ip`.
#[derive(Debug)]
pub(crate) struct Addresses {
    exact: HashMap<String, IpAddr>,
    patterns: Option<Patterns>,
}

impl Addresses {
    /// The overrides of `resolve` (as `Args::resolve` holds them).
    pub(crate) fn new(resolve: &[(String, IpAddr)]) -> Self {
        Self {
            exact: resolve
                .iter()
                .filter(|(host, _)| !host.starts_with('*'))
                .cloned()
                .collect(),
            patterns: Patterns::new(resolve),
        }
    }
}

impl AddressResolver for Addresses {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Resolved>> {
        let given = self.exact.get(name).copied().or_else(|| {
            self.patterns
                .as_ref()
                .and_then(|patterns| patterns.lookup(name))
        });
        match given {
            Some(ip) => Box::pin(std::future::ready(Ok(
                Resolved::new([ip]).with_ttl(OVERRIDE_TTL)
            ))),
            None => SystemResolver.resolve(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_the_names_under_its_suffix() {
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        let any: IpAddr = "127.0.0.3".parse().unwrap();
        let patterns = Patterns::new(&[
            ("exact.test".to_owned(), any),
            ("*.mem.test".to_owned(), ip),
        ])
        .unwrap();
        assert_eq!(patterns.lookup("h1.mem.test"), Some(ip));
        assert_eq!(patterns.lookup("A.B.Mem.Test."), Some(ip));
        assert_eq!(patterns.lookup("mem.test"), None, "the suffix alone");
        assert_eq!(patterns.lookup("xmem.test"), None);
        assert_eq!(
            patterns.lookup("exact.test"),
            None,
            "exact names are reqwest's"
        );
        let every = Patterns::new(&[("*".to_owned(), any)]).unwrap();
        assert_eq!(every.lookup("anything.example"), Some(any));
        assert!(Patterns::new(&[("exact.test".to_owned(), any)]).is_none());
    }

    #[test]
    fn patterns_are_checked_and_keyed() {
        assert_eq!(Patterns::parse("a.test"), None);
        assert_eq!(Patterns::parse("*"), Some(Ok("*".to_owned())));
        assert_eq!(
            Patterns::parse("*.Mem.Test"),
            Some(Ok("*.mem.test".to_owned()))
        );
        assert!(matches!(Patterns::parse("*mem.test"), Some(Err(_))));
        assert!(matches!(Patterns::parse("*.a b"), Some(Err(_))));
    }

    #[tokio::test]
    async fn addresses_follow_the_overrides_then_the_system() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let addresses = Addresses::new(&[
            ("a.mem.test".to_owned(), ip("127.0.0.5")),
            ("*.mem.test".to_owned(), ip("127.0.0.2")),
        ]);
        let first = |name: &'static str| {
            let addresses = &addresses;
            async move { addresses.resolve(name).await.map(|r| r.addrs()[0]) }
        };
        assert_eq!(first("a.mem.test").await.unwrap(), ip("127.0.0.5"));
        assert_eq!(first("b.mem.test").await.unwrap(), ip("127.0.0.2"));
        assert!(first("localhost").await.unwrap().is_loopback());
    }
}

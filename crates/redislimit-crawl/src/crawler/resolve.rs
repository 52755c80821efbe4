//! `--resolve` patterns: `*.SUFFIX:ADDR` sends every name under `SUFFIX`
//! (at any depth) to `ADDR`, and `*:ADDR` every name; other names go to
//! the system's resolver. Exact names are reqwest's own overrides, which
//! are looked up first.

use std::net::{IpAddr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

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
    pub(super) fn new(resolve: &[(String, IpAddr)]) -> Option<Self> {
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
}

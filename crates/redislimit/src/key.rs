//! Host keys: the name a URL is paced under.

use std::fmt;
use std::sync::Arc;

use url::{Host, Url};

use crate::Error;

/// The host a request is paced under.
///
/// It is the host of the URL as the [`url`] crate normalises it (IDNA to
/// punycode, percent-decoding), lower-cased, with trailing dots removed.
/// A name that is no host name without its trailing dots (`0x22..` would
/// be the address 0.0.0.34, `a.1..` nothing) is refused, so the key of an
/// `http`, `https`, `ws`, `wss` or `ftp` URL is always the host of the URL
/// `http://KEY/` (other schemes' hosts are opaque and kept as they are).
/// The port and the scheme are not part of it: `https://example.com:8443/`
/// and `http://EXAMPLE.com./` are the same host. IPv4 addresses appear in
/// dotted form, IPv6 addresses in brackets (`[::1]`).
///
/// Cloning is cheap (a reference count).
///
/// A key made from a URL also carries the URL's port (explicit, or the
/// scheme's default), which is not part of its identity: two keys of one
/// host on different ports are equal. [`KeyBy::HostPort`](crate::KeyBy)
/// uses it to key each port apart.
///
/// ```
/// use redislimit::HostKey;
///
/// let key = HostKey::parse("https://Bücher.Example.:8443/path").unwrap();
/// assert_eq!(key.as_str(), "xn--bcher-kva.example");
/// assert!(HostKey::parse("mailto:someone@example.com").is_err());
/// ```
#[derive(Clone)]
pub struct HostKey {
    name: Arc<str>,
    port: Option<u16>,
    /// The name's hash, computed once: a limiter hashes a key several
    /// times per request (its shard, its map, on acquire and release).
    hash: u64,
}

/// The seed of every key's hash: random, once per process, so that hosts
/// chosen to collide cannot be found in advance (maps keyed by hosts then
/// mix it again with their own seeds).
fn name_hash(name: &str) -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    SEED.get_or_init(foldhash::fast::RandomState::default)
        .hash_one(name)
}

/// A clone (one reference count): for maps that insert a key given by
/// reference.
impl From<&HostKey> for HostKey {
    fn from(key: &HostKey) -> Self {
        key.clone()
    }
}

impl PartialEq for HostKey {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for HostKey {}

/// Consistent with equality (equal names hash alike), through a hash of
/// the name computed when the key was made. It is not the hash of the
/// name's `str`, so `HostKey` must never implement `Borrow<str>`.
impl std::hash::Hash for HostKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialOrd for HostKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for HostKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.name.cmp(&other.name)
    }
}

impl HostKey {
    /// The host key of a parsed URL, or [`Error::InvalidUrl`] when it has
    /// no host (or one that is no host name without its trailing dots).
    pub fn from_url(url: &Url) -> Result<Self, Error> {
        let host = url.host().ok_or("the URL has no host");
        let key = Self::from_host(host).map_err(|reason| Error::InvalidUrl {
            url: url.as_str().to_owned(),
            reason,
        })?;
        Ok(key.on_port(url.port_or_known_default()))
    }

    /// A key made of `name` as it is (already a key's text, such as a
    /// registrable domain or `host:port`), carrying no port.
    pub(crate) fn named(name: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        Self {
            hash: name_hash(&name),
            name,
            port: None,
        }
    }

    fn on_port(mut self, port: Option<u16>) -> Self {
        self.port = port;
        self
    }

    /// The port of the URL the key was made from (explicit, or the
    /// scheme's default), when it had one; not part of the key.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The host key of an `http::Uri`, or [`Error::InvalidUrl`] when it has
    /// no host (a path-only request target such as `/index.html`).
    #[cfg(feature = "http")]
    pub fn from_uri(uri: &http::Uri) -> Result<Self, Error> {
        let invalid = |reason| Error::InvalidUrl {
            url: uri.to_string(),
            reason,
        };
        let host = uri.host().ok_or_else(|| invalid("the URI has no host"))?;
        let parsed: Host<String> = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) => v6
                .parse()
                .map(Host::Ipv6)
                .map_err(|_| invalid("the URI's IPv6 host does not parse"))?,
            None => Host::parse(host).map_err(|_| invalid("the URI's host does not parse"))?,
        };
        let borrowed = match &parsed {
            Host::Domain(name) => Host::Domain(name.as_str()),
            Host::Ipv4(addr) => Host::Ipv4(*addr),
            Host::Ipv6(addr) => Host::Ipv6(*addr),
        };
        let port = uri.port_u16().or(match uri.scheme_str() {
            Some("http") => Some(80),
            Some("https") => Some(443),
            _ => None,
        });
        Self::from_host(Ok(borrowed))
            .map_err(invalid)
            .map(|key| key.on_port(port))
    }

    fn from_host(host: Result<Host<&str>, &'static str>) -> Result<Self, &'static str> {
        match host? {
            Host::Ipv4(addr) => Ok(Self::named(addr.to_string())),
            Host::Ipv6(addr) => Ok(Self::named(format!("[{addr}]"))),
            Host::Domain(given) => {
                let name = given.trim_end_matches('.');
                if name.is_empty() {
                    return Err("the URL's host is empty");
                }
                // Without its trailing dots a name can read as another host
                // (`0x22..` as the address 0.0.0.34) or as none (`a.1..`):
                // refused, so that a key is always the host of `http://KEY/`.
                if name.len() != given.len()
                    && !matches!(Host::parse(name), Ok(Host::Domain(d)) if d.eq_ignore_ascii_case(name))
                {
                    return Err("the URL's host is no host name without its trailing dots");
                }
                Ok(Self::named(name.to_ascii_lowercase()))
            }
        }
    }

    /// Parses `url` and takes its host key. A refusal
    /// ([`Error::InvalidUrl`]) names `url` as given, not as parsed.
    pub fn parse(url: &str) -> Result<Self, Error> {
        let invalid = |reason| Error::InvalidUrl {
            url: url.to_owned(),
            reason,
        };
        let parsed = Url::parse(url).map_err(|_| invalid("the URL does not parse"))?;
        let host = parsed.host().ok_or("the URL has no host");
        Self::from_host(host)
            .map_err(invalid)
            .map(|key| key.on_port(parsed.port_or_known_default()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for HostKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.name, f)
    }
}

impl fmt::Display for HostKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl AsRef<str> for HostKey {
    fn as_ref(&self) -> &str {
        &self.name
    }
}

impl TryFrom<&Url> for HostKey {
    type Error = Error;

    fn try_from(url: &Url) -> Result<Self, Error> {
        Self::from_url(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(url: &str) -> String {
        HostKey::parse(url).unwrap().as_str().to_owned()
    }

    #[test]
    fn upper_case_is_folded() {
        assert_eq!(key("https://WWW.Example.COM/A/B"), "www.example.com");
        // Non-special schemes keep the host's case in `url`; the key does not.
        assert_eq!(key("foo://ExAmPle.org/x"), "example.org");
    }

    #[test]
    fn idna_becomes_punycode() {
        assert_eq!(key("http://bücher.example/"), "xn--bcher-kva.example");
        assert_eq!(key("http://BÜCHER.example/"), "xn--bcher-kva.example");
        assert_eq!(
            key("http://xn--bcher-kva.example/"),
            "xn--bcher-kva.example"
        );
    }

    #[test]
    fn trailing_dots_are_removed() {
        assert_eq!(key("http://example.com./"), "example.com");
        assert_eq!(key("http://example.com../"), "example.com");
        assert_eq!(
            HostKey::parse("http://example.com./").unwrap(),
            HostKey::parse("http://example.com/").unwrap()
        );
    }

    #[test]
    fn a_name_that_is_no_host_name_without_its_trailing_dots_is_refused() {
        // `url` reads these as domains (an empty last label ends in no
        // number); without the dots they would be an IPv4 address (another
        // host) or nothing `url` accepts.
        for url in [
            "http://0x22../",
            "http:/0X22.../",
            "http://1.2.3.4../",
            "http://a.1../",
            "http://a.0x../",
        ] {
            assert!(Url::parse(url).unwrap().domain().is_some(), "{url}");
            match HostKey::parse(url) {
                Err(Error::InvalidUrl { url: given, reason }) => {
                    assert_eq!(given, url);
                    assert!(reason.contains("trailing dots"), "{url}: {reason}");
                }
                other => panic!("{url:?} gave {other:?}"),
            }
        }
        assert_eq!(key("http://Bücher.example../"), "xn--bcher-kva.example");
        assert_eq!(key("foo://ExAmPle.org../"), "example.org");
    }

    #[test]
    fn port_and_scheme_are_not_part_of_the_key() {
        let plain = HostKey::parse("http://example.com/").unwrap();
        assert_eq!(HostKey::parse("https://example.com:8443/").unwrap(), plain);
        assert_eq!(
            HostKey::parse("http://example.com:80/x?y#z").unwrap(),
            plain
        );
        assert_eq!(
            HostKey::parse("ws://user:pw@example.com:1/").unwrap(),
            plain
        );
    }

    #[test]
    fn the_port_travels_with_the_key() {
        let port = |url: &str| HostKey::parse(url).unwrap().port();
        assert_eq!(port("http://a.test/"), Some(80));
        assert_eq!(port("https://a.test/"), Some(443));
        assert_eq!(port("http://a.test:8080/"), Some(8080));
        assert_eq!(port("foo://a.test/"), None);
    }

    #[test]
    fn ip_literals() {
        assert_eq!(key("http://127.0.0.1:8080/"), "127.0.0.1");
        assert_eq!(key("http://[::1]:8080/"), "[::1]");
        assert_eq!(key("http://[0:0:0:0:0:0:0:1]/"), "[::1]");
        assert_eq!(key("http://[2001:DB8::A]/"), "[2001:db8::a]");
        // A decimal IPv4 form is normalised by `url` before it reaches us.
        assert_eq!(key("http://2130706433/"), "127.0.0.1");
    }

    #[test]
    fn urls_without_a_host_are_refused() {
        for url in [
            "mailto:someone@example.com",
            "file:///etc/hosts",
            "data:text/plain,hello",
            "unix:/run/socket",
            "http://./",
            // Refused as given, not as the URL parser rewrites them.
            "http://\u{3002}/",
            "file://localhost/x",
            "not a url",
            "",
        ] {
            match HostKey::parse(url) {
                Err(Error::InvalidUrl { url: given, .. }) => assert_eq!(given, url),
                other => panic!("{url:?} gave {other:?}"),
            }
        }
    }

    #[cfg(feature = "http")]
    #[test]
    fn uris_get_the_same_keys_as_urls() {
        for (uri, expected) in [
            ("http://WWW.Example.com:8080/x", "www.example.com"),
            ("https://example.com./", "example.com"),
            ("http://[::1]:3000/", "[::1]"),
            ("http://[0:0::1]/", "[::1]"),
            ("http://127.0.0.1/", "127.0.0.1"),
            ("http://xn--bcher-kva.example/", "xn--bcher-kva.example"),
        ] {
            let uri: http::Uri = uri.parse().unwrap();
            assert_eq!(HostKey::from_uri(&uri).unwrap().as_str(), expected, "{uri}");
            assert_eq!(HostKey::parse(&uri.to_string()).unwrap().as_str(), expected);
        }
        let path_only: http::Uri = "/index.html".parse().unwrap();
        assert!(matches!(
            HostKey::from_uri(&path_only),
            Err(Error::InvalidUrl { .. })
        ));
    }

    #[test]
    fn display_and_debug() {
        let k = HostKey::parse("http://Example.com/").unwrap();
        assert_eq!(k.to_string(), "example.com");
        assert_eq!(format!("{k:?}"), "\"example.com\"");
    }
}

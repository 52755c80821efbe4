//! Host names to addresses, for [`KeyBy::Ip`](crate::KeyBy::Ip): the
//! resolver a limiter asks, and the cache of what it said.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::{BoxFuture, HostKey};

/// How long an address is kept when its resolver tells no TTL (the
/// system's resolver never does).
pub const DEFAULT_ADDRESS_TTL: Duration = Duration::from_secs(60);
/// The shortest an address is kept, whatever its TTL: a record with a
/// TTL of 0 is not looked up again for every request.
const MIN_TTL: Duration = Duration::from_secs(1);
/// The longest an address is kept, whatever its TTL.
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a failed lookup stands before the next request tries again.
const FAILED_TTL: Duration = Duration::from_secs(5);
/// How long a lookup may take before it counts as failed: a resolver that
/// never answers holds no request.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Names kept before the first sweep of expired ones.
const SWEEP_AT: usize = 1024;

/// Resolves host names to addresses for [`KeyBy::Ip`](crate::KeyBy::Ip).
///
/// Give the limiter the resolution its HTTP client uses (overrides
/// included), so that a request is keyed by the address it goes to.
/// [`SystemResolver`] is used when none is given.
///
/// ```
/// use std::net::IpAddr;
/// use redislimit::{AddressResolver, BoxFuture, Resolved};
///
/// /// Every name under `.internal` is one machine; the rest, another.
/// #[derive(Debug)]
/// struct TwoMachines;
///
/// impl AddressResolver for TwoMachines {
///     fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, std::io::Result<Resolved>> {
///         let ip: IpAddr = if name.ends_with(".internal") { [10, 0, 0, 1] } else { [10, 0, 0, 2] }.into();
///         Box::pin(async move { Ok(Resolved::new([ip])) })
///     }
/// }
/// ```
pub trait AddressResolver: Send + Sync + fmt::Debug {
    /// The addresses of `name` (a [`HostKey`]'s text: lower case, IDNA as
    /// punycode, no trailing dot, no port), and how long they hold.
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Resolved>>;
}

/// What an [`AddressResolver`] found for a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    addrs: Vec<IpAddr>,
    ttl: Option<Duration>,
}

impl Resolved {
    /// `addrs`, kept [`DEFAULT_ADDRESS_TTL`].
    pub fn new(addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        Self {
            addrs: addrs.into_iter().collect(),
            ttl: None,
        }
    }

    /// Kept `ttl` (the record's TTL), within 1 s and 24 h.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The addresses, in the resolver's order.
    pub fn addrs(&self) -> &[IpAddr] {
        &self.addrs
    }

    /// How long they hold, if the resolver said.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The address a name is keyed by: the lowest (IPv4 before IPv6),
    /// whatever order the resolver gave, so that replicas agree.
    fn key(&self) -> Option<HostKey> {
        self.addrs.iter().min().map(|ip| address_key(*ip))
    }
}

/// The system's resolver (`getaddrinfo`, through
/// [`tokio::net::lookup_host`]): `/etc/hosts`, DNS, as other programs on
/// the machine resolve. It tells no TTL, so its answers are kept
/// [`DEFAULT_ADDRESS_TTL`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl AddressResolver for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Resolved>> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((name, 0)).await?;
            Ok(Resolved::new(addrs.map(|a| a.ip())))
        })
    }
}

/// The key of address `ip`: as a URL's host would be keyed.
fn address_key(ip: IpAddr) -> HostKey {
    match ip {
        IpAddr::V4(v4) => HostKey::named(v4.to_string()),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => HostKey::named(v4.to_string()),
            None => HostKey::named(format!("[{v6}]")),
        },
    }
}

/// Whether `name` (a key's text) is an address already.
fn is_address(name: &str) -> bool {
    name.starts_with('[') || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// Each name's address, looked up once per TTL however many requests ask
/// at once, and kept (stale) while it is looked up again.
pub(crate) struct AddressBook {
    resolver: Arc<dyn AddressResolver>,
    names: Mutex<Names>,
}

struct Names {
    map: HashMap<Box<str>, Arc<Slot>>,
    /// Sweep expired names when the map reaches this size.
    sweep_at: usize,
}

/// One name: its lookup (done once) and the key it had before.
#[derive(Default)]
struct Slot {
    lookup: OnceCell<Entry>,
    stale: Option<HostKey>,
}

struct Entry {
    /// `None`: the name never resolved; it is keyed by itself.
    key: Option<HostKey>,
    expires: Instant,
}

impl Slot {
    fn key(&self) -> Option<&HostKey> {
        match self.lookup.get() {
            Some(entry) => entry.key.as_ref(),
            None => self.stale.as_ref(),
        }
    }

    fn fresh(&self, now: Instant) -> bool {
        self.lookup.get().is_some_and(|e| e.expires > now)
    }
}

impl AddressBook {
    pub(crate) fn new(resolver: Arc<dyn AddressResolver>) -> Self {
        Self {
            resolver,
            names: Mutex::new(Names {
                map: HashMap::new(),
                sweep_at: SWEEP_AT,
            }),
        }
    }

    fn names(&self) -> MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The address key `host` last resolved to (stale or not), if any.
    pub(crate) fn cached(&self, host: &HostKey) -> Option<HostKey> {
        self.names().map.get(host.as_str())?.key().cloned()
    }

    /// A lookup of `host` to wait for: `None` when its address is known
    /// and fresh, or it is an address itself.
    pub(crate) fn resolving(self: &Arc<Self>, host: &HostKey) -> Option<BoxFuture<'static, ()>> {
        let name = host.as_str();
        if is_address(name) {
            return None;
        }
        let now = Instant::now();
        let slot = {
            let mut names = self.names();
            match names.map.get(name) {
                Some(slot) if slot.fresh(now) => return None,
                // Being looked up: wait for that lookup.
                Some(slot) if slot.lookup.get().is_none() => Arc::clone(slot),
                found => {
                    let slot = Arc::new(Slot {
                        lookup: OnceCell::new(),
                        stale: found.and_then(|s| s.key().cloned()),
                    });
                    names.insert(name, Arc::clone(&slot), now);
                    slot
                }
            }
        };
        let book = Arc::clone(self);
        let name: Box<str> = name.into();
        Some(Box::pin(async move {
            slot.lookup
                .get_or_init(|| book.look_up(&name, slot.stale.as_ref()))
                .await;
        }))
    }

    /// Asks the resolver about `name`; on failure keeps `stale` a while.
    async fn look_up(&self, name: &str, stale: Option<&HostKey>) -> Entry {
        let asked = tokio::time::timeout(LOOKUP_TIMEOUT, self.resolver.resolve(name)).await;
        let now = Instant::now();
        let found = match asked {
            Ok(Ok(resolved)) => match resolved.key() {
                Some(key) => {
                    let ttl = resolved.ttl.unwrap_or(DEFAULT_ADDRESS_TTL);
                    return Entry {
                        key: Some(key),
                        expires: now + ttl.clamp(MIN_TTL, MAX_TTL),
                    };
                }
                None => "no address".to_owned(),
            },
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer in {LOOKUP_TIMEOUT:?}"),
        };
        match stale {
            Some(key) => tracing::warn!(
                host = name,
                error = %found,
                "cannot resolve the host; keeping its last address {key} as its key"
            ),
            None => tracing::warn!(
                host = name,
                error = %found,
                "cannot resolve the host; paced under its name until it resolves"
            ),
        }
        Entry {
            key: stale.cloned(),
            expires: now + FAILED_TTL,
        }
    }
}

impl Names {
    fn insert(&mut self, name: &str, slot: Arc<Slot>, now: Instant) {
        self.map.insert(name.into(), slot);
        if self.map.len() >= self.sweep_at {
            // An expired name goes, and so does a lookup nobody waits for
            // any more (its callers were cancelled): one held only here.
            self.map.retain(|_, slot| {
                slot.lookup.get().is_some_and(|e| e.expires > now) || Arc::strong_count(slot) > 1
            });
            self.sweep_at = (self.map.len() * 2).max(SWEEP_AT);
        }
    }
}

/// A policy's [`AddressBook`], shared by its clones. Not part of the
/// policy's identity: policies that differ only in their resolver are
/// equal.
#[derive(Debug, Clone)]
pub(crate) struct SharedBook(pub(crate) Arc<AddressBook>);

impl PartialEq for SharedBook {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SharedBook {}

impl fmt::Debug for AddressBook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressBook")
            .field("resolver", &self.resolver)
            .field("names", &self.names().map.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers from a table, counting lookups; `slow.test` takes 20 s.
    #[derive(Debug, Default)]
    struct Table {
        asked: AtomicUsize,
    }

    impl AddressResolver for Table {
        fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Resolved>> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                let ip = |s: &str| s.parse::<IpAddr>().unwrap();
                match name {
                    "many.test" => Ok(Resolved::new([ip("10.0.0.9"), ip("::1"), ip("10.0.0.3")])
                        .with_ttl(Duration::from_secs(300))),
                    "zero.test" => Ok(Resolved::new([ip("10.0.0.4")]).with_ttl(Duration::ZERO)),
                    "v6.test" => Ok(Resolved::new([ip("2001:db8::1")])),
                    "mapped.test" => Ok(Resolved::new([ip("::ffff:10.0.0.5")])),
                    "slow.test" => {
                        tokio::time::sleep(Duration::from_secs(20)).await;
                        Ok(Resolved::new([ip("10.0.0.6")]))
                    }
                    "empty.test" => Ok(Resolved::new([])),
                    _ => Err(io::Error::new(io::ErrorKind::NotFound, "no such host")),
                }
            })
        }
    }

    fn book() -> (Arc<AddressBook>, Arc<Table>) {
        let table = Arc::new(Table::default());
        (Arc::new(AddressBook::new(table.clone())), table)
    }

    fn host(name: &str) -> HostKey {
        HostKey::parse(&format!("http://{name}/")).unwrap()
    }

    async fn key(book: &Arc<AddressBook>, name: &str) -> Option<String> {
        if let Some(lookup) = book.resolving(&host(name)) {
            lookup.await;
        }
        book.cached(&host(name)).map(|k| k.as_str().to_owned())
    }

    #[tokio::test(start_paused = true)]
    async fn the_lowest_address_is_the_key_and_kept_for_its_ttl() {
        let (book, table) = book();
        assert_eq!(key(&book, "many.test").await.as_deref(), Some("10.0.0.3"));
        assert_eq!(
            key(&book, "v6.test").await.as_deref(),
            Some("[2001:db8::1]")
        );
        assert_eq!(key(&book, "mapped.test").await.as_deref(), Some("10.0.0.5"));
        assert_eq!(table.asked.load(Ordering::SeqCst), 3);
        tokio::time::advance(Duration::from_secs(299)).await;
        assert!(book.resolving(&host("many.test")).is_none(), "fresh");
        tokio::time::advance(Duration::from_secs(2)).await;
        let again = book.resolving(&host("many.test")).expect("expired");
        // The stale key stands while the name is looked up again.
        assert_eq!(
            book.cached(&host("many.test")).unwrap().as_str(),
            "10.0.0.3"
        );
        again.await;
        assert_eq!(table.asked.load(Ordering::SeqCst), 4);
        // A TTL of 0 is held a second; addresses are never looked up.
        assert_eq!(key(&book, "zero.test").await.as_deref(), Some("10.0.0.4"));
        assert!(book.resolving(&host("zero.test")).is_none());
        tokio::time::advance(MIN_TTL).await;
        assert!(book.resolving(&host("zero.test")).is_some());
        assert!(book.resolving(&host("10.1.2.3")).is_none());
        assert!(book.resolving(&host("[::1]")).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_asking_at_once_share_one_lookup() {
        let (book, table) = book();
        let lookups: Vec<_> = (0..50)
            .filter_map(|_| book.resolving(&host("slow.test")))
            .collect();
        assert_eq!(lookups.len(), 50, "each waits");
        let started = Instant::now();
        for lookup in lookups {
            lookup.await;
        }
        assert_eq!(started.elapsed(), Duration::from_secs(10), "the timeout");
        assert_eq!(table.asked.load(Ordering::SeqCst), 1);
        // Timed out: keyed by its name, asked again after FAILED_TTL.
        assert_eq!(book.cached(&host("slow.test")), None);
        assert!(book.resolving(&host("slow.test")).is_none());
        tokio::time::advance(FAILED_TTL).await;
        assert!(book.resolving(&host("slow.test")).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_lookup_keeps_the_last_address_or_the_name() {
        let (book, _) = book();
        assert_eq!(key(&book, "unknown.test").await, None);
        assert_eq!(key(&book, "empty.test").await, None);
        // A name that resolved once keeps its address through a failure.
        let table = Arc::new(Table::default());
        let flaky = Arc::new(AddressBook::new(table));
        flaky.names().map.insert(
            "gone.test".into(),
            Arc::new(Slot {
                lookup: OnceCell::new_with(Some(Entry {
                    key: Some(HostKey::named("10.9.9.9")),
                    expires: Instant::now(),
                })),
                stale: None,
            }),
        );
        assert_eq!(key(&flaky, "gone.test").await.as_deref(), Some("10.9.9.9"));
    }

    #[tokio::test(start_paused = true)]
    async fn expired_names_are_swept() {
        let (book, _) = book();
        for i in 0..SWEEP_AT - 3 {
            key(&book, &format!("h{i}.zero.test")).await;
        }
        tokio::time::advance(FAILED_TTL).await;
        // A lookup whose caller gave up on it is swept; one still awaited
        // is kept.
        let cancelled = book.resolving(&host("slow.test")).unwrap();
        let waited = tokio::time::timeout(Duration::from_secs(1), cancelled).await;
        assert!(waited.is_err(), "still looking up");
        let awaited = book.resolving(&host("unknown.test")).unwrap();
        key(&book, "many.test").await;
        {
            let names = book.names();
            let mut left: Vec<&str> = names.map.keys().map(|k| &**k).collect();
            left.sort_unstable();
            assert_eq!(
                left,
                ["many.test", "unknown.test"],
                "the fresh one, the awaited one"
            );
            assert_eq!(names.sweep_at, SWEEP_AT);
        }
        awaited.await;
        assert!(book.resolving(&host("unknown.test")).is_none(), "looked up");
    }
}

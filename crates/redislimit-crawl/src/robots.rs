//! robots.txt (RFC 9309) for `--robots`: what a host allows this crawl's
//! user agent, and the `Crawl-delay` it asks for; and the outcome of each
//! origin's robots.txt, kept for the fleet in Redis (one replica fetches
//! it, the others wait for it) or for the process, 24 hours.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use texting_robots::Robot;
use url::Url;

/// How often a robots.txt that could not be had is asked for, in one fetch.
pub(crate) const ROBOTS_ATTEMPTS: u32 = 3;

/// The most of a robots.txt read (RFC 9309 asks for at least 500 KiB).
pub(crate) const ROBOTS_MAX_BYTES: usize = 512 * 1024;

/// How long a robots.txt's outcome is kept (RFC 9309: no more than 24 h).
const KEEP: Duration = Duration::from_secs(24 * 3600);

/// After a fetch found robots.txt unavailable, the next is no sooner than
/// this, doubled for each failure in a row since (at most [`KEEP`]).
const FIRST_BACKOFF: Duration = Duration::from_secs(60);

/// `--robots`: what the crawl asks robots.txt about, and where it keeps
/// what it found.
#[derive(Debug)]
pub(crate) struct RobotsOptions {
    pub(crate) agent: String,
    pub(crate) max_crawl_delay: Duration,
    /// Between two attempts of one fetch.
    pub(crate) retry: Duration,
    /// The longest a replica waits for another's fetch of a robots.txt.
    pub(crate) wait: Duration,
    pub(crate) cache: RobotsCache,
}

#[cfg(feature = "redis")]
impl RobotsOptions {
    /// `options` keeping each origin's outcome for the fleet in `cache`,
    /// whether or not another crawler shares `options` (that one keeps
    /// what it had).
    pub(crate) fn with_shared(
        options: std::sync::Arc<Self>,
        cache: redislimit::redis::SharedCache,
    ) -> std::sync::Arc<Self> {
        let mut options = std::sync::Arc::try_unwrap(options).unwrap_or_else(|shared| Self {
            agent: shared.agent.clone(),
            max_crawl_delay: shared.max_crawl_delay,
            retry: shared.retry,
            wait: shared.wait,
            cache: RobotsCache::default(),
        });
        options.cache.shared = Some(cache);
        std::sync::Arc::new(options)
    }
}

/// What an origin's robots.txt fetch found, as kept: `allow` (4xx),
/// `rules` and the body (2xx), or `unavailable` (5xx, no answer) with the
/// failures in a row, when it may be asked again (ms since the epoch) and
/// why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    Allow,
    Rules(Vec<u8>),
    Unavailable {
        failures: u32,
        retry_at_ms: u64,
        why: String,
    },
}

impl Record {
    /// The record of an answer (`status` and `body`), `None` when it
    /// is worth asking again (a 5xx, another status).
    pub(crate) fn from_status(status: u16, body: Vec<u8>) -> Option<Self> {
        match status {
            200..=299 => Some(Self::Rules(body)),
            400..=499 => Some(Self::Allow),
            _ => None,
        }
    }

    /// Unavailable for `why`, after the failures of `before` (if it was
    /// unavailable too) and this one.
    pub(crate) fn unavailable(before: Option<&Self>, why: String) -> Self {
        let failures = match before {
            Some(Self::Unavailable { failures, .. }) => failures.saturating_add(1),
            _ => 1,
        };
        let backoff = FIRST_BACKOFF
            .saturating_mul(1 << (failures - 1).min(16))
            .min(KEEP);
        Self::Unavailable {
            failures,
            retry_at_ms: epoch_ms().saturating_add(backoff.as_millis() as u64),
            why,
        }
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Self::Allow => b"allow\n".to_vec(),
            Self::Rules(body) => [&b"rules\n"[..], body].concat(),
            Self::Unavailable {
                failures,
                retry_at_ms,
                why,
            } => format!(
                "unavailable {failures} {retry_at_ms} {}\n",
                why.replace('\n', " ")
            )
            .into_bytes(),
        }
    }

    /// The record `bytes` hold, `None` for anything else (garbage is
    /// fetched again).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes == b"allow\n" {
            return Some(Self::Allow);
        }
        if let Some(body) = bytes.strip_prefix(b"rules\n") {
            return Some(Self::Rules(body.to_vec()));
        }
        let line = std::str::from_utf8(bytes.strip_prefix(b"unavailable ")?).ok()?;
        let mut parts = line.trim_end_matches('\n').splitn(3, ' ');
        Some(Self::Unavailable {
            failures: parts.next()?.parse().ok()?,
            retry_at_ms: parts.next()?.parse().ok()?,
            why: parts.next().unwrap_or_default().to_owned(),
        })
    }

    /// Whether it stands, or robots.txt is to be asked for again.
    pub(crate) fn fresh(&self) -> bool {
        match self {
            Self::Unavailable { retry_at_ms, .. } => *retry_at_ms > epoch_ms(),
            _ => true,
        }
    }

    /// What it decides for `agent`.
    pub(crate) fn rules(&self, agent: &str) -> Rules {
        match self {
            Self::Allow => Rules::AllowAll,
            Self::Rules(body) => match Robot::new(agent, body) {
                Ok(robot) => Rules::Robot(Box::new(robot)),
                Err(_) => Rules::AllowAll,
            },
            Self::Unavailable { why, .. } => Rules::Unavailable(why.clone()),
        }
    }

    /// How long it is kept (an unavailable one is asked again before:
    /// see [`fresh`](Self::fresh)).
    pub(crate) fn keep(&self) -> Duration {
        KEEP
    }
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Where robots.txt outcomes are kept, by origin (`scheme://host:port`):
/// in the process, and with Redis for the fleet.
#[derive(Default)]
pub(crate) struct RobotsCache {
    #[cfg(feature = "redis")]
    pub(crate) shared: Option<redislimit::redis::SharedCache>,
    local: Mutex<HashMap<String, (Record, std::time::Instant)>>,
}

impl std::fmt::Debug for RobotsCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RobotsCache").finish_non_exhaustive()
    }
}

impl RobotsCache {
    /// The record of `origin`: kept in the process, else (with Redis) kept
    /// for the fleet or fetched by one replica while the others wait at
    /// most `wait`, else fetched here by `fetch` (given the record that
    /// was not fresh, if any).
    pub(crate) async fn get_or_fetch<F>(
        &self,
        origin: &str,
        wait: Duration,
        fetch: impl FnOnce(Option<Record>) -> F,
    ) -> Record
    where
        F: Future<Output = Record>,
    {
        let stale = {
            let local = self.local.lock().unwrap_or_else(|e| e.into_inner());
            match local.get(origin) {
                Some((record, until)) if record.fresh() && *until > std::time::Instant::now() => {
                    return record.clone();
                }
                found => found.map(|(record, _)| record.clone()),
            }
        };
        #[cfg(feature = "redis")]
        let record = match &self.shared {
            Some(shared) => {
                let cached = shared
                    .get_or_fetch(
                        origin,
                        wait,
                        |bytes| Record::decode(bytes).is_some_and(|r| r.fresh()),
                        |before| async move {
                            let before = before.as_deref().and_then(Record::decode).or(stale);
                            let record = fetch(before).await;
                            redislimit::redis::Fresh {
                                value: record.encode(),
                                keep: record.keep(),
                            }
                        },
                    )
                    .await;
                // Found values decode (`fresh` says so); the others are ours.
                Record::decode(cached.value())
                    .unwrap_or_else(|| Record::unavailable(None, "a garbled record".to_owned()))
            }
            None => fetch(stale).await,
        };
        #[cfg(not(feature = "redis"))]
        let record = {
            let _ = wait;
            fetch(stale).await
        };
        let until = std::time::Instant::now() + record.keep();
        self.local
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(origin.to_owned(), (record.clone(), until));
        record
    }
}

/// What a host's robots.txt decided.
pub(super) enum Rules {
    /// No rules apply (a 4xx, or a file that does not parse).
    AllowAll,
    /// The file's rules for this crawl's user agent.
    Robot(Box<Robot>),
    /// The file could not be had (5xx, unreachable): the host is treated
    /// as fully disallowed, as RFC 9309 asks.
    Unavailable(String),
}

impl Rules {
    /// Why `url` may not be fetched, if it may not.
    pub(super) fn refusal(&self, url: &Url) -> Option<String> {
        match self {
            Self::AllowAll => None,
            Self::Robot(robot) => {
                (!robot.allowed(url.as_str())).then(|| "disallowed by robots.txt".to_owned())
            }
            Self::Unavailable(why) => Some(format!(
                "robots.txt unavailable ({why}): the host is treated as disallowed"
            )),
        }
    }

    /// The `Crawl-delay` asked for, capped at `max`.
    pub(super) fn crawl_delay(&self, max: Duration) -> Option<Duration> {
        let Self::Robot(robot) = self else {
            return None;
        };
        let delay = robot.delay.filter(|d| d.is_finite() && *d > 0.0)?;
        Some(Duration::try_from_secs_f32(delay).map_or(max, |d| d.min(max)))
    }
}

/// `/robots.txt` on the scheme, host and port of `url`.
pub(super) fn robots_url(url: &Url) -> Url {
    let mut robots = url.clone();
    robots.set_path("/robots.txt");
    robots.set_query(None);
    robots.set_fragment(None);
    let _ = robots.set_username("");
    let _ = robots.set_password(None);
    robots
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules an answer sets, `None` when it is worth asking again.
    fn answer(agent: &str, status: u16, body: &[u8]) -> Option<Rules> {
        Record::from_status(status, body.to_vec()).map(|r| r.rules(agent))
    }

    #[test]
    fn records_read_back_as_written_and_garbage_reads_as_none() {
        let unavailable = Record::unavailable(None, "status 503\nx".to_owned());
        for record in [
            Record::Allow,
            Record::Rules(b"User-agent: *\nDisallow: /\n".to_vec()),
            Record::Rules(Vec::new()),
            unavailable.clone(),
        ] {
            let back = Record::decode(&record.encode()).unwrap();
            match (&record, &back) {
                (Record::Unavailable { why, .. }, Record::Unavailable { why: read, .. }) => {
                    assert_eq!(why.replace('\n', " "), *read);
                }
                _ => assert_eq!(back, record),
            }
        }
        for garbage in [
            &b""[..],
            b"allow",
            b"unavailable x 1 y",
            b"\xff\xfe",
            b"rules",
        ] {
            assert_eq!(Record::decode(garbage), None, "{garbage:?}");
        }
        assert!(unavailable.fresh(), "asked again a minute later");
        let Record::Unavailable {
            retry_at_ms,
            failures,
            ..
        } = &unavailable
        else {
            unreachable!()
        };
        assert_eq!(*failures, 1);
        let after = *retry_at_ms - epoch_ms();
        assert!((59_000..=60_000).contains(&after), "{after}");
        // Each failure in a row doubles the wait, up to a day.
        let mut record = unavailable;
        for n in 2..=20u32 {
            record = Record::unavailable(Some(&record), "again".to_owned());
            let Record::Unavailable {
                retry_at_ms,
                failures,
                ..
            } = &record
            else {
                unreachable!()
            };
            assert_eq!(*failures, n);
            let wait = *retry_at_ms - epoch_ms();
            let expected = (60_000u64 << (n - 1).min(16)).min(86_400_000);
            assert!(wait <= expected && wait + 1000 >= expected, "{n}: {wait}");
        }
        let stale = Record::Unavailable {
            failures: 1,
            retry_at_ms: epoch_ms() - 1,
            why: String::new(),
        };
        assert!(!stale.fresh());
        assert!(Record::Allow.fresh());
    }

    fn url(path: &str) -> Url {
        Url::parse(&format!("http://a.test:8080{path}?q=1")).unwrap()
    }

    #[test]
    fn statuses_decide_as_rfc_9309_says() {
        let body = b"User-agent: *\nDisallow: /private\nCrawl-delay: 2\n";
        let rules = answer("crawl", 200, body).unwrap();
        assert_eq!(
            rules.refusal(&url("/private/x")).as_deref(),
            Some("disallowed by robots.txt")
        );
        assert_eq!(rules.refusal(&url("/public")), None);
        assert_eq!(
            rules.crawl_delay(Duration::from_secs(30)),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            rules.crawl_delay(Duration::from_secs(1)),
            Some(Duration::from_secs(1)),
            "capped"
        );
        let missing = answer("crawl", 404, b"").unwrap();
        assert_eq!(missing.refusal(&url("/private")), None);
        assert!(answer("crawl", 503, b"").is_none());
        assert!(answer("crawl", 302, b"").is_none());
        let down = Rules::Unavailable("503".into());
        assert!(down.refusal(&url("/")).is_some());
    }

    #[test]
    fn rules_for_another_agent_do_not_apply() {
        let body = b"User-agent: other\nDisallow: /\n\nUser-agent: crawl\nDisallow: /x\n";
        let rules = answer("crawl", 200, body).unwrap();
        assert_eq!(rules.refusal(&url("/y")), None);
        assert!(rules.refusal(&url("/x")).is_some());
    }

    proptest::proptest! {
        /// No robots.txt, however hostile, panics; the delay kept is never
        /// above the cap.
        #[test]
        fn any_file_and_path_decide_without_panicking(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            lines in proptest::collection::vec(
                "(User-agent|Disallow|Allow|Crawl-delay|Sitemap): ?[ -~]{0,20}",
                0..8,
            ),
            path in "/[ -~]{0,30}",
            status in 100u16..600,
        ) {
            let text = lines.join("\n");
            for body in [&body[..], text.as_bytes()] {
                let Some(rules) = answer("crawl", status, body) else {
                    continue;
                };
                if let Ok(url) = Url::parse("http://a.test/").and_then(|u| u.join(&path)) {
                    let _ = rules.refusal(&url);
                }
                let max = Duration::from_secs(30);
                proptest::prop_assert!(rules.crawl_delay(max).is_none_or(|d| d <= max));
            }
        }
    }

    #[test]
    fn the_robots_url_keeps_scheme_host_and_port_only() {
        let u = Url::parse("https://user:pw@a.test:8443/p/q?x=1#f").unwrap();
        assert_eq!(robots_url(&u).as_str(), "https://a.test:8443/robots.txt");
    }
}

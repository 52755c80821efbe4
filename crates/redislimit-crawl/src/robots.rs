//! robots.txt (RFC 9309) for `--robots`: what a host allows this crawl's
//! user agent, and the `Crawl-delay` it asks for.

use std::time::Duration;

use texting_robots::Robot;
use url::Url;

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
    /// The rules a robots.txt answer sets: `status` and `body` of the
    /// response, or `None` when there was none (`error` says why).
    pub(super) fn from_answer(agent: &str, answer: Result<(u16, &[u8]), &str>) -> Option<Self> {
        match answer {
            Ok((200..=299, body)) => Some(match Robot::new(agent, body) {
                Ok(robot) => Self::Robot(Box::new(robot)),
                Err(_) => Self::AllowAll,
            }),
            Ok((400..=499, _)) => Some(Self::AllowAll),
            // Worth asking again: a 5xx, another status, no answer.
            Ok(_) | Err(_) => None,
        }
    }

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

    fn url(path: &str) -> Url {
        Url::parse(&format!("http://a.test:8080{path}?q=1")).unwrap()
    }

    #[test]
    fn statuses_decide_as_rfc_9309_says() {
        let body = b"User-agent: *\nDisallow: /private\nCrawl-delay: 2\n";
        let rules = Rules::from_answer("crawl", Ok((200, body))).unwrap();
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
        let missing = Rules::from_answer("crawl", Ok((404, b""))).unwrap();
        assert_eq!(missing.refusal(&url("/private")), None);
        assert!(Rules::from_answer("crawl", Ok((503, b""))).is_none());
        assert!(Rules::from_answer("crawl", Err("refused")).is_none());
        let down = Rules::Unavailable("503".into());
        assert!(down.refusal(&url("/")).is_some());
    }

    #[test]
    fn rules_for_another_agent_do_not_apply() {
        let body = b"User-agent: other\nDisallow: /\n\nUser-agent: crawl\nDisallow: /x\n";
        let rules = Rules::from_answer("crawl", Ok((200, body))).unwrap();
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
                let Some(rules) = Rules::from_answer("crawl", Ok((status, body))) else {
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

//! The bodies of the fuzz targets in `fuzz/fuzz_targets/` (`cargo xtask fuzz`), as
//! plain functions calling the parsers of `redislimit` (and of the crawl's input)
//! directly: the fuzz targets call them on what libFuzzer generates, and the
//! `fuzz_seeds` test of `redislimit-crawl` (which compiles this file as a module)
//! calls them on every file of `fuzz/seeds/<target>/`, so what the fuzzer once
//! found stays a regression test on stable Rust.
//!
//! Each function takes arbitrary bytes, feeds them to a parser and panics
//! when the parser panics or an invariant of its result does not hold
//! (a host key in lower case, a delay that is never zero, a policy whose
//! rules match what they name...). None of them touches the network or
//! the file system.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use redislimit::http::{Budget, penalty, rate_limit_budget, rate_limit_hold, retry_after};
use redislimit::{Error, HostKey, KeyBy, Pacing, Policies, Rule};
use url::Url;

use redislimit_crawl::input::{check as check_url, read_lines};
use redislimit_crawl::policy_file::parse as parse_policy_file;
use redislimit_crawl::{Input, Settings};

/// A fuzz target: its name (the file `fuzz/fuzz_targets/<name>.rs` and the
/// directory `fuzz/seeds/<name>/`) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target, by name.
pub const TARGETS: [Target; 5] = [
    ("retry_after", retry_after_header),
    ("rate_limit", rate_limit_headers),
    ("host_key", host_key),
    ("url_lines", url_lines),
    ("policy_file", policy_file),
];

/// The body of the target called `name`, if there is one.
pub fn target(name: &str) -> Option<fn(&[u8])> {
    TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, body)| body)
}

/// The instant a response is read at when its input names none:
/// `Wed, 21 Oct 2015 07:28:00 GMT`.
const DEFAULT_NOW: u64 = 1_445_412_480;

/// A response's headers and the instant it is read at, from text lines
/// `name: value` (a `\r` before the `\n` dropped). The pseudo-header
/// `@now: SECONDS` (signed, from the Unix epoch) sets the instant; lines
/// that make no valid header are left out.
struct Response {
    headers: HeaderMap,
    now: SystemTime,
}

fn response(data: &[u8]) -> Response {
    let mut headers = HeaderMap::new();
    let mut now = UNIX_EPOCH + Duration::from_secs(DEFAULT_NOW);
    for line in data.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let name = line[..colon].trim_ascii();
        let value = line[colon + 1..].trim_ascii_start();
        if name == b"@now" {
            if let Some(at) = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .and_then(instant)
            {
                now = at;
            }
            continue;
        }
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    Response { headers, now }
}

/// `seconds` from the Unix epoch, when a `SystemTime` can hold it.
fn instant(seconds: i64) -> Option<SystemTime> {
    let offset = Duration::from_secs(seconds.unsigned_abs());
    if seconds >= 0 {
        UNIX_EPOCH.checked_add(offset)
    } else {
        UNIX_EPOCH.checked_sub(offset)
    }
}

/// Other instants to read a response at: a result that must not depend on
/// the local clock is the same at each.
fn other_instants(now: SystemTime) -> Vec<SystemTime> {
    let mut at = vec![UNIX_EPOCH, UNIX_EPOCH + Duration::from_secs(4_000_000_000)];
    at.extend(now.checked_add(Duration::from_secs(86_400)));
    at.extend(now.checked_sub(Duration::from_secs(86_400)));
    at
}

/// A header's text as the parsers read it: UTF-8, trimmed.
fn text<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    Some(headers.get(name)?.to_str().ok()?.trim())
}

/// The response's own `Date`, when it has a valid one.
fn response_date(headers: &HeaderMap) -> Option<SystemTime> {
    httpdate::parse_http_date(text(headers, &header::DATE)?).ok()
}

/// What `Retry-After: DIGITS` asks for, counted another way than the
/// parser does: seconds, saturating; `0` asks for nothing.
fn delay_seconds(digits: &str) -> Option<Duration> {
    let significant = digits.trim_start_matches('0');
    if significant.is_empty() {
        return None;
    }
    let seconds = if significant.len() > 20 {
        u64::MAX
    } else {
        significant
            .parse::<u128>()
            .map_or(u64::MAX, |n| u64::try_from(n).unwrap_or(u64::MAX))
    };
    Some(Duration::from_secs(seconds))
}

/// `Retry-After` ([`redislimit::http::retry_after`]) on a response given as
/// `name: value` lines (and `@now: SECONDS`).
///
/// Checks that a delay is never zero; that delay-seconds give exactly the
/// seconds written (saturating), whatever the clocks; that an HTTP-date is
/// the delay from the response's `Date` (or the instant read at) to it;
/// that with a valid `Date` the local clock changes nothing; and that
/// [`penalty`] for a `429` takes that delay.
pub fn retry_after_header(data: &[u8]) {
    let Response { headers, now } = response(data);
    let got = retry_after(&headers, now);
    if let Some(delay) = got {
        assert!(!delay.is_zero(), "a zero delay asks for nothing: {got:?}");
    }
    let value = text(&headers, &header::RETRY_AFTER);
    let digits = value.filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
    if let Some(digits) = digits {
        assert_eq!(got, delay_seconds(digits), "Retry-After: {digits}");
        for at in other_instants(now) {
            assert_eq!(retry_after(&headers, at), got, "delay-seconds at {at:?}");
        }
        if got.is_some() {
            let asked = penalty(StatusCode::TOO_MANY_REQUESTS, &headers, None);
            assert_eq!(asked, got, "a 429's penalty is its Retry-After");
        }
    } else if let Some(value) = value {
        let date = response_date(&headers);
        match httpdate::parse_http_date(value) {
            Ok(at) => {
                let reference = date.unwrap_or(now);
                let expected = at.duration_since(reference).ok().filter(|d| !d.is_zero());
                assert_eq!(got, expected, "Retry-After: {value}");
            }
            Err(_) => assert_eq!(got, None, "Retry-After: {value:?} is no date"),
        }
        if date.is_some() {
            for at in other_instants(now) {
                assert_eq!(retry_after(&headers, at), got, "with a Date, at {at:?}");
            }
        }
    } else {
        assert_eq!(got, None, "no usable Retry-After");
    }
    let _ = penalty(
        StatusCode::SERVICE_UNAVAILABLE,
        &headers,
        Some(Duration::MAX),
    );
    let _ = penalty(StatusCode::OK, &headers, None);
}

/// The `RateLimit` field and the vendor `X-RateLimit-*` headers
/// ([`rate_limit_budget`]) on a response given as `name: value` lines (and
/// `@now: SECONDS`).
///
/// Checks that [`rate_limit_hold`] is the budget's hold; that a hold is
/// never zero; that a cached response (`Age` above zero) says nothing;
/// that with a valid `Date` the local clock changes nothing; and that
/// [`penalty`] takes the hold (for a `200`, and for a `429` without
/// `Retry-After`, before its default).
pub fn rate_limit_headers(data: &[u8]) {
    let Response { headers, now } = response(data);
    let budget = rate_limit_budget(&headers, now);
    assert_eq!(rate_limit_hold(&headers, now), budget.map(Budget::hold));
    if let Some(budget) = budget {
        assert!(!budget.hold().is_zero(), "a zero hold: {budget:?}");
    }
    let cached = text(&headers, &header::AGE)
        .and_then(|age| age.parse::<u64>().ok())
        .is_some_and(|age| age > 0);
    if cached {
        assert_eq!(budget, None, "a cached response says nothing of the budget");
    }
    if response_date(&headers).is_some() {
        for at in other_instants(now) {
            assert_eq!(
                rate_limit_budget(&headers, at),
                budget,
                "with a Date, at {at:?}"
            );
        }
        let hold = budget.map(Budget::hold);
        assert_eq!(
            penalty(StatusCode::OK, &headers, None),
            hold,
            "a 200's hold"
        );
        if !headers.contains_key(header::RETRY_AFTER) {
            let default = Some(Duration::from_secs(7));
            assert_eq!(
                penalty(StatusCode::TOO_MANY_REQUESTS, &headers, default),
                hold.or(default),
                "a 429 without Retry-After"
            );
        }
    }
    let _ = penalty(StatusCode::SERVICE_UNAVAILABLE, &headers, None);
}

/// What every key's text is: not empty, ASCII, in lower case, without a
/// trailing dot, without spaces or control characters.
fn check_key(key: &HostKey, from: &str) {
    let name = key.as_str();
    assert!(!name.is_empty(), "an empty key from {from:?}");
    assert!(name.is_ascii(), "{name:?} (from {from:?}) is not ASCII");
    assert!(
        !name.bytes().any(|b| b.is_ascii_uppercase()),
        "{name:?} (from {from:?}) is not in lower case"
    );
    assert!(
        !name.ends_with('.'),
        "{name:?} (from {from:?}) ends with a dot"
    );
    assert!(
        !name.bytes().any(|b| b.is_ascii_control() || b == b' '),
        "{name:?} (from {from:?}) has a space or a control character"
    );
    assert_eq!(key.to_string(), name);
}

/// The keys [`KeyBy`] derives from `key`.
fn check_keyings(key: &HostKey, from: &str) {
    assert_eq!(KeyBy::Host.key(key).as_str(), key.as_str());
    let host_port = KeyBy::HostPort.key(key);
    match key.port() {
        Some(port) => assert_eq!(host_port.as_str(), format!("{key}:{port}")),
        None => assert_eq!(host_port.as_str(), key.as_str()),
    }
    let domain = KeyBy::RegistrableDomain.key(key);
    check_key(&domain, from);
    assert!(
        domain.as_str() == key.as_str() || key.as_str().ends_with(&format!(".{domain}")),
        "{domain} is not {key} or one of its parents"
    );
    assert_eq!(
        KeyBy::RegistrableDomain.key(&domain).as_str(),
        domain.as_str(),
        "a registrable domain is its own"
    );
}

/// Rules naming `key` (exactly, and as a wildcard over its parent) match
/// it, on whatever port.
fn check_rules(key: &HostKey) {
    let pacing = Pacing::default();
    let with =
        |pattern: &str| Policies::new(pacing.clone()).with_rule(Rule::new(pattern, pacing.clone()));
    let on_port = KeyBy::HostPort.key(key);
    if let Ok(policies) = with(key.as_str()) {
        assert_eq!(
            policies.rules()[0].pattern(),
            key.as_str(),
            "a key is normalized"
        );
        assert!(
            policies.rule_for(key).is_some(),
            "{key} escapes its own rule"
        );
        assert!(
            policies.rule_for(&on_port).is_some(),
            "{on_port} escapes {key}'s rule"
        );
    }
    let parent = match key.as_str().split_once('.') {
        Some((_, parent)) if !parent.is_empty() && !key.as_str().starts_with('[') => parent,
        _ => return,
    };
    let wildcard = format!("*.{parent}");
    if let Ok(policies) = with(&wildcard) {
        assert_eq!(
            policies.rules()[0].pattern(),
            wildcard,
            "a parent of a key is normalized"
        );
        assert!(policies.rule_for(key).is_some(), "{key} escapes {wildcard}");
        assert!(
            policies.rule_for(&on_port).is_some(),
            "{on_port} escapes {wildcard}"
        );
    }
}

/// Host keys ([`HostKey::parse`], [`HostKey::from_uri`], [`KeyBy`]) of the
/// input as a URL (invalid UTF-8 replaced).
///
/// Checks that a key is not empty, ASCII, lower case, without a trailing
/// dot; that it carries the URL's port; that a refusal names the URL; that
/// the key of an `http`/`https`/`ws`/`wss`/`ftp` URL is a host that keys
/// the same in `http://KEY/`, and that a rule naming it, or a wildcard
/// over its parent, matches it; that a registrable domain is the key or a
/// parent, and its own; and that an `http::Uri` and a URL of the same
/// `http`/`https` text key the same.
pub fn host_key(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();
    match HostKey::parse(text) {
        Ok(key) => {
            check_key(&key, text);
            check_keyings(&key, text);
            let url = Url::parse(text).expect("HostKey::parse parsed it");
            assert_eq!(
                key.port(),
                url.port_or_known_default(),
                "the port of {text:?}"
            );
            let again = HostKey::from_url(&url).expect("HostKey::parse keyed it");
            assert_eq!(again.as_str(), key.as_str());
            if matches!(url.scheme(), "http" | "https" | "ws" | "wss" | "ftp") {
                let again = HostKey::parse(&format!("http://{key}/"))
                    .unwrap_or_else(|e| panic!("{key} (from {text:?}) is no host: {e}"));
                assert_eq!(again.as_str(), key.as_str(), "{key} keyed again");
                check_rules(&key);
            }
        }
        Err(Error::InvalidUrl { url, .. }) => assert_eq!(url, text, "the refusal names the URL"),
        Err(other) => panic!("{text:?}: not an InvalidUrl: {other:?}"),
    }
    if let Ok(uri) = text.parse::<http::Uri>() {
        match HostKey::from_uri(&uri) {
            Ok(key) => {
                check_key(&key, text);
                check_keyings(&key, text);
                if matches!(uri.scheme_str(), Some("http" | "https"))
                    && let Ok(by_url) = HostKey::parse(text)
                {
                    assert_eq!(
                        key.as_str(),
                        by_url.as_str(),
                        "Uri and Url keys of {text:?}"
                    );
                    assert_eq!(key.port(), by_url.port(), "Uri and Url ports of {text:?}");
                }
            }
            Err(Error::InvalidUrl { .. }) => {}
            Err(other) => panic!("{text:?}: not an InvalidUrl: {other:?}"),
        }
    }
}

/// The crawl's `--urls` file, one URL (and optional priority) a line.
///
/// Checks that every line that is neither blank nor a comment is either
/// used or skipped, the skipped ones with their line number, in order;
/// that the URLs are distinct `http`/`https` URLs with a host key, which
/// read back as themselves (as a report's URLs fed to another crawl); and
/// that priorities belong to URLs that were used. Each line is also
/// checked as a command-line argument.
pub fn url_lines(data: &[u8]) {
    const NAME: &str = "urls.txt";
    let mut input = Input::default();
    read_lines(data, &NAME, &mut input).expect("reading memory cannot fail");
    let lines: Vec<&[u8]> = data.split_inclusive(|&b| b == b'\n').collect();
    let meant = lines
        .iter()
        .filter(|line| match std::str::from_utf8(line) {
            Err(_) => true,
            Ok(text) => {
                let text = text.trim();
                !text.is_empty() && !text.starts_with('#')
            }
        })
        .count();
    assert_eq!(
        input.urls.len() + input.skipped.len(),
        meant,
        "{:?}",
        input.skipped
    );
    let mut last = 0;
    for skipped in &input.skipped {
        let number = skipped
            .strip_prefix("urls.txt:")
            .and_then(|rest| rest.split_once(": "))
            .and_then(|(n, _)| n.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("{skipped:?} names no line"));
        assert!(
            number > last && number <= lines.len(),
            "{skipped:?} after line {last}"
        );
        last = number;
    }
    let used: Vec<Url> = input.urls.urls();
    let urls: HashSet<&Url> = used.iter().collect();
    assert_eq!(urls.len(), input.urls.len(), "a URL is used twice");
    assert_eq!(used.len(), input.urls.len());
    for url in &used {
        assert!(matches!(url.scheme(), "http" | "https"), "{url}");
        let key = HostKey::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        check_key(&key, url.as_str());
        let again = check_url(url.as_str()).unwrap_or_else(|e| panic!("{url} read back: {e}"));
        assert_eq!(&again, url, "{url} reads back as itself");
    }
    for url in input.priorities.keys() {
        assert!(
            urls.contains(url),
            "a priority for {url}, which is not used"
        );
    }
    for line in lines {
        if let Ok(url) = std::str::from_utf8(line)
            .map_err(drop)
            .and_then(|l| check_url(l).map_err(drop))
        {
            assert!(matches!(url.scheme(), "http" | "https"), "{url}");
            assert!(HostKey::from_url(&url).is_ok(), "{url}");
        }
    }
}

/// The flags a policy file is read on top of: the crawl's defaults, as a user without
/// flags gets them.
fn flags() -> Settings {
    use clap::Parser;
    redislimit_crawl::Args::try_parse_from(["crawl"])
        .expect("the crawl parses without arguments")
        .settings()
}

/// The crawl's `--policy` file (TOML), read on top of fixed flags.
///
/// Checks that a refusal can be shown; that an accepted file's default
/// settings make its default pacing; that its rules' patterns are
/// distinct and normalized (a rule of the same pattern is accepted as
/// is); that a rule naming an exact host decides that host on any port;
/// and that a wildcard rule decides a host below its suffix (unless an
/// exact rule names that host).
pub fn policy_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        // The crawl reads the file as UTF-8 and refuses it before parsing.
        return;
    };
    let (default, policies) = match parse_policy_file(text, &flags()) {
        Ok(parsed) => parsed,
        Err(err) => {
            let _ = format!("{err:#}");
            return;
        }
    };
    let pacing = default
        .pacing()
        .expect("the default was built from these settings");
    assert_eq!(policies.default_pacing(), &pacing);
    let patterns: HashSet<&str> = policies.rules().iter().map(Rule::pattern).collect();
    assert_eq!(
        patterns.len(),
        policies.rules().len(),
        "a pattern given twice"
    );
    for rule in policies.rules() {
        let pattern = rule.pattern();
        let alone = Policies::new(Pacing::default())
            .with_rule(rule.clone())
            .unwrap_or_else(|e| panic!("{pattern:?} was accepted, then refused: {e}"));
        assert_eq!(alone.rules()[0].pattern(), pattern, "normalized twice");
        let (host, exact) = match pattern.strip_prefix("*.") {
            Some(suffix) => (format!("fuzz-probe.{suffix}"), false),
            None => (pattern.to_owned(), true),
        };
        let Ok(key) = HostKey::parse(&format!("http://{host}:8080/")) else {
            continue;
        };
        if key.as_str() != host {
            continue;
        }
        for key in [KeyBy::Host.key(&key), KeyBy::HostPort.key(&key)] {
            let decided = policies.rule_for(&key).map(Rule::pattern);
            if exact {
                assert_eq!(decided, Some(pattern), "{key} under its own rule");
            } else {
                assert!(
                    decided == Some(pattern) || decided == Some(host.as_str()),
                    "{key} under {decided:?}, not {pattern}"
                );
            }
            assert_eq!(policies.pacing_for(&key), rule_pacing(&policies, decided));
        }
    }
}

/// The pacing of the rule with `pattern`, or the default.
fn rule_pacing<'a>(policies: &'a Policies, pattern: Option<&str>) -> &'a Pacing {
    policies
        .rules()
        .iter()
        .find(|rule| Some(rule.pattern()) == pattern)
        .map_or(policies.default_pacing(), Rule::pacing)
}

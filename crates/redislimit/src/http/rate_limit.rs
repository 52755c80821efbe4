//! What a response says about the budget left: the IETF `RateLimit` field
//! and the common vendor `X-RateLimit-*` headers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, header};

use super::retry_after::response_date;

/// How long a response asks its host to be left alone because its rate
/// limit budget is spent, or `None` when it says nothing usable.
///
/// Read, in this order (the first that says "spent" decides):
///
/// | header | budget left | resets |
/// |---|---|---|
/// | `RateLimit: "name";r=R;t=T` (draft-ietf-httpapi-ratelimit-headers, a structured field list) | `r` | `t` seconds from now |
/// | `X-RateLimit-Remaining` + `X-RateLimit-Reset-After` (Discord) | remaining | fractional seconds from now |
/// | `X-RateLimit-Remaining` + `X-RateLimit-Reset` (GitHub: epoch seconds; Reddit: seconds from now) | remaining | epoch or delta, see below |
/// | `RateLimit-Remaining` + `RateLimit-Reset` (GitLab: epoch seconds) | remaining | epoch or delta |
/// | `X-Rate-Limit-Remaining` + `X-Rate-Limit-Reset` (X/Twitter: epoch seconds) | remaining | epoch or delta |
///
/// A budget is spent when what is left is `0`; the hold lasts until its
/// reset. A reset that is a plausible Unix time (no earlier than a year
/// before the response's `Date`, or `now` without one) is an instant,
/// measured against that `Date`; a smaller number is a delay. In the
/// `RateLimit` list the longest hold of the spent policies wins.
///
/// Following the draft's client rules, malformed fields are ignored (a
/// list that fails to parse as a structured field says nothing), and a
/// response served from a cache (an `Age` above zero) says nothing about
/// the budget now. A zero or past reset holds nothing. Capping the hold
/// is the limiter's job ([`Pacing::max_penalty`](crate::Pacing::max_penalty));
/// `Retry-After` takes precedence (see [`penalty`](super::penalty)).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderMap;
/// use redislimit::http::rate_limit_hold;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("ratelimit", r#""default";r=0;t=30"#.parse().unwrap());
/// assert_eq!(rate_limit_hold(&headers, SystemTime::now()), Some(Duration::from_secs(30)));
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-ratelimit-remaining", "0".parse().unwrap());
/// headers.insert("x-ratelimit-reset-after", "1.5".parse().unwrap());
/// assert_eq!(rate_limit_hold(&headers, SystemTime::now()), Some(Duration::from_millis(1500)));
/// ```
pub fn rate_limit_hold(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if cached(headers) {
        return None;
    }
    if let Some(hold) = ietf_hold(headers) {
        return Some(hold);
    }
    let reference = response_date(headers).unwrap_or(now);
    let vendors: [(&str, &str, Reset); 4] = [
        (
            "x-ratelimit-remaining",
            "x-ratelimit-reset-after",
            Reset::Delay,
        ),
        ("x-ratelimit-remaining", "x-ratelimit-reset", Reset::Either),
        ("ratelimit-remaining", "ratelimit-reset", Reset::Either),
        (
            "x-rate-limit-remaining",
            "x-rate-limit-reset",
            Reset::Either,
        ),
    ];
    vendors.into_iter().find_map(|(remaining, reset, kind)| {
        if number(headers, remaining)? != 0.0 {
            return None;
        }
        let reset = number(headers, reset)?;
        kind.hold(reset, reference)
    })
}

/// How a vendor's reset header counts.
#[derive(Debug, Clone, Copy)]
enum Reset {
    /// Seconds from the response.
    Delay,
    /// A Unix time when it looks like one, else seconds from the response.
    Either,
}

/// A year: resets further before the response than this are delays.
const PLAUSIBLE_EPOCH_SLACK: u64 = 365 * 86_400;

impl Reset {
    fn hold(self, value: f64, reference: SystemTime) -> Option<Duration> {
        if !value.is_finite() || value <= 0.0 {
            return None;
        }
        let reference_s = reference.duration_since(UNIX_EPOCH).ok()?.as_secs_f64();
        let is_epoch =
            matches!(self, Self::Either) && value >= reference_s - PLAUSIBLE_EPOCH_SLACK as f64;
        let seconds = if is_epoch { value - reference_s } else { value };
        (seconds > 0.0).then(|| Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
    }
}

/// The longest hold among the spent policies of an IETF `RateLimit` field.
fn ietf_hold(headers: &HeaderMap) -> Option<Duration> {
    let mut longest: Option<Duration> = None;
    for value in headers.get_all("ratelimit") {
        let Ok(text) = value.to_str() else { continue };
        let Ok(list) = sfv::Parser::new(text).parse::<sfv::List>() else {
            continue;
        };
        for entry in list {
            let sfv::ListEntry::Item(item) = entry else {
                continue;
            };
            let int = |key: &str| {
                item.params
                    .get(key)
                    .and_then(sfv::BareItem::as_integer)
                    .map(i64::from)
            };
            let (Some(remaining), Some(reset)) = (int("r"), int("t")) else {
                continue;
            };
            if remaining == 0 && reset > 0 {
                let hold = Duration::from_secs(reset.unsigned_abs());
                longest = Some(longest.map_or(hold, |l| l.max(hold)));
            }
        }
    }
    longest
}

/// Whether the response came from a cache (`Age` above zero).
fn cached(headers: &HeaderMap) -> bool {
    headers
        .get(header::AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|age| age > 0)
}

/// A header holding one non-negative number (a decimal point allowed).
fn number(headers: &HeaderMap, name: &str) -> Option<f64> {
    let text = headers.get(name)?.to_str().ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    text.parse::<f64>().ok().filter(|n| n.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn at(date: &str) -> SystemTime {
        httpdate::parse_http_date(date).unwrap()
    }

    const DATE: &str = "Wed, 21 Oct 2015 07:28:00 GMT";
    /// `DATE` as a Unix time.
    const EPOCH: u64 = 1_445_412_480;

    #[test]
    fn ietf_fields_hold_only_spent_policies() {
        let now = SystemTime::now();
        let h = |v: &str| rate_limit_hold(&headers(&[("ratelimit", v)]), now);
        assert_eq!(h(r#""default";r=0;t=10"#), Some(Duration::from_secs(10)));
        assert_eq!(h(r#""default";r=3;t=10"#), None);
        // Several policies: the longest spent one.
        assert_eq!(
            h(r#""hour";r=0;t=1200, "minute";r=0;t=20, "day";r=9;t=80000"#),
            Some(Duration::from_secs(1200))
        );
        // Malformed: ignored.
        assert_eq!(h(r#""default";r=0;t="#), None);
        assert_eq!(h(r#"default r=0 t=10"#), None);
        assert_eq!(h(r#""default";r=0;t=-5"#), None);
        assert_eq!(h(r#""default";r=0"#), None);
    }

    #[test]
    fn vendor_resets_are_told_apart_against_the_response_date() {
        let now = SystemTime::now();
        // GitHub: epoch seconds, against the response's Date.
        let github = headers(&[
            ("date", DATE),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &(EPOCH + 90).to_string()),
        ]);
        assert_eq!(rate_limit_hold(&github, now), Some(Duration::from_secs(90)));
        // Reddit: seconds from now, in the same header.
        let reddit = headers(&[
            ("x-ratelimit-remaining", "0.0"),
            ("x-ratelimit-reset", "42"),
        ]);
        assert_eq!(rate_limit_hold(&reddit, now), Some(Duration::from_secs(42)));
        // GitLab and X.
        let gitlab = headers(&[
            ("date", DATE),
            ("ratelimit-remaining", "0"),
            ("ratelimit-reset", &(EPOCH + 5).to_string()),
        ]);
        assert_eq!(rate_limit_hold(&gitlab, now), Some(Duration::from_secs(5)));
        let x = headers(&[
            ("date", DATE),
            ("x-rate-limit-remaining", "0"),
            ("x-rate-limit-reset", &(EPOCH + 7).to_string()),
        ]);
        assert_eq!(rate_limit_hold(&x, now), Some(Duration::from_secs(7)));
        // Discord: fractional seconds from now.
        let discord = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset-after", "0.25"),
        ]);
        assert_eq!(
            rate_limit_hold(&discord, now),
            Some(Duration::from_millis(250))
        );
        // Without a Date, against now.
        let then = at(DATE);
        let nodate = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &(EPOCH + 3).to_string()),
        ]);
        assert_eq!(rate_limit_hold(&nodate, then), Some(Duration::from_secs(3)));
    }

    #[test]
    fn budget_left_a_past_reset_a_cached_response_or_garbage_hold_nothing() {
        let now = SystemTime::now();
        let cases: [&[(&str, &str)]; 6] = [
            &[("x-ratelimit-remaining", "4"), ("x-ratelimit-reset", "30")],
            &[
                ("date", DATE),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1445412400"),
            ],
            &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "-3")],
            &[
                ("x-ratelimit-remaining", "zero"),
                ("x-ratelimit-reset", "30"),
            ],
            &[("x-ratelimit-remaining", "0")],
            &[("age", "12"), ("ratelimit", r#""default";r=0;t=10"#)],
        ];
        for case in cases {
            assert_eq!(rate_limit_hold(&headers(case), now), None, "{case:?}");
        }
    }

    proptest! {
        #[test]
        fn never_panics(
            ietf in "[ -~]{0,60}",
            remaining in "[ -~]{0,12}",
            reset in "[ -~]{0,24}",
            date in "[ -~]{0,32}",
        ) {
            let mut map = HeaderMap::new();
            for (name, value) in [
                ("ratelimit", ietf.as_str()),
                ("x-ratelimit-remaining", remaining.as_str()),
                ("x-ratelimit-reset", reset.as_str()),
                ("x-ratelimit-reset-after", reset.as_str()),
                ("date", date.as_str()),
            ] {
                if let Ok(value) = value.parse() {
                    map.insert(name, value);
                }
            }
            let _ = rate_limit_hold(&map, SystemTime::now());
        }
    }
}

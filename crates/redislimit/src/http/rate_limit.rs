//! What a response says about the budget left: the IETF `RateLimit` field
//! and the common vendor `X-RateLimit-*` headers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, header};

use super::retry_after::response_date;

/// How long a response asks its host to be left alone because of its
/// rate limit budget, or `None` when it says nothing usable: until the
/// reset when the budget is spent, or the budget left spread over the time
/// to its reset when little is left (see [`Budget`]).
///
/// Read, in this order (the first that says anything decides):
///
/// | header | limit | budget left | resets |
/// |---|---|---|---|
/// | `RateLimit: "name";r=R;t=T` with `RateLimit-Policy: "name";q=Q;w=W` (draft-ietf-httpapi-ratelimit-headers, structured field lists) | `q` of the policy of the same name | `r` | `t` seconds from now |
/// | `X-RateLimit-Remaining` + `X-RateLimit-Reset-After` (Discord) | `X-RateLimit-Limit` | remaining | fractional seconds from now |
/// | `X-RateLimit-Remaining` + `X-RateLimit-Reset` (GitHub: epoch seconds; Reddit: seconds from now) | `X-RateLimit-Limit` | remaining | epoch or delta, see below |
/// | `RateLimit-Remaining` + `RateLimit-Reset` (GitLab: epoch seconds) | `RateLimit-Limit` | remaining | epoch or delta |
/// | `X-Rate-Limit-Remaining` + `X-Rate-Limit-Reset` (X/Twitter: epoch seconds) | `X-Rate-Limit-Limit` | remaining | epoch or delta |
///
/// A `RateLimit-Policy` counts in its `qu` unit: `requests` (the
/// default), `content-bytes` (counted in responses the size of this one,
/// from its `Content-Length`: less than one such response left is a spent
/// budget; without a `Content-Length` only a spent budget holds) or
/// `concurrent-requests` (a cap on requests in flight, not a budget in
/// time: see [`rate_limit_concurrency`]). A policy in a unit not listed
/// here is ignored.
///
/// A budget is spent when what is left is `0`: the hold lasts until its
/// reset. It is low when what is left is more than `0` but at most a tenth
/// of a known limit: the hold is the time to the reset divided by what is
/// left, so the rest of the budget is spread evenly up to the reset
/// instead of spent in a burst (and then waited out). A hold only ever
/// slows a host below its own pacing, never speeds it up. Without a known
/// limit, only a spent budget holds.
///
/// A reset that is a plausible Unix time (no earlier than a year before
/// the response's `Date`, or `now` without one) is an instant, measured
/// against that `Date`; a smaller number is a delay. In the `RateLimit`
/// list the longest hold among its policies wins; a `pk` (partition key)
/// is not used, since every partition of a host counts against that
/// host's pacing.
///
/// Following the draft's client rules, malformed fields are ignored (a
/// list that fails to parse as a structured field says nothing), and a
/// response served from a cache (an `Age` above zero) says nothing about
/// the budget now. A zero or past reset holds nothing, nor does a hold
/// that rounds to zero (a reset under a nanosecond away, or a budget so
/// large that its share of the reset is). Capping the hold
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
/// // 5 left of 100, resetting in 10 s: one every 2 s.
/// headers.insert("ratelimit", r#""default";r=5;t=10"#.parse().unwrap());
/// headers.insert("ratelimit-policy", r#""default";q=100;w=60"#.parse().unwrap());
/// assert_eq!(rate_limit_hold(&headers, SystemTime::now()), Some(Duration::from_secs(2)));
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-ratelimit-remaining", "0".parse().unwrap());
/// headers.insert("x-ratelimit-reset-after", "1.5".parse().unwrap());
/// assert_eq!(rate_limit_hold(&headers, SystemTime::now()), Some(Duration::from_millis(1500)));
/// ```
pub fn rate_limit_hold(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    rate_limit_budget(headers, now).map(Budget::hold)
}

/// What a response's rate limit headers say about its host's budget,
/// as [`rate_limit_hold`] reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// Nothing is left: the host is held until the reset, this far away.
    Spent(Duration),
    /// Little is left: the host is held for this gap, the time to the
    /// reset divided by what is left.
    Low(Duration),
}

impl Budget {
    /// How long the host is held for.
    pub fn hold(self) -> Duration {
        match self {
            Self::Spent(hold) | Self::Low(hold) => hold,
        }
    }
}

/// [`rate_limit_hold`], telling a spent budget from a low one.
pub fn rate_limit_budget(headers: &HeaderMap, now: SystemTime) -> Option<Budget> {
    if cached(headers) {
        return None;
    }
    if let Some(budget) = ietf_budget(headers) {
        return Some(budget);
    }
    let reference = response_date(headers).unwrap_or(now);
    let vendors: [(&str, &str, &str, Reset); 4] = [
        (
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset-after",
            Reset::Delay,
        ),
        (
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            Reset::Either,
        ),
        (
            "ratelimit-limit",
            "ratelimit-remaining",
            "ratelimit-reset",
            Reset::Either,
        ),
        (
            "x-rate-limit-limit",
            "x-rate-limit-remaining",
            "x-rate-limit-reset",
            Reset::Either,
        ),
    ];
    vendors
        .into_iter()
        .find_map(|(limit, remaining, reset, kind)| {
            let left = number(headers, remaining)?;
            let reset = kind.hold(number(headers, reset)?, reference)?;
            judge(left, number(headers, limit), reset)
        })
}

/// The budget `left` of `limit`, resetting in `reset`; `None` when it
/// asks for no hold (or for one that rounds to zero).
fn judge(left: f64, limit: Option<f64>, reset: Duration) -> Option<Budget> {
    let budget = if left == 0.0 {
        Budget::Spent(reset)
    } else if limit.is_some_and(|limit| left * LOW_FRACTION <= limit) {
        Budget::Low(share(reset, left))
    } else {
        return None;
    };
    (!budget.hold().is_zero()).then_some(budget)
}

/// `reset` divided by `left` (at least 1), never more than `reset`.
/// (`Duration::div_f64` panics when the quotient does not fit, as for a
/// reset so far away that it saturated to `Duration::MAX`: its seconds as
/// an `f64` round up past it.)
fn share(reset: Duration, left: f64) -> Duration {
    Duration::try_from_secs_f64(reset.as_secs_f64() / left.max(1.0)).map_or(reset, |d| d.min(reset))
}

/// A budget is low when what is left is at most a tenth of the limit.
const LOW_FRACTION: f64 = 10.0;

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

/// The items of the structured field lists in every `name` header, with
/// their names (a string or a token); a line that does not parse is
/// skipped whole.
fn sf_items(headers: &HeaderMap, name: &str) -> Vec<(String, sfv::Parameters)> {
    let mut items = Vec::new();
    for value in headers.get_all(name) {
        let Ok(text) = value.to_str() else { continue };
        let Ok(list) = sfv::Parser::new(text).parse::<sfv::List>() else {
            continue;
        };
        for entry in list {
            let sfv::ListEntry::Item(item) = entry else {
                continue;
            };
            let name = match &item.bare_item {
                sfv::BareItem::String(s) => s.as_str().to_owned(),
                sfv::BareItem::Token(t) => t.as_str().to_owned(),
                _ => continue,
            };
            items.push((name, item.params));
        }
    }
    items
}

/// A non-negative integer parameter.
fn param(params: &sfv::Parameters, key: &str) -> Option<u64> {
    let n = i64::from(params.get(key)?.as_integer()?);
    u64::try_from(n).ok()
}

/// What a `RateLimit-Policy` counts (its `qu` parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    /// `requests`, the default.
    Requests,
    /// `content-bytes`: the bytes of response content.
    ContentBytes,
    /// `concurrent-requests`: requests in flight (see [`rate_limit_concurrency`]).
    ConcurrentRequests,
}

impl Unit {
    /// The unit of a policy's parameters; `None` for a unit this crate
    /// does not know (such a policy is ignored, as the draft asks).
    fn of(params: &sfv::Parameters) -> Option<Self> {
        let Some(unit) = params.get("qu") else {
            return Some(Self::Requests);
        };
        let name = match unit {
            sfv::BareItem::String(s) => s.as_str(),
            sfv::BareItem::Token(t) => t.as_str(),
            _ => return None,
        };
        match name {
            "requests" => Some(Self::Requests),
            "content-bytes" => Some(Self::ContentBytes),
            "concurrent-requests" => Some(Self::ConcurrentRequests),
            _ => None,
        }
    }
}

/// The longest hold among the policies of an IETF `RateLimit` field, each
/// judged against the quota of the `RateLimit-Policy` of the same name, in
/// that policy's unit: requests by default; a budget of `content-bytes` is
/// counted in responses the size of this one (its `Content-Length`: a
/// budget with less than one such response left is spent), and without a
/// `Content-Length` only a spent budget holds; `concurrent-requests` and
/// unknown units hold nothing.
fn ietf_budget(headers: &HeaderMap) -> Option<Budget> {
    let policies = sf_items(headers, "ratelimit-policy");
    let policy = |name: &str| {
        let params = policies.iter().find(|(n, _)| n == name).map(|(_, p)| p);
        match params {
            Some(params) => Some((param(params, "q"), Unit::of(params)?)),
            None => Some((None, Unit::Requests)),
        }
    };
    let size = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&n| n > 0);
    sf_items(headers, "ratelimit")
        .into_iter()
        .filter_map(|(name, params)| {
            let (left, reset) = (param(&params, "r")?, param(&params, "t")?);
            if reset == 0 {
                return None;
            }
            let (quota, unit) = policy(&name)?;
            let reset = Duration::from_secs(reset);
            match (unit, size) {
                (Unit::Requests, _) => judge(left as f64, quota.map(|q| q as f64), reset),
                (Unit::ContentBytes, Some(size)) => judge(
                    (left / size) as f64,
                    quota.map(|q| q as f64 / size as f64),
                    reset,
                ),
                (Unit::ContentBytes, None) => judge(left as f64, None, reset),
                (Unit::ConcurrentRequests, _) => None,
            }
        })
        .max_by_key(|b| b.hold())
}

/// The cap on requests in flight a response's `RateLimit-Policy` states
/// (a policy with `qu=concurrent-requests`: its quota `q`), and how long
/// it holds (its window `w`, or a minute without one); the smallest such
/// quota when several do. `None` when none does, or the response came from
/// a cache. A quota of 0 reads as 1: one request at a time is the least a
/// client can send and learn again.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use redislimit::http::rate_limit_concurrency;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("ratelimit-policy", r#""conc";q=2;qu="concurrent-requests";w=30"#.parse().unwrap());
/// assert_eq!(rate_limit_concurrency(&headers), Some((2, Duration::from_secs(30))));
/// ```
pub fn rate_limit_concurrency(headers: &HeaderMap) -> Option<(u32, Duration)> {
    if cached(headers) {
        return None;
    }
    sf_items(headers, "ratelimit-policy")
        .into_iter()
        .filter(|(_, params)| Unit::of(params) == Some(Unit::ConcurrentRequests))
        .filter_map(|(_, params)| {
            let cap = u32::try_from(param(&params, "q")?)
                .unwrap_or(u32::MAX)
                .max(1);
            let window = param(&params, "w").filter(|&w| w > 0).unwrap_or(60);
            Some((cap, Duration::from_secs(window.min(86_400))))
        })
        .min_by_key(|(cap, _)| *cap)
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
    fn budgets_count_in_their_units() {
        let now = SystemTime::now();
        let budget = |r: &str, policy: &str, length: Option<&str>| {
            let mut h = headers(&[("ratelimit", r), ("ratelimit-policy", policy)]);
            if let Some(length) = length {
                h.insert(header::CONTENT_LENGTH, length.parse().unwrap());
            }
            rate_limit_budget(&h, now)
        };
        let bytes = r#""b";q=1000000;qu="content-bytes";w=60"#;
        // 150,000 bytes left of 1,000,000 is not low in bytes, but in
        // responses of 100,000 it is one left of ten: held for the whole
        // reset (spread over one response).
        assert_eq!(
            budget(r#""b";r=150000;t=60"#, bytes, Some("100000")),
            Some(Budget::Low(Duration::from_secs(60)))
        );
        // Less than one response left: spent.
        assert_eq!(
            budget(r#""b";r=99999;t=60"#, bytes, Some("100000")),
            Some(Budget::Spent(Duration::from_secs(60)))
        );
        // Plenty of responses left.
        assert_eq!(budget(r#""b";r=900000;t=60"#, bytes, Some("1000")), None);
        // No length: only a spent budget holds.
        assert_eq!(budget(r#""b";r=10;t=60"#, bytes, None), None);
        assert_eq!(
            budget(r#""b";r=0;t=60"#, bytes, None),
            Some(Budget::Spent(Duration::from_secs(60)))
        );
        // A token works as well as a string; `requests` is the default.
        let tokens = r#""b";q=10;qu=requests;w=60"#;
        assert_eq!(
            budget(r#""b";r=1;t=60"#, tokens, None),
            Some(Budget::Low(Duration::from_secs(60)))
        );
        // Concurrency and unknown units are no budget in time.
        for policy in [
            r#""b";q=10;qu="concurrent-requests";w=60"#,
            r#""b";q=10;qu="furlongs";w=60"#,
            r#""b";q=10;qu=1;w=60"#,
        ] {
            assert_eq!(budget(r#""b";r=0;t=60"#, policy, None), None, "{policy}");
        }
    }

    #[test]
    fn concurrency_caps_are_read_from_their_policies() {
        let cap = |policy: &str| rate_limit_concurrency(&headers(&[("ratelimit-policy", policy)]));
        assert_eq!(
            cap(r#""c";q=4;qu="concurrent-requests";w=10, "d";q=2;qu="concurrent-requests""#),
            Some((2, Duration::from_secs(60)))
        );
        assert_eq!(
            cap(r#""c";q=0;qu=concurrent-requests;w=5"#),
            Some((1, Duration::from_secs(5)))
        );
        assert_eq!(cap(r#""c";q=4;w=10"#), None);
        assert_eq!(cap(r#""c";qu="concurrent-requests";w=10"#), None);
        assert_eq!(cap("not a list ("), None);
        let mut stale = headers(&[("ratelimit-policy", r#""c";q=4;qu="concurrent-requests""#)]);
        stale.insert(header::AGE, "3".parse().unwrap());
        assert_eq!(rate_limit_concurrency(&stale), None);
    }

    #[test]
    fn a_low_budget_is_spread_up_to_the_reset() {
        let now = SystemTime::now();
        let ietf = |r: &str, policy: &str| {
            rate_limit_budget(
                &headers(&[("ratelimit", r), ("ratelimit-policy", policy)]),
                now,
            )
        };
        let policy = r#""hour";q=1000;w=3600, "burst";q=20;w=10"#;
        // 50 of 1,000 left for 600 s: one every 12 s.
        assert_eq!(
            ietf(r#""hour";r=50;t=600"#, policy),
            Some(Budget::Low(Duration::from_secs(12)))
        );
        // 101 left is more than a tenth: no hold.
        assert_eq!(ietf(r#""hour";r=101;t=600"#, policy), None);
        // Matched by name: 2 of the burst's 20 (a tenth) for 4 s.
        assert_eq!(
            ietf(r#""hour";r=900;t=600, "burst";r=2;t=4"#, policy),
            Some(Budget::Low(Duration::from_secs(2)))
        );
        // The longest hold wins, a spent one among them.
        assert_eq!(
            ietf(r#""hour";r=0;t=1, "burst";r=2;t=4"#, policy),
            Some(Budget::Low(Duration::from_secs(2)))
        );
        assert_eq!(
            ietf(r#""hour";r=0;t=30, "burst";r=2;t=4"#, policy),
            Some(Budget::Spent(Duration::from_secs(30)))
        );
        // No policy of that name, or a malformed one: only spent holds.
        assert_eq!(ietf(r#""day";r=1;t=600"#, policy), None);
        assert_eq!(ietf(r#""hour";r=1;t=600"#, "hour q=1000"), None);
        // Vendor headers with a limit.
        let github = headers(&[
            ("date", DATE),
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "100"),
            ("x-ratelimit-reset", &(EPOCH + 300).to_string()),
        ]);
        assert_eq!(
            rate_limit_budget(&github, now),
            Some(Budget::Low(Duration::from_secs(3)))
        );
        let discord = headers(&[
            ("x-ratelimit-limit", "5"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset-after", "0.5"),
        ]);
        assert_eq!(
            rate_limit_budget(&discord, now),
            Some(Budget::Spent(Duration::from_millis(500)))
        );
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

    #[test]
    fn a_low_budget_with_a_reset_beyond_any_duration_holds_the_longest() {
        // The reset saturates to `Duration::MAX`; its share used to panic.
        let now = SystemTime::now();
        for reset in [
            ("x-ratelimit-reset-after", "99999999999999999999999"),
            ("x-ratelimit-reset", "99999999999999999999999"),
        ] {
            let map = headers(&[
                ("x-ratelimit-limit", "100"),
                ("x-ratelimit-remaining", "1"),
                reset,
            ]);
            assert_eq!(
                rate_limit_budget(&map, now),
                Some(Budget::Low(Duration::MAX)),
                "{reset:?}"
            );
        }
        let map = headers(&[
            ("x-ratelimit-limit", "100"),
            ("x-ratelimit-remaining", "4"),
            ("x-ratelimit-reset-after", "99999999999999999999999"),
        ]);
        assert_eq!(
            rate_limit_budget(&map, now),
            Some(Budget::Low(Duration::MAX.div_f64(4.0)))
        );
        assert_eq!(
            share(Duration::from_secs(10), 4.0),
            Duration::from_millis(2500)
        );
        assert_eq!(share(Duration::from_secs(10), 0.5), Duration::from_secs(10));
    }

    #[test]
    fn a_hold_that_rounds_to_zero_holds_nothing() {
        let now = SystemTime::now();
        let cases: [&[(&str, &str)]; 3] = [
            // A reset under a nanosecond away.
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset-after", "0.0000000001"),
            ],
            // A share of the reset under a nanosecond.
            &[
                ("x-ratelimit-limit", "99999999999999999999999999"),
                ("x-ratelimit-remaining", "99999999999999999999"),
                ("x-ratelimit-reset-after", "3"),
            ],
            &[
                ("ratelimit", r#""d";r=99999999999999;t=1"#),
                ("ratelimit-policy", r#""d";q=999999999999999;w=1"#),
            ],
        ];
        for case in cases {
            assert_eq!(rate_limit_budget(&headers(case), now), None, "{case:?}");
        }
        // A zero share of one policy leaves the others to decide.
        let map = headers(&[
            ("ratelimit", r#""a";r=99999999999999;t=1, "b";r=0;t=3"#),
            ("ratelimit-policy", r#""a";q=999999999999999;w=1"#),
        ]);
        assert_eq!(
            rate_limit_budget(&map, now),
            Some(Budget::Spent(Duration::from_secs(3)))
        );
    }

    proptest! {
        #[test]
        fn well_formed_fields_never_hold_past_their_reset(
            r in -1_000_000_000_000_000i64..1_000_000_000_000_000,
            t in -1_000_000_000_000_000i64..1_000_000_000_000_000,
            q in -1_000_000_000_000_000i64..1_000_000_000_000_000,
        ) {
            let map = headers(&[
                ("ratelimit", &format!(r#""p";r={r};t={t}"#)),
                ("ratelimit-policy", &format!(r#""p";q={q};w=60"#)),
            ]);
            let budget = rate_limit_budget(&map, SystemTime::now());
            if r < 0 || t <= 0 {
                prop_assert_eq!(budget, None);
            }
            if let Some(budget) = budget {
                prop_assert!(budget.hold() <= Duration::from_secs(t.unsigned_abs()));
                prop_assert_eq!(matches!(budget, Budget::Spent(_)), r == 0);
            }
        }

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
                ("ratelimit-policy", ietf.as_str()),
                ("x-ratelimit-limit", remaining.as_str()),
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

//! `Retry-After` (RFC 9110 §10.2.3): how long an upstream asked to be left alone.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode, header};

/// The delay a response's `Retry-After` header asks for, measured from
/// `now`, or `None` when there is no usable one.
///
/// Both forms are read: delay-seconds (`Retry-After: 120`) and an
/// HTTP-date (`Retry-After: Fri, 31 Dec 2027 23:59:59 GMT`, parsed with
/// [`httpdate`]). A date is measured against the response's own `Date`
/// header when it has a valid one, so a local clock that is off does not
/// distort the delay; otherwise against `now`. A date in the past, a
/// negative or fractional number, or garbage yields `None`; an absurdly
/// large number saturates. Capping the delay is the limiter's job
/// ([`Pacing::max_penalty`](crate::Pacing::max_penalty)).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderMap;
/// use redislimit::http::retry_after;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", "2".parse().unwrap());
/// assert_eq!(retry_after(&headers, SystemTime::now()), Some(Duration::from_secs(2)));
///
/// headers.insert("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
/// headers.insert("date", "Wed, 21 Oct 2015 07:27:00 GMT".parse().unwrap());
/// assert_eq!(retry_after(&headers, SystemTime::now()), Some(Duration::from_secs(60)));
/// ```
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: delay-seconds. Too many digits to fit saturates.
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return (seconds > 0).then(|| Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let reference = response_date(headers).unwrap_or(now);
    at.duration_since(reference).ok().filter(|d| !d.is_zero())
}

/// The response's own `Date` header, when it has a valid one: what delays
/// given as instants are measured against, so a local clock that is off
/// does not distort them.
pub(super) fn response_date(headers: &HeaderMap) -> Option<SystemTime> {
    let date = headers.get(header::DATE)?.to_str().ok()?;
    httpdate::parse_http_date(date.trim()).ok()
}

/// The penalty a response asks for. For `429 Too Many Requests` and
/// `503 Service Unavailable`: its [`retry_after`] delay, which takes
/// precedence; else the hold its rate limit headers ask for
/// ([`rate_limit_hold`](super::rate_limit_hold)); else `default`. For any
/// other status: the rate limit headers' hold (a `200` may say the budget
/// is spent), or nothing.
pub fn penalty(
    status: StatusCode,
    headers: &HeaderMap,
    default: Option<Duration>,
) -> Option<Duration> {
    penalty_from(status, headers, default, true)
}

/// [`penalty`], reading the rate limit headers only when `rate_limits`.
pub(crate) fn penalty_from(
    status: StatusCode,
    headers: &HeaderMap,
    default: Option<Duration>,
    rate_limits: bool,
) -> Option<Duration> {
    let now = SystemTime::now();
    let budget = || {
        rate_limits
            .then(|| super::rate_limit_hold(headers, now))
            .flatten()
    };
    match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
            retry_after(headers, now).or_else(budget).or(default)
        }
        _ => budget(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn at(date: &str) -> SystemTime {
        httpdate::parse_http_date(date).unwrap()
    }

    #[test]
    fn delay_seconds() {
        let now = SystemTime::now();
        assert_eq!(
            retry_after(&headers(&[("retry-after", "2")]), now),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", " 120 ")]), now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "0")]), now), None);
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "99999999999999999999999999")]),
                now
            ),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn http_date_against_the_response_date() {
        let hs = headers(&[
            ("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("date", "Sun, 06 Nov 1994 08:49:07 GMT"),
        ]);
        // The local clock is decades off; the response's own Date is not.
        assert_eq!(
            retry_after(&hs, SystemTime::now()),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn http_date_against_now_without_a_date_header() {
        let hs = headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")]);
        assert_eq!(
            retry_after(&hs, at("Sun, 06 Nov 1994 08:48:37 GMT")),
            Some(Duration::from_secs(60))
        );
        // A date in the past asks for nothing.
        assert_eq!(retry_after(&hs, at("Sun, 06 Nov 1994 08:50:00 GMT")), None);
        // A garbage Date header falls back to now.
        let hs = headers(&[
            ("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("date", "yesterday"),
        ]);
        assert_eq!(
            retry_after(&hs, at("Sun, 06 Nov 1994 08:49:27 GMT")),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn garbage_is_ignored() {
        let now = SystemTime::now();
        for value in [
            "-5",
            "1.5",
            "soon",
            "",
            "  ",
            "2 seconds",
            "0x10",
            "Sun, 06 Nov 1994",
        ] {
            assert_eq!(
                retry_after(&headers(&[("retry-after", value)]), now),
                None,
                "{value:?}"
            );
        }
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
        let mut non_utf8 = HeaderMap::new();
        non_utf8.insert(
            header::RETRY_AFTER,
            http::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        );
        assert_eq!(retry_after(&non_utf8, now), None);
    }

    #[test]
    fn penalty_applies_to_429_and_503_only() {
        let hs = headers(&[("retry-after", "3")]);
        let three = Some(Duration::from_secs(3));
        let dflt = Some(Duration::from_secs(1));
        assert_eq!(penalty(StatusCode::TOO_MANY_REQUESTS, &hs, None), three);
        assert_eq!(penalty(StatusCode::SERVICE_UNAVAILABLE, &hs, None), three);
        assert_eq!(penalty(StatusCode::OK, &hs, dflt), None);
        assert_eq!(penalty(StatusCode::INTERNAL_SERVER_ERROR, &hs, dflt), None);
        assert_eq!(
            penalty(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), dflt),
            dflt
        );
        assert_eq!(
            penalty(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), None),
            None
        );
    }

    proptest! {
        /// No header value, however hostile, panics.
        #[test]
        fn never_panics(value in proptest::collection::vec(any::<u8>(), 0..64), date in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut hs = HeaderMap::new();
            if let Ok(v) = http::HeaderValue::from_bytes(&value) {
                hs.insert(header::RETRY_AFTER, v);
            }
            if let Ok(v) = http::HeaderValue::from_bytes(&date) {
                hs.insert(header::DATE, v);
            }
            let _ = retry_after(&hs, SystemTime::now());
            let _ = penalty(StatusCode::TOO_MANY_REQUESTS, &hs, None);
        }
    }
}

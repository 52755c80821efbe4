//! The per-host summary printed at the end of a crawl.

use std::collections::BTreeMap;
use std::fmt;

use super::Fetched;

/// What one host saw of a crawl.
#[derive(Debug, Clone, PartialEq)]
pub struct HostSummary {
    /// The host key.
    pub host: String,
    /// Requests made.
    pub requests: usize,
    /// Requests that ended without a complete response.
    pub errors: usize,
    /// Responses per status code.
    pub statuses: BTreeMap<u16, usize>,
    /// Mean time a request waited for its turn, in milliseconds.
    pub mean_wait_ms: f64,
    /// Requests per second between the first and the last send, counting
    /// only requests that were sent.
    pub rate: Option<f64>,
    /// What the host asked for, per cause (`retry-after`, `budget-spent`,
    /// `budget-low`, `default-penalty`, `backoff`, `recovering`): how many
    /// responses held it for that.
    pub asked: BTreeMap<String, usize>,
    /// The longest hold a response gave the host, in milliseconds.
    pub longest_hold_ms: Option<u64>,
}

/// One summary per host, in host order, of the URLs that were tried.
pub fn summarize(fetched: &[Fetched]) -> Vec<HostSummary> {
    let mut hosts: BTreeMap<&str, Vec<&Fetched>> = BTreeMap::new();
    // URLs robots.txt ruled out were never tried.
    for f in fetched.iter().filter(|f| f.skipped.is_none()) {
        hosts.entry(&f.host).or_default().push(f);
    }
    hosts
        .into_iter()
        .map(|(host, reqs)| {
            let mut statuses = BTreeMap::new();
            for status in reqs.iter().filter_map(|f| f.status) {
                *statuses.entry(status).or_default() += 1;
            }
            let mut asked = BTreeMap::new();
            for cause in reqs.iter().filter_map(|f| f.asked.as_ref()) {
                *asked.entry(cause.clone()).or_default() += 1;
            }
            // Requests that never left (a blown --max-wait) are no part
            // of the rate the host saw.
            let sent: Vec<u64> = reqs.iter().filter(|f| f.sent).map(|f| f.start_ms).collect();
            let first = sent.iter().copied().min().unwrap_or(0);
            let last = sent.iter().copied().max().unwrap_or(0);
            let rate = (sent.len() > 1 && last > first)
                .then(|| (sent.len() - 1) as f64 * 1000.0 / (last - first) as f64);
            HostSummary {
                host: host.to_owned(),
                requests: reqs.len(),
                errors: reqs.iter().filter(|f| f.error.is_some()).count(),
                statuses,
                mean_wait_ms: reqs.iter().map(|f| f.waited_ms as f64).sum::<f64>()
                    / reqs.len() as f64,
                rate,
                asked,
                longest_hold_ms: reqs.iter().filter_map(|f| f.hold_ms).max(),
            }
        })
        .collect()
}

impl fmt::Display for HostSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rate = self
            .rate
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}/s"));
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}x{n}"))
            .collect();
        write!(
            f,
            "{:<28} {:>8} {:>10} {:>10.0}ms {:>10}  {}",
            self.host,
            self.requests,
            self.errors,
            self.mean_wait_ms,
            rate,
            statuses.join(" ")
        )?;
        if !self.asked.is_empty() {
            let asked: Vec<String> = self
                .asked
                .iter()
                .map(|(cause, n)| format!("{cause} x{n}"))
                .collect();
            write!(f, "  asked: {}", asked.join(", "))?;
            if let Some(longest) = self.longest_hold_ms {
                write!(f, " (longest hold {:.1}s)", longest as f64 / 1000.0)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(mut f: Fetched, cause: &str, hold_ms: u64) -> Fetched {
        f.asked = Some(cause.into());
        f.hold_ms = Some(hold_ms);
        f
    }

    fn fetched(host: &str, status: Option<u16>, start_ms: u64, waited_ms: u64) -> Fetched {
        Fetched {
            url: format!("http://{host}/"),
            host: host.into(),
            status,
            error: status.is_none().then(|| "refused".into()),
            sent: status.is_some(),
            start_ms,
            end_ms: start_ms + 10,
            waited_ms,
            retry_after_ms: None,
            hold_ms: None,
            asked: None,
            redirects: Vec::new(),
            final_url: None,
            skipped: None,
        }
    }

    #[test]
    fn per_host_counts_waits_and_rate() {
        let all = [
            fetched("a.test", Some(200), 1000, 0),
            held(
                fetched("a.test", Some(429), 1500, 100),
                "budget-spent",
                2000,
            ),
            fetched("a.test", Some(200), 3000, 200),
            fetched("b.test", None, 1000, 0),
            // Never sent: counted as an error, not in the rate.
            fetched("a.test", None, 1100, 900),
        ];
        let s = summarize(&all);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].requests, s[0].errors), (4, 1));
        assert_eq!(s[0].statuses, BTreeMap::from([(200, 2), (429, 1)]));
        assert_eq!(s[0].mean_wait_ms, 300.0);
        assert_eq!(s[0].rate, Some(1.0));
        assert_eq!((s[1].errors, s[1].rate), (1, None));
        assert!(s[0].to_string().contains("200x2 429x1"));
        assert_eq!(s[0].asked, BTreeMap::from([("budget-spent".into(), 1)]));
        assert!(
            s[0].to_string()
                .contains("asked: budget-spent x1 (longest hold 2.0s)"),
            "{}",
            s[0]
        );
        assert!(s[1].asked.is_empty());
    }
}

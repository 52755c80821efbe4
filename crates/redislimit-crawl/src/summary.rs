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
    let mut tally = Tally::default();
    for f in fetched {
        tally.add(f);
    }
    tally.hosts()
}

/// What the summary needs of each URL that ended, added as they end: a
/// crawl of millions of URLs does not keep them.
#[derive(Debug, Default)]
pub struct Tally {
    hosts: BTreeMap<String, HostTally>,
    ended: usize,
    sent: usize,
    skipped: usize,
    not_started: usize,
    unanswered: usize,
}

/// One host's part of a [`Tally`].
#[derive(Debug, Default)]
struct HostTally {
    requests: usize,
    errors: usize,
    statuses: BTreeMap<u16, usize>,
    waited_ms: f64,
    /// How many were sent, the first and last send (ms since the epoch).
    sent: usize,
    first_ms: u64,
    last_ms: u64,
    asked: BTreeMap<String, usize>,
    longest_hold_ms: Option<u64>,
}

impl Tally {
    /// Counts `f`.
    pub fn add(&mut self, f: &Fetched) {
        // The crawl stopped before their turn: they did not end.
        if f.not_started {
            self.not_started += 1;
            return;
        }
        self.ended += 1;
        self.sent += usize::from(f.sent);
        // URLs robots.txt ruled out were never tried.
        if f.skipped.is_some() {
            self.skipped += 1;
            return;
        }
        let host = match self.hosts.get_mut(&f.host) {
            Some(host) => host,
            None => self.hosts.entry(f.host.clone()).or_default(),
        };
        host.requests += 1;
        host.errors += usize::from(f.error.is_some());
        self.unanswered += usize::from(f.error.is_some() && f.status.is_none());
        if let Some(status) = f.status {
            *host.statuses.entry(status).or_default() += 1;
        }
        host.waited_ms += f.waited_ms as f64;
        // Requests that never left (a blown --max-wait) are no part of
        // the rate the host saw.
        if f.sent {
            if host.sent == 0 || f.start_ms < host.first_ms {
                host.first_ms = f.start_ms;
            }
            host.last_ms = host.last_ms.max(f.start_ms);
            host.sent += 1;
        }
        if let Some(cause) = &f.asked {
            *host.asked.entry(cause.clone()).or_default() += 1;
        }
        host.longest_hold_ms = host.longest_hold_ms.max(f.hold_ms);
    }

    /// URLs that ended (tried, or ruled out by robots.txt; not those the
    /// crawl was stopped before).
    pub fn ended(&self) -> usize {
        self.ended
    }

    /// Requests that were sent.
    pub fn sent(&self) -> usize {
        self.sent
    }

    /// URLs robots.txt ruled out.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// URLs the crawl was stopped before (reported as `not_started`).
    pub fn not_started(&self) -> usize {
        self.not_started
    }

    /// URLs that failed without an HTTP response: no connection, a
    /// timeout before the response, a blown `--max-wait`, an abort.
    pub fn unanswered(&self) -> usize {
        self.unanswered
    }

    /// One summary per host, in host order.
    pub fn hosts(&self) -> Vec<HostSummary> {
        self.hosts
            .iter()
            .map(|(host, t)| HostSummary {
                host: host.clone(),
                requests: t.requests,
                errors: t.errors,
                statuses: t.statuses.clone(),
                mean_wait_ms: t.waited_ms / t.requests as f64,
                rate: (t.sent > 1 && t.last_ms > t.first_ms)
                    .then(|| (t.sent - 1) as f64 * 1000.0 / (t.last_ms - t.first_ms) as f64),
                asked: t.asked.clone(),
                longest_hold_ms: t.longest_hold_ms,
            })
            .collect()
    }
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
            not_started: false,
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

    /// URLs the crawl stopped before are not counted as ended, and those
    /// without an HTTP response are counted apart (the exit code reads
    /// them); an error after a status had a response.
    #[test]
    fn not_started_and_unanswered_urls_are_counted_apart() {
        let mut tally = Tally::default();
        let mut unstarted = fetched("a.test", None, 1000, 0);
        unstarted.error = None;
        unstarted.not_started = true;
        let mut cut = fetched("a.test", Some(200), 1000, 0);
        cut.error = Some("body cut short".into());
        for f in [
            fetched("a.test", Some(200), 1000, 0),
            fetched("a.test", None, 1100, 0),
            cut,
            unstarted,
        ] {
            tally.add(&f);
        }
        assert_eq!(tally.ended(), 3);
        assert_eq!(tally.not_started(), 1);
        assert_eq!(tally.unanswered(), 1);
        assert_eq!(tally.hosts()[0].requests, 3);
    }
}

//! [`MetricsHooks`]: the limiters' hooks recorded through the `metrics`
//! crate facade (feature `metrics`).

use std::time::Duration;

use crate::{Error, Hooks, HostKey, Op, WaitOutcome};

/// [`Hooks`] that record every decision through the [`metrics`] facade, so
/// whichever exporter the program installs (Prometheus, StatsD,
/// OpenTelemetry) receives them. Names follow Prometheus conventions
/// (`_total` counters, base units):
///
/// | metric | kind | labels | what |
/// |---|---|---|---|
/// | `redislimit_acquires_total` | counter | `engine`, `outcome` | acquires that ended: `acquired` (an admission), `canceled`, `budget_exceeded`, `queue_full` (refused by `max_queued`) |
/// | `redislimit_wait_seconds` | histogram | `engine`, `outcome` | how long each of those waited |
/// | `redislimit_holds_total` | counter | `cause` | hosts held back after a response: `retry-after`, `budget-spent`, `budget-low`, `default-penalty`, `backoff`, `recovering` |
/// | `redislimit_hold_seconds` | histogram | `cause` | how long each of those holds is |
/// | `redislimit_errors_total` | counter | `op` | failures of the shared backend (Redis), per operation: `acquire`, `release`, `renew`, `penalize`, `ping`, `close` |
/// | `redislimit_repairs_total` | counter | | garbage found in Redis state and replaced |
/// | `redislimit_leases_lost_total` | counter | | leases that lapsed before their renewal |
/// | `redislimit_late_admissions_total` | counter | `outcome` | admissions that reached their caller later than `max_lateness`: `handed_back` (asked for again) or `sent` (within the room kept for this process's lateness) |
/// | `redislimit_fallback_active` | gauge | | 1 while a fallback limiter paces in process, 0 otherwise (0 from the start) |
/// | `redislimit_policy_version` | gauge | | the version of the policies published to the scope that a `LiveLimiter` paces with (0: none published) |
///
/// [`new`](Self::new) describes every metric to the recorder installed at
/// that moment (the `# HELP` lines of a Prometheus page), with its unit,
/// and registers the gauge (0 until set): build the hooks after installing
/// the exporter.
/// The `_seconds` histograms are histograms in the facade; whether an
/// exporter keeps them as buckets is its choice. Prometheus's keeps
/// quantiles (a summary, which cannot be added up across replicas) unless
/// told the buckets: give it [`BUCKETS`](Self::BUCKETS), as the crawl does:
///
/// ```no_run
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
/// use redislimit::MetricsHooks;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// PrometheusBuilder::new()
///     .set_buckets_for_metric(Matcher::Prefix("redislimit_".into()), &MetricsHooks::BUCKETS)?
///     .install()?;
/// let hooks = MetricsHooks::new();
/// # drop(hooks);
/// # Ok(())
/// # }
/// ```
///
/// Hosts are not a label unless [`with_host_label`](Self::with_host_label)
/// asks for it (`host`, the key, on the acquire and hold series): a crawl
/// of a million hosts would otherwise make a million series.
///
/// ```
/// use std::sync::Arc;
/// use redislimit::{DomainLimiter, MetricsHooks, Pacing};
///
/// let limiter = DomainLimiter::with_hooks(Pacing::default(), Arc::new(MetricsHooks::new()));
/// # drop(limiter);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MetricsHooks {
    host_label: bool,
}

impl Default for MetricsHooks {
    /// As [`new`](MetricsHooks::new).
    fn default() -> Self {
        describe();
        Self { host_label: false }
    }
}

impl MetricsHooks {
    /// The bucket bounds, in seconds, for the `_seconds` histograms: from a
    /// millisecond (an admission at once) to five minutes (a long
    /// `Retry-After`).
    pub const BUCKETS: [f64; 14] = [
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 300.0,
    ];

    /// Hooks without a host label. Describes every metric to the recorder
    /// installed now, and registers `redislimit_fallback_active` (0 until a
    /// fallback sets it).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a `host` label (the key) to the acquire and hold series. Only
    /// for a bounded set of hosts: each host is a series.
    pub fn with_host_label(mut self) -> Self {
        self.host_label = true;
        self
    }
}

/// Describes every metric (name, unit, what it counts) to the installed
/// recorder, and registers the gauge so it is present from the start.
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "redislimit_acquires_total",
        Unit::Count,
        "Acquires that ended, by engine and outcome (acquired, canceled, budget_exceeded, queue_full)"
    );
    describe_histogram!(
        "redislimit_wait_seconds",
        Unit::Seconds,
        "How long each acquire waited, by engine and outcome"
    );
    describe_counter!(
        "redislimit_holds_total",
        Unit::Count,
        "Hosts held back after a response, by cause (retry-after, budget-spent, budget-low, default-penalty, backoff, recovering)"
    );
    describe_histogram!(
        "redislimit_hold_seconds",
        Unit::Seconds,
        "How long each hold of a host is, by cause"
    );
    describe_counter!(
        "redislimit_errors_total",
        Unit::Count,
        "Failures of the shared backend (Redis), by operation"
    );
    describe_counter!(
        "redislimit_repairs_total",
        Unit::Count,
        "Garbage found in Redis state and replaced"
    );
    describe_counter!(
        "redislimit_leases_lost_total",
        Unit::Count,
        "Leases that lapsed before their renewal"
    );
    describe_counter!(
        "redislimit_late_admissions_total",
        Unit::Count,
        "Admissions that reached their caller later than max_lateness, by outcome (handed_back, sent)"
    );
    describe_gauge!(
        "redislimit_fallback_active",
        Unit::Count,
        "1 while a fallback limiter paces in process, 0 otherwise"
    );
    describe_gauge!(
        "redislimit_policy_version",
        Unit::Count,
        "The version of the published policies a live limiter paces with (0: none published)"
    );
    // Registered, so it is on the page from the start (at 0), without
    // setting it: hooks built while a fallback is active leave it at 1.
    let _ = metrics::gauge!("redislimit_fallback_active");
}

impl Hooks for MetricsHooks {
    fn on_host_wait(&self, engine: &str, host: &HostKey, outcome: WaitOutcome, waited: Duration) {
        let engine = engine.to_owned();
        let outcome = outcome.as_str();
        if self.host_label {
            let host = host.to_string();
            metrics::counter!("redislimit_acquires_total", "engine" => engine.clone(), "outcome" => outcome, "host" => host.clone())
                .increment(1);
            metrics::histogram!("redislimit_wait_seconds", "engine" => engine, "outcome" => outcome, "host" => host)
                .record(waited.as_secs_f64());
        } else {
            metrics::counter!("redislimit_acquires_total", "engine" => engine.clone(), "outcome" => outcome)
                .increment(1);
            metrics::histogram!("redislimit_wait_seconds", "engine" => engine, "outcome" => outcome)
                .record(waited.as_secs_f64());
        }
    }

    fn on_hold(&self, host: &HostKey, cause: &str, hold: Duration) {
        let cause = cause.to_owned();
        if self.host_label {
            let host = host.to_string();
            metrics::counter!("redislimit_holds_total", "cause" => cause.clone(), "host" => host.clone())
                .increment(1);
            metrics::histogram!("redislimit_hold_seconds", "cause" => cause, "host" => host)
                .record(hold.as_secs_f64());
        } else {
            metrics::counter!("redislimit_holds_total", "cause" => cause.clone()).increment(1);
            metrics::histogram!("redislimit_hold_seconds", "cause" => cause)
                .record(hold.as_secs_f64());
        }
    }

    fn on_error(&self, op: Op, error: &Error) {
        let _ = error;
        metrics::counter!("redislimit_errors_total", "op" => op.as_str()).increment(1);
    }

    fn on_repair(&self, key: &str) {
        let _ = key;
        metrics::counter!("redislimit_repairs_total").increment(1);
    }

    fn on_lease_lost(&self, key: &str) {
        let _ = key;
        metrics::counter!("redislimit_leases_lost_total").increment(1);
    }

    fn on_late_admission(&self, key: &str, late: Duration, handed_back: bool) {
        let _ = (key, late);
        let outcome = if handed_back { "handed_back" } else { "sent" };
        metrics::counter!("redislimit_late_admissions_total", "outcome" => outcome).increment(1);
    }

    fn on_fallback(&self, active: bool) {
        metrics::gauge!("redislimit_fallback_active").set(if active { 1.0 } else { 0.0 });
    }

    fn on_policy_version(&self, version: u64) {
        metrics::gauge!("redislimit_policy_version").set(version as f64);
    }
}

//! `--policy FILE`: per-host rules for the crawl, in TOML.
//!
//! ```toml
//! # Optional: what hosts no rule matches get. Without it the flags
//! # (--min-delay, --max-concurrent, ...) form the default; with it, the
//! # settings it names replace those flags.
//! [default]
//! min_delay = "1s"
//!
//! # An exact host: an API allowing 5,000 requests an hour.
//! [[rule]]
//! match = "api.example.com"
//! min_delay = "0ms"
//! quota = 5000
//! window = "1h"
//!
//! # `*.` and a suffix: every host below it (not the suffix itself).
//! [[rule]]
//! match = "*.cdn.example.com"
//! min_delay = "100ms"
//! cluster_concurrency = 4
//! ```
//!
//! A rule starts from the default and changes the settings it names
//! (`quota = 0` switches a quota off, window included):
//! `min_delay`, `max_concurrent`, `cluster_concurrency` (with Redis only;
//! 0 serializes), `quota`, `window`, `jitter`, `max_penalty`,
//! `max_bytes_per_sec`; durations are strings like `"250ms"`, `"2s"`,
//! `"1h"`, byte rates a number of bytes or a string like `"200KiB"`. The most specific match wins (an
//! exact host over any suffix, a longer suffix over a shorter). An unknown
//! setting, a bad duration, a bad pattern or a pattern given twice is
//! refused, naming the rule.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use redislimit::{Pacing, Policies, Rule};
use serde::Deserialize;

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    default: Option<Table>,
    #[serde(default)]
    rule: Vec<Table>,
}

/// `[default]` or one `[[rule]]`: the settings it names.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    #[serde(rename = "match")]
    pattern: Option<String>,
    min_delay: Option<String>,
    max_concurrent: Option<u32>,
    cluster_concurrency: Option<u32>,
    quota: Option<u32>,
    window: Option<String>,
    jitter: Option<String>,
    max_penalty: Option<String>,
    max_bytes_per_sec: Option<ByteCount>,
}

/// A byte count as written: a number of bytes, or a string with a unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum ByteCount {
    Bytes(u64),
    Text(String),
}

/// Every setting a host's pacing has, as the flags give them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `--min-delay`.
    pub min_delay: Duration,
    /// `--max-concurrent`.
    pub max_concurrent: u32,
    /// `--cluster-concurrency`.
    pub cluster_concurrency: u32,
    /// `--quota`.
    pub quota: u32,
    /// `--window`.
    pub window: Option<Duration>,
    /// `--jitter`.
    pub jitter: Duration,
    /// `--max-penalty`.
    pub max_penalty: Duration,
    /// `--max-bytes-per-sec` (0: off).
    pub max_bytes_per_sec: u64,
}

impl Settings {
    /// The pacing these settings describe.
    pub fn pacing(&self) -> Result<Pacing, redislimit::ConfigError> {
        let mut pacing = Pacing::builder()
            .max_concurrent(self.max_concurrent)
            .min_delay(self.min_delay)
            .quota(self.quota)
            .jitter(self.jitter)
            .max_penalty(self.max_penalty)
            .max_bytes_per_sec(self.max_bytes_per_sec);
        if let Some(window) = self.window {
            pacing = pacing.window(window);
        }
        pacing.build()
    }

    /// These settings with those `table` names.
    fn with(&self, table: &Table) -> Result<Self, String> {
        let duration = |v: &Option<String>, field: &str| {
            v.as_deref()
                .map(|text| parse_duration(text).map_err(|e| format!("{field}: {e}")))
                .transpose()
        };
        Ok(Self {
            min_delay: duration(&table.min_delay, "min_delay")?.unwrap_or(self.min_delay),
            max_concurrent: table.max_concurrent.unwrap_or(self.max_concurrent),
            cluster_concurrency: table
                .cluster_concurrency
                .unwrap_or(self.cluster_concurrency),
            quota: table.quota.unwrap_or(self.quota),
            // `quota = 0` without a window switches the quota off, the
            // default's window with it.
            window: match (table.quota, duration(&table.window, "window")?) {
                (Some(0), None) => None,
                (_, window) => window.or(self.window),
            },
            jitter: duration(&table.jitter, "jitter")?.unwrap_or(self.jitter),
            max_penalty: duration(&table.max_penalty, "max_penalty")?.unwrap_or(self.max_penalty),
            max_bytes_per_sec: match &table.max_bytes_per_sec {
                None => self.max_bytes_per_sec,
                Some(ByteCount::Bytes(n)) => *n,
                Some(ByteCount::Text(text)) => {
                    parse_bytes(text).map_err(|e| format!("max_bytes_per_sec: {e}"))?
                }
            },
        })
    }
}

/// The default settings and the policies of the file at `path`, on top of
/// `flags`.
pub fn load(path: &Path, flags: &Settings) -> anyhow::Result<(Settings, Policies)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the policy file {}", path.display()))?;
    parse(&text, flags).with_context(|| format!("in the policy file {}", path.display()))
}

/// [`load`] from the file's text.
pub fn parse(text: &str, flags: &Settings) -> anyhow::Result<(Settings, Policies)> {
    let file: File = toml::from_str(text)?;
    let default = match &file.default {
        Some(table) => {
            if table.pattern.is_some() {
                bail!("[default] takes no `match`: it is for the hosts no rule matches");
            }
            flags
                .with(table)
                .map_err(|e| anyhow::anyhow!("[default]: {e}"))?
        }
        None => flags.clone(),
    };
    let mut policies = Policies::new(
        default
            .pacing()
            .map_err(|e| anyhow::anyhow!("[default]: {e}"))?,
    );
    for (n, table) in file.rule.iter().enumerate() {
        let name = match &table.pattern {
            Some(pattern) => format!("rule {} ({pattern:?})", n + 1),
            None => bail!("rule {} has no `match`", n + 1),
        };
        let settings = default
            .with(table)
            .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        let pacing = settings
            .pacing()
            .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        let mut rule = Rule::new(table.pattern.clone().unwrap_or_default(), pacing);
        if let Some(cap) = table.cluster_concurrency {
            rule = rule.with_cluster_concurrency(cap);
        }
        policies = policies
            .with_rule(rule)
            .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    }
    Ok((default, policies))
}

/// Parses `250ms`, `2s`, `1m30s`, ...
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 250ms or 2s: {e}"))
}

/// Parses a byte count: `204800`, `200KiB`, `1.5MiB`, `500kB`, `2MB`
/// (`KiB`/`MiB`/`GiB` are powers of 1024, `kB`/`MB`/`GB` of 1000; `K`,
/// `M` and `G` alone count as the binary units).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "K" | "KiB" | "KiB/s" => 1024.0,
        "kB" | "kB/s" | "KB" | "KB/s" => 1e3,
        "M" | "MiB" | "MiB/s" => 1024.0 * 1024.0,
        "MB" | "MB/s" => 1e6,
        "G" | "GiB" | "GiB/s" => 1024.0 * 1024.0 * 1024.0,
        "GB" | "GB/s" => 1e9,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use B, KiB, MiB, kB or MB)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count like 204800 or 200KiB"))?;
    let bytes = (value * scale).round();
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is too large"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redislimit::HostKey;

    fn flags() -> Settings {
        Settings {
            min_delay: Duration::from_millis(250),
            max_concurrent: 1,
            cluster_concurrency: 0,
            quota: 0,
            window: None,
            jitter: Duration::ZERO,
            max_penalty: Duration::from_secs(600),
            max_bytes_per_sec: 0,
        }
    }

    #[test]
    fn byte_counts_read_with_their_units() {
        for (text, bytes) in [
            ("204800", 204_800),
            ("200KiB", 204_800),
            ("200K", 204_800),
            ("1.5MiB", 1_572_864),
            ("500kB", 500_000),
            ("2MB", 2_000_000),
            (" 7 B ", 7),
        ] {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
        for bad in ["", "KiB", "fast", "3 parsecs", "1e400"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        let text = "[default]\nmax_bytes_per_sec = \"100KiB\"\n[[rule]]\nmatch = \"a.test\"\nmax_bytes_per_sec = 1000\n";
        let (default, p) = parse(text, &flags()).unwrap();
        assert_eq!(default.max_bytes_per_sec, 102_400);
        assert_eq!(p.pacing_for(&host("a.test")).max_bytes_per_sec(), 1000);
        assert_eq!(p.pacing_for(&host("b.test")).max_bytes_per_sec(), 102_400);
        let refused = parse("[default]\nmax_bytes_per_sec = \"lots\"\n", &flags()).unwrap_err();
        assert!(
            format!("{refused:#}").contains("max_bytes_per_sec"),
            "{refused:#}"
        );
    }

    #[test]
    fn a_rule_with_quota_0_switches_the_defaults_quota_off() {
        let text =
            "[default]\nquota = 10\nwindow = \"1m\"\n[[rule]]\nmatch = \"a.test\"\nquota = 0\n";
        let (_, p) = parse(text, &flags()).unwrap();
        let a = p.pacing_for(&host("a.test"));
        assert_eq!((a.quota(), a.window()), (0, Duration::ZERO));
        let b = p.pacing_for(&host("b.test"));
        assert_eq!((b.quota(), b.window()), (10, Duration::from_secs(60)));
        // A window named beside it is still one without a quota: refused.
        let text = "[[rule]]\nmatch = \"a.test\"\nquota = 0\nwindow = \"1m\"\n";
        assert!(parse(text, &flags()).is_err());
    }

    fn host(name: &str) -> HostKey {
        HostKey::parse(&format!("http://{name}/")).unwrap()
    }

    #[test]
    fn rules_start_from_the_default_and_the_default_from_the_flags() {
        let text = r#"
            [default]
            min_delay = "1s"

            [[rule]]
            match = "api.example.com"
            min_delay = "0ms"
            quota = 5000
            window = "1h"

            [[rule]]
            match = "*.cdn.example.com"
            cluster_concurrency = 4
            max_concurrent = 4
        "#;
        let (default, p) = parse(text, &flags()).unwrap();
        assert_eq!(default.min_delay, Duration::from_secs(1));
        assert_eq!(p.default_pacing().min_delay(), Duration::from_secs(1));
        let api = p.pacing_for(&host("api.example.com"));
        assert_eq!((api.min_delay(), api.quota()), (Duration::ZERO, 5000));
        assert_eq!(api.window(), Duration::from_secs(3600));
        let cdn = p.rule_for(&host("x.cdn.example.com")).unwrap();
        assert_eq!(cdn.cluster_concurrency(), Some(4));
        assert_eq!(
            cdn.pacing().min_delay(),
            Duration::from_secs(1),
            "inherited"
        );
        assert_eq!(cdn.pacing().max_concurrent(), 4);
        // Without [default], the flags are the default.
        let (default, p) = parse("[[rule]]\nmatch = \"a.test\"\n", &flags()).unwrap();
        assert_eq!(default, flags());
        assert_eq!(p.rules().len(), 1);
    }

    #[test]
    fn mistakes_are_refused_naming_the_rule() {
        let refused = |text: &str| format!("{:#}", parse(text, &flags()).unwrap_err());
        let bad = [
            ("[[rule]]\nmatch = \"a.*.test\"\n", "rule 1 (\"a.*.test\")"),
            (
                "[[rule]]\nmatch = \"a.test\"\n[[rule]]\nmatch = \"a.test\"\n",
                "rule 2",
            ),
            (
                "[[rule]]\nmatch = \"a.test\"\nmin_delay = \"soon\"\n",
                "min_delay",
            ),
            ("[[rule]]\nmatch = \"a.test\"\nquota = 5\n", "window"),
            ("[[rule]]\nmin_delay = \"1s\"\n", "no `match`"),
            ("[[rule]]\nmatch = \"a.test\"\nspeed = 3\n", "speed"),
            ("[default]\nmatch = \"a.test\"\n", "[default]"),
            ("[default]\nmax_concurrent = 0\n", "max_concurrent"),
            ("not toml", "expected"),
        ];
        for (text, says) in bad {
            let message = refused(text);
            assert!(message.contains(says), "{text:?} said {message:?}");
        }
    }
}

//! Policies as text, for publishing them to a scope in Redis (see
//! `RedisLimiter::publish_policies`): every setting of every policy, so
//! that a replica reading the text back paces exactly as the publisher
//! meant. What cannot travel stays with each replica: the resolver of
//! [`KeyBy::Ip`].
//!
//! ```text
//! redislimit-policies 1
//! key_by host
//! default max_concurrent=1 min_delay_us=2000000 spacing=sends-and-completions quota=0 ...
//! rule api.example.com cluster_concurrency=4 max_concurrent=1 min_delay_us=0 ...
//! ```
//!
//! Reading is strict: an unknown line, field or value is refused (a
//! replica that does not know a setting must not pace without it), and
//! every pacing goes through [`PacingBuilder::build`](crate::pacing::PacingBuilder::build)
//! and every rule through [`Policies::with_rule`], as if given in code.

use std::fmt::Write as _;
use std::time::Duration;

use super::{KeyBy, Policies, Rule};
use crate::pacing::Spacing;
use crate::{ConfigError, Pacing};

/// The first line of the text, naming its format.
const HEADER: &str = "redislimit-policies 1";

impl Policies {
    /// These policies as text (see the module's documentation).
    pub(crate) fn to_record(&self) -> String {
        let mut text = format!("{HEADER}\nkey_by {}\n", self.key_by().as_str());
        text.push_str("default");
        write_pacing(&mut text, self.default_pacing());
        text.push('\n');
        for rule in self.rules() {
            let _ = write!(text, "rule {}", rule.pattern());
            if let Some(n) = rule.cluster_concurrency() {
                let _ = write!(text, " cluster_concurrency={n}");
            }
            write_pacing(&mut text, rule.pacing());
            text.push('\n');
        }
        text
    }

    /// These policies keyed through `other`'s addresses (its resolver, and
    /// what it found) when both key by [`KeyBy::Ip`]: the resolver does
    /// not travel with the text.
    pub(crate) fn with_addresses_of(self, other: &Policies) -> Self {
        if self.key_by() != KeyBy::Ip || other.key_by() != KeyBy::Ip {
            return self;
        }
        let mut table = std::sync::Arc::unwrap_or_clone(self.table);
        table.addresses.clone_from(&other.table.addresses);
        Self {
            table: std::sync::Arc::new(table),
        }
    }

    /// Policies read back from [`to_record`](Self::to_record)'s text, or
    /// the reason it cannot be read.
    pub(crate) fn from_record(text: &str) -> Result<Self, ConfigError> {
        let bad = |reason: String| ConfigError::InvalidPublished { reason };
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        if lines.next().map(str::trim) != Some(HEADER) {
            return Err(bad(format!("it does not start with {HEADER:?}")));
        }
        let mut key_by = None;
        let mut default = None;
        let mut rules = Vec::new();
        for line in lines {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("key_by") => {
                    let value = words.next().unwrap_or_default();
                    key_by = Some(
                        value
                            .parse::<KeyBy>()
                            .map_err(|_| bad(format!("unknown key_by {value:?}")))?,
                    );
                }
                Some("default") => {
                    let (pacing, cap) = read_pacing(words).map_err(bad)?;
                    if cap.is_some() {
                        return Err(bad("the default has no cluster_concurrency".into()));
                    }
                    default = Some(pacing);
                }
                Some("rule") => {
                    let pattern = words
                        .next()
                        .ok_or_else(|| bad("a rule without a pattern".into()))?;
                    let (pacing, cap) = read_pacing(words).map_err(bad)?;
                    let rule = Rule::new(pattern, pacing);
                    rules.push(match cap {
                        Some(n) => rule.with_cluster_concurrency(n),
                        None => rule,
                    });
                }
                _ => return Err(bad(format!("unknown line {line:?}"))),
            }
        }
        let default = default.ok_or_else(|| bad("no default line".into()))?;
        let mut policies = Self::new(default);
        for rule in rules {
            policies = policies.with_rule(rule)?;
        }
        Ok(policies.with_key_by(key_by.unwrap_or_default()))
    }
}

fn write_pacing(text: &mut String, p: &Pacing) {
    let spacing = match p.spacing() {
        Spacing::SendsAndCompletions => "sends-and-completions",
        Spacing::Sends => "sends",
    };
    let _ = write!(
        text,
        " max_concurrent={} min_delay_us={} spacing={spacing} quota={} window_us={} \
         jitter_us={} max_penalty_us={} max_bytes_per_sec={}",
        p.max_concurrent(),
        p.min_delay().as_micros(),
        p.quota(),
        p.window().as_micros(),
        p.jitter().as_micros(),
        p.max_penalty().as_micros(),
        p.max_bytes_per_sec(),
    );
    if let Some(n) = p.max_queued() {
        let _ = write!(text, " max_queued={n}");
    }
}

/// A pacing (and a rule's `cluster_concurrency`) from `name=value` words.
fn read_pacing<'a>(words: impl Iterator<Item = &'a str>) -> Result<(Pacing, Option<u32>), String> {
    let mut b = Pacing::builder();
    let mut cap = None;
    for word in words {
        let (name, value) = word
            .split_once('=')
            .ok_or_else(|| format!("{word:?} is not name=value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{name}: {value:?} is not a whole number"))
        };
        let count =
            || u32::try_from(number()?).map_err(|_| format!("{name}: {value} is too large"));
        let micros = || number().map(Duration::from_micros);
        b = match name {
            "max_concurrent" => b.max_concurrent(count()?),
            "min_delay_us" => b.min_delay(micros()?),
            "spacing" => b.spacing(match value {
                "sends-and-completions" => Spacing::SendsAndCompletions,
                "sends" => Spacing::Sends,
                _ => return Err(format!("unknown spacing {value:?}")),
            }),
            "quota" => b.quota(count()?),
            "window_us" => b.window(micros()?),
            "jitter_us" => b.jitter(micros()?),
            "max_penalty_us" => b.max_penalty(micros()?),
            "max_bytes_per_sec" => b.max_bytes_per_sec(number()?),
            "max_queued" => b.max_queued(count()?),
            "cluster_concurrency" => {
                cap = Some(count()?);
                b
            }
            _ => return Err(format!("unknown setting {name:?}")),
        };
    }
    let pacing = b.build().map_err(|e| e.to_string())?;
    Ok((pacing, cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Policies {
        let polite = Pacing::builder()
            .min_delay(Duration::from_millis(1500))
            .jitter(Duration::from_millis(20))
            .max_bytes_per_sec(204_800)
            .build()
            .unwrap();
        let api = Pacing::builder()
            .max_concurrent(3)
            .spacing(Spacing::Sends)
            .quota(5000)
            .window(Duration::from_secs(3600))
            .max_penalty(Duration::from_secs(30))
            .max_queued(7)
            .build()
            .unwrap();
        Policies::new(polite)
            .with_rule(Rule::new("api.example.com", api).with_cluster_concurrency(4))
            .unwrap()
            .with_rule(Rule::new("*.cdn.example.com", Pacing::default()))
            .unwrap()
            .with_key_by(KeyBy::RegistrableDomain)
    }

    #[test]
    fn policies_come_back_from_their_text_as_they_were() {
        let policies = sample();
        let text = policies.to_record();
        let back = Policies::from_record(&text).unwrap();
        assert_eq!(back.default_pacing(), policies.default_pacing());
        assert_eq!(back.rules(), policies.rules());
        assert_eq!(back.key_by(), policies.key_by());
        assert_eq!(back.to_record(), text);
        let plain = Policies::default();
        assert_eq!(Policies::from_record(&plain.to_record()).unwrap(), plain);
    }

    #[test]
    fn text_that_is_not_a_policy_is_refused_with_its_reason() {
        let text = sample().to_record();
        let refused = |text: &str| match Policies::from_record(text) {
            Err(ConfigError::InvalidPublished { reason }) => reason,
            Err(other) => other.to_string(),
            Ok(p) => panic!("read {p:?} from {text:?}"),
        };
        assert!(refused("").contains("does not start"));
        assert!(refused("garbage\u{0}\nmore").contains("does not start"));
        let unknown = text.replace("max_concurrent=1 ", "max_concurrent=1 speed=9 ");
        assert!(
            refused(&unknown).contains("unknown setting \"speed\""),
            "{unknown}"
        );
        let negative = text.replace("quota=5000", "quota=-1");
        assert!(refused(&negative).contains("not a whole number"));
        let no_window = text.replace("window_us=3600000000", "window_us=0");
        assert!(
            refused(&no_window).contains("window"),
            "{}",
            refused(&no_window)
        );
        let twice = format!("{text}{}", text.lines().nth(3).unwrap());
        assert!(
            refused(&twice).contains("same pattern"),
            "{}",
            refused(&twice)
        );
        let key = text.replace("key_by domain", "key_by moon");
        assert!(refused(&key).contains("moon"));
        let no_default: String = text
            .lines()
            .filter(|l| !l.starts_with("default"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(refused(&no_default).contains("no default"));
    }
}

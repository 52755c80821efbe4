//! `RedisLimiter` configuration is refused at construction when Redis' Lua
//! could not hold it exactly or when it would break the key layout. No
//! server is needed: nothing is sent to Redis before the first acquire.
#![cfg(feature = "redis")]

use std::time::Duration;

use redislimit::pacing::Spacing;
use redislimit::{ConfigError, Pacing, RedisLimiter, RedisPool, RedisTimeouts, Tuning};

/// The longest duration (µs) the scripts take: what Redis' Lua numbers
/// (doubles) hold exactly.
const MAX_MICROS: u64 = (1 << 53) - 1;

fn pool() -> RedisPool {
    RedisPool::standalone("redis://127.0.0.1:1/", RedisTimeouts::default()).unwrap()
}

#[test]
fn values_lua_cannot_represent_exactly_are_refused() {
    let over = Duration::from_micros(MAX_MICROS + 1);
    let edge = Duration::from_micros(MAX_MICROS);
    assert!(matches!(
        RedisLimiter::builder(pool(), "domain")
            .lease_ttl(over)
            .build(),
        Err(ConfigError::OutOfRange {
            field: "lease_ttl",
            ..
        })
    ));
    assert!(
        RedisLimiter::builder(pool(), "domain")
            .lease_ttl(edge)
            .build()
            .is_ok()
    );
    assert!(matches!(
        RedisLimiter::builder(pool(), "domain")
            .tuning(Tuning::default().with_concurrency_retry(over))
            .build(),
        Err(ConfigError::OutOfRange {
            field: "concurrency_retry",
            ..
        })
    ));
    // Pacing durations are checked by the same rule before they get here.
    assert!(matches!(
        Pacing::builder().min_delay(over).build(),
        Err(ConfigError::OutOfRange {
            field: "min_delay",
            ..
        })
    ));
}

#[test]
fn settings_that_would_switch_pacing_off_are_refused() {
    assert_eq!(
        RedisLimiter::builder(pool(), "domain")
            .lease_ttl(Duration::ZERO)
            .build()
            .unwrap_err(),
        ConfigError::Zero { field: "lease_ttl" }
    );
    assert_eq!(
        RedisLimiter::builder(pool(), "domain")
            .lease_ttl(Duration::from_nanos(10))
            .build()
            .unwrap_err(),
        ConfigError::BelowResolution {
            field: "lease_ttl",
            value: Duration::from_nanos(10)
        }
    );
    assert_eq!(
        RedisLimiter::builder(pool(), "domain")
            .tuning(Tuning::default().with_concurrency_retry(Duration::ZERO))
            .build()
            .unwrap_err(),
        ConfigError::Zero {
            field: "concurrency_retry"
        }
    );
}

#[test]
fn names_that_could_steer_keys_are_refused() {
    for scope in ["", "a{b}", "two words", "ünï"] {
        assert!(
            matches!(
                RedisLimiter::builder(pool(), scope).build(),
                Err(ConfigError::InvalidName { field: "scope", .. })
            ),
            "{scope:?}"
        );
    }
    assert!(matches!(
        RedisLimiter::builder(pool(), "domain").prefix("x}").build(),
        Err(ConfigError::InvalidName {
            field: "prefix",
            ..
        })
    ));
}

#[test]
fn a_bad_redis_url_is_a_config_error() {
    assert!(matches!(
        RedisPool::standalone("not a url", RedisTimeouts::default()),
        Err(ConfigError::InvalidRedis { .. })
    ));
}

#[test]
fn the_fallback_gets_the_limiters_pacing() {
    let pacing = Pacing::builder()
        .max_concurrent(8)
        .min_delay(Duration::from_millis(250))
        .build()
        .unwrap();
    let serialized = RedisLimiter::builder(pool(), "domain")
        .pacing(pacing.clone())
        .build()
        .unwrap();
    assert_eq!(serialized.fallback_pacing().max_concurrent(), 1);
    assert_eq!(
        serialized.fallback_pacing().spacing(),
        Spacing::SendsAndCompletions
    );
    assert_eq!(serialized.fallback_pacing().min_delay(), pacing.min_delay());
    let lease = RedisLimiter::builder(pool(), "domain")
        .pacing(pacing)
        .cluster_concurrency(3)
        .build()
        .unwrap();
    assert_eq!(lease.fallback_pacing().max_concurrent(), 3);
    // Lease mode spaces sends only; a fallback that also waited after each
    // completion would slow every request while Redis is healthy.
    assert_eq!(lease.fallback_pacing().spacing(), Spacing::Sends);
}

#[test]
fn a_lease_too_short_to_renew_is_refused() {
    assert_eq!(
        RedisLimiter::builder(pool(), "domain")
            .lease_ttl(Duration::from_millis(5))
            .build()
            .unwrap_err(),
        ConfigError::TooShort {
            field: "lease_ttl",
            value: Duration::from_millis(5),
            min: RedisLimiter::MIN_LEASE_TTL
        }
    );
}

/// The rule `policies` are refused for keyed by registrable domain (and
/// alike by address, where hosts under different rules share a key too),
/// or `None` when they are accepted; and whether they are accepted keyed
/// by host, where each host is its own state.
fn refused_by_domain(policies: &redislimit::Policies) -> (Option<String>, bool) {
    use redislimit::KeyBy;
    let build =
        |p: redislimit::Policies| RedisLimiter::builder(pool(), "domain").policies(p).build();
    let refused = |by| match build(policies.clone().with_key_by(by)) {
        Err(ConfigError::InvalidRule { rule, .. }) => Some(rule),
        Err(other) => panic!("refused for another reason: {other:?}"),
        Ok(_) => None,
    };
    let by_domain = refused(KeyBy::RegistrableDomain);
    assert_eq!(by_domain, refused(KeyBy::Ip), "keyed by address");
    (by_domain, build(policies.clone()).is_ok())
}

#[test]
fn keyed_by_domain_rules_may_not_mix_serialized_and_lease_modes() {
    use redislimit::{Policies, Rule};
    let mixed = Policies::new(Pacing::default())
        .with_rule(Rule::new("api.example.com", Pacing::default()).with_cluster_concurrency(3))
        .unwrap();
    assert_eq!(
        refused_by_domain(&mixed),
        (Some("api.example.com".to_owned()), true)
    );
}

#[test]
fn keyed_by_domain_quotas_must_share_their_window() {
    use redislimit::{Policies, Rule};
    let quota = |n, secs| {
        Pacing::builder()
            .quota(n)
            .window(Duration::from_secs(secs))
            .build()
            .unwrap()
    };
    // An acquire under the minute would trim the hour's admissions away.
    let mixed = Policies::new(quota(10, 3600))
        .with_rule(Rule::new("api.example.com", quota(5, 60)))
        .unwrap();
    assert_eq!(
        refused_by_domain(&mixed),
        (Some("api.example.com".to_owned()), true)
    );
    // Other quotas in one window, and hosts without a quota, may share.
    let same = Policies::new(quota(10, 60))
        .with_rule(Rule::new("api.example.com", quota(5, 60)))
        .unwrap()
        .with_rule(Rule::new("www.example.com", Pacing::default()))
        .unwrap();
    assert_eq!(refused_by_domain(&same), (None, true));
}

#[test]
fn keyed_by_domain_rules_may_not_mix_exact_and_bucketed_quotas() {
    use redislimit::{Policies, Rule};
    let quota = |n| {
        Pacing::builder()
            .quota(n)
            .window(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    let mixed = Policies::new(quota(10))
        .with_rule(Rule::new("api.example.com", quota(5000)))
        .unwrap();
    assert_eq!(
        refused_by_domain(&mixed),
        (Some("api.example.com".to_owned()), true)
    );
    // No quota beside a large one: nothing to mix.
    let beside = Policies::new(Pacing::default())
        .with_rule(Rule::new("api.example.com", quota(5000)))
        .unwrap();
    assert_eq!(refused_by_domain(&beside), (None, true));
}

#[test]
fn booking_further_ahead_than_a_lease_lives_is_refused() {
    assert_eq!(
        RedisLimiter::builder(pool(), "domain")
            .lease_ttl(Duration::from_secs(1))
            .tuning(Tuning::default().with_book_ahead(Duration::from_secs(2)))
            .build()
            .unwrap_err(),
        ConfigError::TooLong {
            field: "book_ahead",
            value: Duration::from_secs(2),
            max: Duration::from_secs(1),
        }
    );
}

//! Live shared policies: published to a scope with a version, followed by
//! every `LiveLimiter` of it without losing a host's state; refused before
//! publishing when invalid; garbage in their key never switches pacing off;
//! the scope's agreement follows the published version; earlier versions'
//! limiters are let go once what they granted is back; the version in
//! force outlives a Redis that lost it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redislimit::{
    ConfigError, Error, KeyBy, Limiter, LiveLimiter, Pacing, Policies, RedisLimiter, Rule,
};
use redislimit_tests::RedisServer;
use redislimit_tests::keys::HostKeys;
use redislimit_tests::record::{Recorder, assert_serialized};
use redislimit_tests::resp::Reply;

use crate::agreement::assert_mismatch;
use crate::{MS, bounded, host, limiter, standalone};

const LEASE_TTL: Duration = Duration::from_millis(400);

fn replica(server: &RedisServer, min_delay: Duration) -> RedisLimiter {
    limiter(
        standalone(&server.url()),
        |p| p.min_delay(min_delay),
        |b| b.lease_ttl(LEASE_TTL),
    )
}

fn gap(min_delay: Duration) -> Policies {
    Policies::new(Pacing::builder().min_delay(min_delay).build().unwrap())
}

/// A live replica in use (holding the permit returned), then `policies`
/// published as version 1 by another replica, which is returned.
async fn in_use_then_published(
    server: &RedisServer,
    policies: Policies,
) -> (LiveLimiter, redislimit::Permit, RedisLimiter) {
    let first = replica(server, 100 * MS).live();
    let permit = bounded(5, first.acquire_host("test", host("a.test"), None))
        .await
        .unwrap();
    let publisher = replica(server, 100 * MS);
    bounded(5, publisher.publish_policies(&policies))
        .await
        .unwrap();
    (first, permit, publisher)
}

/// The published policies come back as they were, with a version that
/// grows; a live replica takes them at `refresh`, its snapshot names the
/// version, and the host's state (a penalty) is kept across the switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_policies_are_followed_with_the_hosts_state() {
    let server = RedisServer::start();
    let publisher = replica(&server, 100 * MS);
    let live = replica(&server, 100 * MS).live();
    assert_eq!(
        bounded(5, publisher.published_policies()).await.unwrap(),
        None
    );
    assert_eq!(bounded(5, live.refresh()).await.unwrap(), 0);
    assert_eq!(live.snapshot(1).policy_version, None);

    // A penalty before the switch holds after it.
    bounded(5, live.penalize_host(host("a.test"), 1500 * MS))
        .await
        .unwrap();
    let policies = gap(30 * MS)
        .with_rule(Rule::new("b.test", Pacing::default()))
        .unwrap();
    assert_eq!(
        bounded(5, publisher.publish_policies(&policies))
            .await
            .unwrap(),
        1
    );
    let (version, read) = bounded(5, publisher.published_policies())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((version, read.rules()), (1, policies.rules()));
    assert_eq!(read.default_pacing(), policies.default_pacing());

    assert_eq!(bounded(5, live.refresh()).await.unwrap(), 1);
    assert_eq!(live.version(), 1);
    assert_eq!(live.policies().default_pacing().min_delay(), 30 * MS);
    assert_eq!(live.snapshot(1).policy_version, Some(1));
    let started = Instant::now();
    let permit = bounded(5, live.acquire_host("test", host("a.test"), None))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= 1000 * MS,
        "the penalty was lost at the switch: admitted after {:?}",
        started.elapsed()
    );
    drop(permit);
    assert_eq!(
        bounded(5, publisher.publish_policies(&gap(40 * MS)))
            .await
            .unwrap(),
        2
    );
    live.close(None).await.unwrap();
}

/// A switch lets the earlier version's limiter go once nothing it granted
/// is left to land: a permit held across switches keeps its version's
/// alone, releases through it when dropped, and `close` waits for that
/// release. The live limiter does not keep every version it ever had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earlier_versions_are_let_go_once_their_permits_are_back() {
    let server = RedisServer::start();
    let publisher = replica(&server, 10 * MS);
    let live = replica(&server, 10 * MS).live();
    // How many earlier versions' limiters are alive, as its Debug says.
    let closing = |live: &LiveLimiter| -> usize {
        let text = format!("{live:?}");
        let (_, after) = text.split_once("earlier_versions_closing: ").expect(&text);
        after
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .expect(&text)
    };
    let a = host("a.test");
    let held = bounded(5, live.acquire_host("test", a.clone(), None))
        .await
        .unwrap();
    for version in 1..=3 {
        let policies = gap((10 + version) * MS);
        let published = bounded(5, publisher.publish_policies(&policies)).await;
        assert_eq!(published.unwrap(), u64::from(version));
        assert_eq!(
            bounded(5, live.refresh()).await.unwrap(),
            u64::from(version)
        );
    }
    // Versions 1 and 2 granted nothing; version 0's permit is still held.
    let mut left = closing(&live);
    for _ in 0..100 {
        if left <= 1 {
            break;
        }
        tokio::time::sleep(50 * MS).await;
        left = closing(&live);
    }
    assert_eq!(left, 1, "{live:?}");
    let gate = HostKeys::of("test", a.as_str()).gate;
    assert_ne!(server.query(&["HGET", &gate, "holder"]), Reply::Bulk(None));
    drop(held);
    bounded(10, live.close(None)).await.unwrap();
    assert_eq!(
        server.query(&["HGET", &gate, "holder"]),
        Reply::Bulk(None),
        "the permit of version 0 was not released when close returned"
    );
    for _ in 0..100 {
        if closing(&live) == 0 {
            break;
        }
        tokio::time::sleep(50 * MS).await;
    }
    assert_eq!(closing(&live), 0, "{live:?}");
}

/// Policies the publisher's builder refuses are not published; garbage in
/// their key is an error naming it, and a live replica keeps pacing with
/// the policies in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_policies_are_refused_and_garbage_switches_nothing_off() {
    let server = RedisServer::start();
    let publisher = limiter(
        standalone(&server.url()),
        |p| p.min_delay(50 * MS),
        |b| b.lease_ttl(LEASE_TTL).cluster_concurrency(2),
    );
    // Keyed by domain, a serialized rule beside a default in lease mode
    // would share one state in Redis: refused, naming the rule.
    let mixed = gap(50 * MS)
        .with_rule(Rule::new("a.example.com", Pacing::default()).with_cluster_concurrency(0))
        .unwrap()
        .with_key_by(KeyBy::RegistrableDomain);
    match bounded(5, publisher.publish_policies(&mixed)).await {
        Err(Error::InvalidConfig(ConfigError::InvalidRule { rule, .. })) => {
            assert_eq!(rule, "a.example.com");
        }
        other => panic!("published policies the builder refuses: {other:?}"),
    }
    assert_eq!(
        bounded(5, publisher.published_policies()).await.unwrap(),
        None
    );

    let live = replica(&server, 50 * MS).live();
    let keys = || server.query(&["KEYS", "*:policy"]);
    assert_eq!(
        keys().as_array().map(<[_]>::len),
        Some(0),
        "nothing was published"
    );
    bounded(5, publisher.publish_policies(&gap(20 * MS)))
        .await
        .unwrap();
    let key = keys().as_array().unwrap()[0].as_str().unwrap().to_owned();
    for garbage in [
        vec!["HSET", key.as_str(), "version", "2", "text", "not policies"],
        vec!["HSET", key.as_str(), "version", "x"],
    ] {
        server.command(&["DEL", key.as_str()]);
        server.command(&garbage);
        match bounded(5, publisher.published_policies()).await {
            Err(Error::InvalidConfig(ConfigError::InvalidPublished { .. })) => {}
            other => panic!("garbage {garbage:?} read as {other:?}"),
        }
        assert!(bounded(5, live.refresh()).await.is_err());
        assert_eq!(live.version(), 0);
    }
    server.command(&["DEL", key.as_str()]);
    server.command(&["SET", key.as_str(), "a string"]);
    assert!(bounded(5, live.refresh()).await.is_err());
    // Still pacing, with its own policies: two sends 50 ms apart.
    let recorder = Recorder::new();
    for _ in 0..2 {
        let permit = bounded(5, live.acquire_host("test", host("a.test"), None))
            .await
            .unwrap();
        let now = Instant::now();
        recorder.record("a.test", 0, now, now);
        drop(permit);
    }
    assert_serialized(&recorder.host("a.test"), 50 * MS - 2 * MS);
    // Publishing over garbage starts afresh.
    assert!(
        bounded(5, publisher.publish_policies(&gap(20 * MS)))
            .await
            .unwrap()
            >= 1
    );
    live.close(None).await.unwrap();
}

/// The agreement follows the published version: a live replica started
/// with an older file adopts the published policies at its first acquire
/// instead of being refused; a plain replica with the older settings is
/// refused, naming both; the older version never takes the record back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agreement_follows_the_published_version() {
    let server = RedisServer::start();
    let (first, _permit, publisher) = in_use_then_published(&server, gap(30 * MS)).await;
    // Within a quarter of the lease TTL (and a call), the first follows.
    tokio::time::sleep(LEASE_TTL).await;
    assert_eq!(first.version(), 1);
    let _permit = bounded(5, first.acquire_host("test", host("b.test"), None))
        .await
        .unwrap();

    // Started later with the old file, and never refreshed: its first
    // acquire adopts version 1.
    let late = Arc::new(replica(&server, 100 * MS).live());
    let _permit = bounded(5, late.acquire_host("test", host("c.test"), None))
        .await
        .unwrap();
    assert_eq!(late.version(), 1);

    // A plain replica with the old settings is refused, and its claim to
    // the record does not bring the old settings back.
    let plain = replica(&server, 100 * MS);
    assert_mismatch(plain.check_config().await, "min_delay=100ms", "policy=1");
    assert_mismatch(
        publisher.check_config().await,
        "min_delay=100ms",
        "policy=1",
    );
    let _permit = bounded(5, first.acquire_host("test", host("d.test"), None))
        .await
        .unwrap();
    first.close(None).await.unwrap();
    late.close(None).await.unwrap();
}

/// Regression: Redis restarted empty lost the published policies, while
/// the replicas in use put the scope's agreement back naming their
/// version: a live replica started then was refused (`ConfigMismatch`,
/// nothing published to switch to). Now the replicas in use put the
/// version in force back (over an older one another replica put back),
/// a replica started before that waits for it, and policies published
/// meanwhile as an older version are renumbered past it and followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_policies_outlive_a_redis_restarted_empty() {
    let server = RedisServer::start();
    let (first, _permit, publisher) = in_use_then_published(&server, gap(60 * MS)).await;
    let key = server.query(&["KEYS", "*:policy"]).as_array().unwrap()[0]
        .as_str()
        .unwrap()
        .to_owned();
    let older = server.query(&["HGET", key.as_str(), "text"]);
    let older = older.as_str().unwrap().to_owned();
    bounded(5, publisher.publish_policies(&gap(30 * MS)))
        .await
        .unwrap();
    assert_eq!(bounded(5, first.refresh()).await.unwrap(), 2);

    server.restart();
    // An older version put back first (by a replica that had not switched
    // yet): the replica in force neither follows it nor leaves it there.
    server.command(&[
        "HSET",
        key.as_str(),
        "version",
        "1",
        "text",
        older.as_str(),
        "put_back",
        "1",
    ]);
    let put_back = wait_for_version(&publisher, 2).await;
    assert_eq!(put_back.default_pacing().min_delay(), 30 * MS);
    assert_eq!(first.version(), 2);

    // A replica started now with its own file follows version 2 (at once,
    // or once the replica in use has put the agreement back over its own
    // and it learns so: within about two heartbeats, see docs/DESIGN.md).
    let late = replica(&server, 100 * MS).live();
    let deadline = Instant::now() + Duration::from_secs(5);
    while late.version() != 2 {
        assert!(Instant::now() < deadline, "{late:?}");
        let permit = bounded(5, late.acquire_host("test", host("b.test"), None)).await;
        assert!(permit.is_ok(), "{permit:?}");
        tokio::time::sleep(100 * MS).await;
    }
    assert_eq!(late.policies().default_pacing().min_delay(), 30 * MS);

    // Lost again (a flush): a replica started before it is put back waits
    // for it rather than being refused by the agreement naming version 2.
    late.close(None).await.unwrap();
    // The first is in use: its heartbeat keeps the agreement.
    drop(
        bounded(5, first.acquire_host("test", host("a.test"), None))
            .await
            .unwrap(),
    );
    server.command(&["DEL", key.as_str()]);
    let later = replica(&server, 100 * MS).live();
    let permit = bounded(5, later.acquire_host("test", host("c.test"), None)).await;
    assert!(permit.is_ok(), "{permit:?}");
    assert_eq!(later.version(), 2);
    wait_for_version(&publisher, 2).await;
    later.close(None).await.unwrap();

    // Published as version 1 after Redis lost the count (as `publish`
    // numbers it in an empty scope): the newest policies, renumbered past
    // the version in force rather than overwritten, and followed.
    server.command(&[
        "EVAL",
        "redis.call('DEL', KEYS[1]) \
         redis.call('HSET', KEYS[1], 'version', 1, 'text', ARGV[1])",
        "1",
        key.as_str(),
        older.as_str(),
    ]);
    let renumbered = wait_for_version(&publisher, 3).await;
    assert_eq!(renumbered.default_pacing().min_delay(), 60 * MS);
    let deadline = Instant::now() + Duration::from_secs(5);
    while first.version() != 3 {
        assert!(Instant::now() < deadline, "{first:?}");
        tokio::time::sleep(20 * MS).await;
    }
    assert_eq!(first.policies().default_pacing().min_delay(), 60 * MS);
    first.close(None).await.unwrap();
}

/// Redis restarted empty: the replica in use puts the scope's record back
/// at its next heartbeat, naming version 1, and the policies of version 1
/// with it. A replica started then, with flags of its own, follows them at
/// its first acquire, well before the next look of the replica in use
/// (every 10 s here), which is when the policies went back before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_as_the_record_comes_back_follows_the_policies_it_names() {
    const LEASE_TTL: Duration = Duration::from_secs(40);
    let server = RedisServer::start();
    let replica = |min_delay| {
        limiter(
            standalone(&server.url()),
            |p| p.min_delay(min_delay),
            |b| b.lease_ttl(LEASE_TTL),
        )
    };
    let first = replica(100 * MS).live();
    // Before its first acquire, which starts its looks.
    let looked = Instant::now();
    drop(
        bounded(5, first.acquire_host("test", host("a.test"), None))
            .await
            .unwrap(),
    );
    let publisher = replica(100 * MS);
    bounded(5, publisher.publish_policies(&gap(30 * MS)))
        .await
        .unwrap();
    assert_eq!(bounded(5, first.refresh()).await.unwrap(), 1);
    // In use under version 1.
    drop(
        bounded(5, first.acquire_host("test", host("a.test"), None))
            .await
            .unwrap(),
    );

    server.restart();
    // The record, back from the heartbeat of the replica in use.
    let deadline = Instant::now() + Duration::from_secs(5);
    while server
        .query(&["KEYS", "*:config"])
        .as_array()
        .is_none_or(|keys| keys.is_empty())
    {
        assert!(Instant::now() < deadline, "the record was not put back");
        tokio::time::sleep(20 * MS).await;
    }
    let late = replica(100 * MS).live();
    let within = tokio::time::Instant::now() + Duration::from_secs(2);
    let permit = bounded(5, late.acquire_host("test", host("b.test"), Some(within))).await;
    assert!(permit.is_ok(), "{permit:?}");
    assert_eq!(late.version(), 1);
    assert_eq!(late.policies().default_pacing().min_delay(), 30 * MS);
    // Before the next look of the replica in use: the policies came back
    // with the record, not from that look.
    assert!(
        looked.elapsed() < LEASE_TTL / 4,
        "too slow to tell: {:?}",
        looked.elapsed()
    );
    drop(permit);
    late.close(None).await.unwrap();
    first.close(None).await.unwrap();
}

/// A live replica's start-up check (`LiveLimiter::check_config`), as its
/// acquires: a record naming a version whose policies Redis lost (the key
/// deleted here) is waited out until the replica in use puts them back,
/// and the replica then paces with them; a plain limiter's check is
/// refused by the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_check_waits_for_the_policies_the_record_names() {
    let server = RedisServer::start();
    let (first, _permit, _publisher) = in_use_then_published(&server, gap(30 * MS)).await;
    assert_eq!(bounded(5, first.refresh()).await.unwrap(), 1);
    // In use under version 1: the record names it.
    drop(
        bounded(5, first.acquire_host("test", host("b.test"), None))
            .await
            .unwrap(),
    );
    let key = server.query(&["KEYS", "*:policy"]).as_array().unwrap()[0]
        .as_str()
        .unwrap()
        .to_owned();
    server.command(&["DEL", key.as_str()]);
    let late = replica(&server, 100 * MS).live();
    let plain = bounded(5, late.redis().check_config()).await;
    assert!(
        matches!(plain, Err(Error::ConfigMismatch { .. })),
        "{plain:?}"
    );
    let checked = bounded(5, late.check_config(None)).await;
    assert!(checked.is_ok(), "{checked:?}");
    assert_eq!(late.version(), 1);
    assert_eq!(late.policies().default_pacing().min_delay(), 30 * MS);
    late.close(None).await.unwrap();
    first.close(None).await.unwrap();
}

/// Waits (at most 10 s) until the scope's published policies are of
/// `version`, and returns them.
async fn wait_for_version(publisher: &RedisLimiter, version: u64) -> Policies {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let published = bounded(5, publisher.published_policies()).await;
        if let Ok(Some((v, policies))) = &published
            && *v == version
        {
            return policies.clone();
        }
        assert!(
            Instant::now() < deadline,
            "version {version} was not put back: {published:?}"
        );
        tokio::time::sleep(20 * MS).await;
    }
}

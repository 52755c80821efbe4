//! Pacing across processes: in-process, serialized, lease and quota, on a
//! standalone Redis and on a 3-master Cluster.

use std::collections::BTreeSet;

use redislimit_tests::record::{assert_serialized, max_in_flight, max_in_window, min_send_gap};
use redislimit_tests::{RedisCluster, RedisServer, Upstream};

use crate::{HOSTS, MS, SLACK, finish, spawn, spawn_all, tempdir, urls};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_paces_in_process() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = urls(&upstream, &HOSTS, 5, "/slow?chunks=2&every=20");
    let replica = spawn(dir.path(), 0, &upstream, &list, &["--min-delay", "40ms"]);
    finish(vec![replica]).await;
    for host in HOSTS {
        let seen = upstream.recorder().host(host);
        assert_eq!(seen.len(), 5);
        assert_serialized(&seen, 40 * MS);
    }
}

async fn serialized_across(redis: &[&str]) {
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = urls(&upstream, &HOSTS, 8, "/slow?chunks=2&every=30");
    let mut args = vec![
        "--min-delay",
        "30ms",
        "--max-concurrent",
        "4",
        "--lease-ttl",
        "5s",
    ];
    args.extend_from_slice(redis);
    let replicas = spawn_all(dir.path(), &upstream, &list, 3, &args);
    finish(replicas).await;
    for host in HOSTS {
        let seen = upstream.recorder().host(host);
        assert_eq!(seen.len(), 8);
        // Bodies take 60 ms, longer than the gap: only the shared
        // serialization keeps the replicas from overlapping.
        assert_serialized(&seen, 30 * MS);
        let senders: BTreeSet<_> = seen.iter().map(|r| r.replica).collect();
        assert!(senders.len() >= 2, "{host} was paced by one replica only");
    }
}

async fn lease_across(redis: &[&str]) {
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = urls(&upstream, &HOSTS[..2], 10, "/slow?chunks=3&every=30");
    let mut args = vec!["--min-delay", "50ms", "--cluster-concurrency", "2"];
    args.extend_from_slice(redis);
    let replicas = spawn_all(dir.path(), &upstream, &list, 3, &args);
    finish(replicas).await;
    let mut peak = 0;
    for host in &HOSTS[..2] {
        let seen = upstream.recorder().host(host);
        assert_eq!(seen.len(), 10);
        let in_flight = max_in_flight(&seen);
        assert!(
            in_flight <= 2,
            "{host}: {in_flight} in flight, the cap is 2"
        );
        peak = peak.max(in_flight);
        let gap = min_send_gap(&seen);
        assert!(gap + SLACK >= 50 * MS, "{host}: sends {gap:?} apart");
    }
    assert_eq!(peak, 2, "lease mode never used its second slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_serialized_pace_through_redis() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    serialized_across(&["--redis", &server.url()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_lease_cap_through_redis() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    lease_across(&["--redis", &server.url()]).await;
}

fn cluster_args(cluster: &RedisCluster) -> Vec<String> {
    cluster
        .urls()
        .into_iter()
        .flat_map(|u| ["--redis-cluster".to_owned(), u])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_serialized_pace_through_a_cluster() {
    let _turn = crate::one_at_a_time().await;
    let cluster = RedisCluster::start();
    let args = cluster_args(&cluster);
    serialized_across(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_lease_cap_through_a_cluster() {
    let _turn = crate::one_at_a_time().await;
    let cluster = RedisCluster::start();
    let args = cluster_args(&cluster);
    lease_across(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
}

async fn quota_across(redis: &[&str]) {
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = urls(&upstream, &["a.test"], 12, "/");
    let window = 400 * MS;
    let mut args = vec![
        "--min-delay",
        "0ms",
        "--quota",
        "3",
        "--window",
        "400ms",
        "--cluster-concurrency",
        "8",
        "--max-concurrent",
        "8",
    ];
    args.extend_from_slice(redis);
    let replicas = spawn_all(dir.path(), &upstream, &list, 3, &args);
    finish(replicas).await;
    let seen = upstream.recorder().host("a.test");
    assert_eq!(seen.len(), 12);
    let most = max_in_window(&seen, window - SLACK);
    assert!(
        most <= 3,
        "{most} requests inside one 400 ms window, the quota is 3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_quota_through_redis() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    quota_across(&["--redis", &server.url()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_quota_through_a_cluster() {
    let _turn = crate::one_at_a_time().await;
    let cluster = RedisCluster::start();
    let args = cluster_args(&cluster);
    quota_across(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
}

/// A crawl replica whose settings differ from those its scope paces with
/// exits 2 before sending anything, and prints both configurations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_other_settings_refuses_to_start() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let first = spawn(
        dir.path(),
        0,
        &upstream,
        &urls(&upstream, &["a.test"], 2, "/first"),
        &["--redis", &server.url(), "--min-delay", "2s"],
    );
    finish(vec![first]).await;
    let sent = upstream.arrivals();
    let mut other = spawn(
        dir.path(),
        1,
        &upstream,
        &urls(&upstream, &["a.test"], 2, "/other"),
        &["--redis", &server.url(), "--min-delay", "100ms"],
    );
    let status = other.child.wait().await.unwrap();
    let stderr = String::from_utf8_lossy(&other.stderr.await.unwrap_or_default()).into_owned();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("min_delay=100ms") && stderr.contains("min_delay=2s"),
        "both configurations must be named: {stderr}"
    );
    assert_eq!(
        upstream.arrivals(),
        sent,
        "the refused replica sent requests"
    );
}

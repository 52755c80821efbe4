//! `SharedQueue`: items taken by one replica at a time, kept while it works
//! on them, claimed by another once a dead one stops keeping them, gone
//! when acknowledged; garbage in its key an error, not a panic.

use std::time::Duration;

use redislimit::RedisTimeouts;
use redislimit::redis::SharedQueue;
use redislimit_tests::RedisServer;

use crate::{MS, standalone};

fn queue(server: &RedisServer) -> SharedQueue {
    SharedQueue::new(standalone(&server.url()), "test", "urls").unwrap()
}

fn ids(items: &[redislimit::redis::QueueItem]) -> Vec<String> {
    items.iter().map(|i| i.id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_go_to_one_replica_and_a_dead_ones_are_claimed() {
    let server = RedisServer::start();
    let (a, b, c) = (queue(&server), queue(&server), queue(&server));
    let items: Vec<String> = (0..10).map(|i| format!("http://h{i}.test/ {i}")).collect();
    a.push(&items).await.unwrap();
    assert_eq!(a.len().await.unwrap(), 10);
    let took_a = a.take("a", 4).await.unwrap();
    let took_b = b.take("b", 100).await.unwrap();
    let texts: Vec<_> = took_a
        .iter()
        .chain(&took_b)
        .map(|i| i.text.clone())
        .collect();
    assert_eq!(texts, items, "each once, in order");
    assert!(c.take("c", 10).await.unwrap().is_empty());
    a.ack(&ids(&took_a[..2])).await.unwrap();
    assert_eq!(a.len().await.unwrap(), 8, "acknowledged items are gone");
    // a keeps its two; b dies (keeps nothing).
    let kept = ids(&took_a[2..]);
    for _ in 0..3 {
        tokio::time::sleep(100 * MS).await;
        assert_eq!(a.keep("a", &kept).await.unwrap(), 2);
    }
    let claimed = c
        .claim_stale("c", Duration::from_millis(250), 100)
        .await
        .unwrap();
    assert_eq!(ids(&claimed), ids(&took_b), "b's, not a's");
    assert_eq!(b.keep("b", &ids(&took_b)).await.unwrap(), 0, "taken over");
    assert_eq!(c.keep("c", &ids(&took_b)).await.unwrap(), 6);
    c.ack(&ids(&claimed)).await.unwrap();
    a.ack(&kept).await.unwrap();
    assert!(a.is_empty().await.unwrap());
    assert!(
        c.claim_stale("c", Duration::ZERO, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_queue_is_empty_and_garbage_is_an_error() {
    let server = RedisServer::start();
    let q = queue(&server);
    assert!(q.take("a", 10).await.unwrap().is_empty());
    assert!(
        q.claim_stale("a", Duration::ZERO, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(q.is_empty().await.unwrap());
    let key = redislimit_tests::keys::queue("test", "urls");
    server.command(&["DEL", &key]);
    server.command(&["SET", &key, "garbage"]);
    assert!(q.take("a", 10).await.is_err());
    assert!(q.push(&["http://a.test/".to_owned()]).await.is_err());
    assert_eq!(server.query(&["GET", &key]).as_str(), Some("garbage"));
    // A dead Redis is an error too, within the pool's timeouts.
    server.kill();
    let dead = SharedQueue::new(
        redislimit::RedisPool::standalone(&server.url(), RedisTimeouts::default()).unwrap(),
        "test",
        "urls",
    )
    .unwrap();
    let err = crate::bounded(10, dead.len()).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}

/// The consumers' names in the group (`XINFO CONSUMERS`), sorted.
fn consumers(server: &RedisServer) -> Vec<String> {
    let key = redislimit_tests::keys::queue("test", "urls");
    let reply = server.query(&["XINFO", "CONSUMERS", &key, "workers"]);
    let mut names: Vec<String> = reply
        .as_array()
        .unwrap_or_default()
        .iter()
        .filter_map(|c| match c.as_array()? {
            [field, name, ..] if field.as_str()? == "name" => Some(name.as_str()?.to_owned()),
            _ => None,
        })
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_holding_nothing_leaves_and_a_dead_one_is_removed() {
    let server = RedisServer::start();
    let (a, b, c) = (queue(&server), queue(&server), queue(&server));
    let items: Vec<String> = (0..4).map(|i| format!("http://h{i}.test/ {i}")).collect();
    a.push(&items).await.unwrap();
    let took_a = a.take("a", 2).await.unwrap();
    let took_b = b.take("b", 2).await.unwrap();
    assert_eq!(took_b.len(), 2);
    assert_eq!(consumers(&server), ["a", "b"]);
    assert!(!a.leave("a").await.unwrap(), "a still holds two");
    assert_eq!(consumers(&server), ["a", "b"]);
    a.ack(&ids(&took_a)).await.unwrap();
    assert!(a.leave("a").await.unwrap());
    assert_eq!(consumers(&server), ["b"]);
    assert!(a.leave("a").await.unwrap(), "out already");
    assert_eq!(consumers(&server), ["b"]);
    // b dies holding two: c takes them over once idle, and b (holding
    // nothing now, idle as long) is removed with it; c stays.
    tokio::time::sleep(300 * MS).await;
    let claimed = c
        .claim_stale("c", Duration::from_millis(250), 10)
        .await
        .unwrap();
    assert_eq!(ids(&claimed), ids(&took_b));
    assert_eq!(consumers(&server), ["c"]);
    // Asking again puts a consumer back; one that holds items is not
    // removed, however idle.
    c.ack(&ids(&claimed)).await.unwrap();
    a.push(&items[..2]).await.unwrap();
    assert_eq!(a.take("a", 2).await.unwrap().len(), 2);
    assert_eq!(consumers(&server), ["a", "c"]);
    tokio::time::sleep(300 * MS).await;
    let idle = Duration::from_millis(250);
    assert_eq!(c.claim_stale("c", idle, 1).await.unwrap().len(), 1);
    assert_eq!(consumers(&server), ["a", "c"], "a, idle, still holds one");
    assert_eq!(c.claim_stale("c", idle, 1).await.unwrap().len(), 1);
    assert_eq!(consumers(&server), ["c"], "a's last taken over, a removed");
    // A queue that does not exist: out of it already.
    let none = SharedQueue::new(standalone(&server.url()), "test", "none").unwrap();
    assert!(none.leave("a").await.unwrap());
    assert!(
        none.claim_stale("a", Duration::ZERO, 1)
            .await
            .unwrap()
            .is_empty()
    );
}

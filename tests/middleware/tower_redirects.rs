//! Redirects with tower: `FollowRedirectLayer` outside `PaceLayer`, so every
//! hop is a request to its own host, paced and penalized there.

use std::time::Duration;

use redislimit_tests::Upstream;
use redislimit_tests::record::{assert_serialized, min_send_gap};
use redislimit_tower::{PaceLayer, PaceOptions};
use tower::ServiceBuilder;
use tower_http::follow_redirect::FollowRedirectLayer;

use crate::tower_client::{get, hyper_client};
use crate::{MS, REDIRECTORS, bounded, domain_limiter, on, redirect_scenario};

/// Sends every URL at once (one task each) through clones of `client`;
/// each must end in `200`.
async fn send_all<S>(client: S, urls: Vec<String>)
where
    S: tower::Service<
            http::Request<http_body_util::Empty<bytes::Bytes>>,
            Response = http::Response<redislimit_tower::PermitBody<hyper::body::Incoming>>,
            Error = tower::BoxError,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let tasks: Vec<_> = urls
        .into_iter()
        .map(|url| {
            let mut client = client.clone();
            tokio::spawn(async move { (get(&mut client, &url).await.unwrap(), url) })
        })
        .collect();
    for task in tasks {
        let (status, url) = bounded(30, task).await.unwrap();
        assert_eq!(status, 200, "{url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_the_pace_layer_every_redirect_hop_is_paced_on_its_own_host() {
    let upstream = Upstream::start().await;
    let gap = 200 * MS;
    let client = ServiceBuilder::new()
        .layer(FollowRedirectLayer::new())
        .layer(PaceLayer::new(domain_limiter(|p| p.min_delay(gap))))
        .service(hyper_client(&upstream));
    send_all(client, redirect_scenario(&upstream)).await;

    let all = upstream.recorder().all();
    // Every t.test request, reached by a redirect or sent directly, keeps
    // t.test's pace.
    let target = on(&all, "t.test");
    assert_eq!(target.len(), 13, "{target:?}");
    assert_serialized(&target, gap);
    // Each hop is paced on the host it was sent to...
    for host in REDIRECTORS {
        let hops = on(&all, host);
        assert_eq!(hops.len(), 2, "{host}: {hops:?}");
        assert!(hops.iter().all(|r| r.path.starts_with("/redirect?")));
        assert_serialized(&hops, gap);
    }
    // ...and only there: no first hop waited behind t.test, which cannot
    // have taken its second request before one gap had passed.
    for host in REDIRECTORS {
        let first = &on(&all, host)[0];
        assert!(
            first.send < target[1].send,
            "{host}'s first hop waited behind t.test: {first:?}, {:?}",
            target[1]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_hop_releases_its_permit_before_the_next_hop_is_paced() {
    let upstream = Upstream::start().await;
    let gap = 50 * MS;
    // One request in flight per host, and a hopeless wait fails: a hop
    // whose permit outlived it would fail the next hop to the same host.
    let layer = PaceLayer::new(domain_limiter(|p| p.max_concurrent(1).min_delay(gap)))
        .with_options(PaceOptions::default().with_max_wait(Duration::from_secs(2)));
    let mut client = ServiceBuilder::new()
        .layer(FollowRedirectLayer::new())
        .layer(layer)
        .service(hyper_client(&upstream));
    let last = upstream.url("s.test", "/?last");
    let middle = upstream.redirect_url("s.test", &last, 307);
    let first = upstream.redirect_url("s.test", &middle, 301);
    let status = bounded(10, get(&mut client, &first)).await.unwrap();
    assert_eq!(status, 200);
    let seen = upstream.recorder().host("s.test");
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[2].path, "/?last");
    assert_serialized(&seen, gap);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_on_a_redirect_target_holds_the_target_not_the_redirector() {
    let upstream = Upstream::start().await;
    let hold = Duration::from_secs(1);
    let mut client = ServiceBuilder::new()
        .layer(FollowRedirectLayer::new())
        .layer(PaceLayer::new(domain_limiter(|p| p.max_concurrent(4))))
        .service(hyper_client(&upstream));
    let busy = upstream.url("t.test", "/status?code=429&retry_after=1");
    let redirect = upstream.redirect_url("r.test", &busy, 302);
    let status = bounded(10, get(&mut client, &redirect)).await.unwrap();
    assert_eq!(status, 429);
    // Both hosts again, at once: t.test waits out its hold, r.test does not.
    send_all(
        client,
        vec![
            upstream.url("t.test", "/?after"),
            upstream.url("r.test", "/?after"),
        ],
    )
    .await;

    crate::assert_only_the_target_was_held(&upstream, hold);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_the_pace_layer_redirect_hops_escape_their_targets_pace() {
    // The wrong order, pinned so the right one stays explained: the pace
    // layer sees only the first URL, so every hop is paced (and would be
    // penalized) against the redirector's host.
    let upstream = Upstream::start().await;
    let gap = 200 * MS;
    let client = ServiceBuilder::new()
        .layer(PaceLayer::new(domain_limiter(|p| p.min_delay(gap))))
        .layer(FollowRedirectLayer::new())
        .service(hyper_client(&upstream));
    send_all(client, redirect_scenario(&upstream)).await;

    let target = upstream.recorder().host("t.test");
    assert_eq!(target.len(), 13, "{target:?}");
    assert!(
        min_send_gap(&target) < gap,
        "t.test was paced although the hops bypassed its key"
    );
}

//! Redirects through `PacingMiddleware`: it follows them itself, so every
//! hop is a request to its own host, paced and penalized there.

use std::time::Duration;

use redislimit_reqwest::{PaceOptions, PacingMiddleware, RedirectError, Redirects};
use redislimit_tests::Upstream;
use redislimit_tests::record::assert_serialized;
use reqwest::redirect::Policy;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

use crate::{MS, REDIRECTORS, bounded, domain_limiter, on, redirect_scenario};

/// Every host the scenarios use, resolved to the upstream.
const NAMES: [&str; 8] = [
    "r1.test", "r2.test", "r3.test", "r4.test", "r5.test", "r.test", "s.test", "t.test",
];

fn client(
    upstream: &Upstream,
    policy: Policy,
    middleware: PacingMiddleware,
) -> ClientWithMiddleware {
    let mut builder = reqwest::Client::builder().redirect(policy);
    for name in NAMES {
        builder = builder.resolve(name, upstream.addr());
    }
    ClientBuilder::new(builder.build().unwrap())
        .with(middleware)
        .build()
}

/// Sends every URL at once (one task each); returns the statuses.
async fn send_all(client: &ClientWithMiddleware, urls: Vec<String>) -> Vec<u16> {
    let tasks: Vec<_> = urls
        .into_iter()
        .map(|url| {
            let client = client.clone();
            tokio::spawn(async move {
                let response = client.get(&url).send().await.unwrap();
                let status = response.status().as_u16();
                response.bytes().await.unwrap();
                status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(bounded(30, task).await.unwrap());
    }
    statuses
}

/// Regression: only the first hop was paced; t.test got 6 requests within
/// 10 ms when five redirects to it and direct requests went at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redirect_hop_is_paced_on_its_own_host() {
    let upstream = Upstream::start().await;
    let gap = 200 * MS;
    let client = client(
        &upstream,
        Policy::none(),
        PacingMiddleware::new(domain_limiter(|p| p.min_delay(gap))),
    );
    let statuses = send_all(&client, redirect_scenario(&upstream)).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");

    let all = upstream.recorder().all();
    let target = on(&all, "t.test");
    assert_eq!(target.len(), 13, "{target:?}");
    assert_serialized(&target, gap);
    for host in REDIRECTORS {
        let hops = on(&all, host);
        assert_eq!(hops.len(), 2, "{host}: {hops:?}");
        assert_serialized(&hops, gap);
        // Paced on its own host only: it did not wait behind t.test.
        assert!(hops[0].send < target[1].send, "{host} waited behind t.test");
    }
}

/// A 429 with Retry-After at the end of a redirect holds the host that sent
/// it, not the one that redirected. `client_follows` builds the client with
/// reqwest's own redirect policy instead: only the first hop is paced then,
/// but the penalty still goes to the host that answered.
async fn retry_after_behind_a_redirect(client_follows: bool) {
    let upstream = Upstream::start().await;
    let hold = Duration::from_secs(1);
    let policy = if client_follows {
        Policy::default()
    } else {
        Policy::none()
    };
    let client = client(
        &upstream,
        policy,
        PacingMiddleware::new(domain_limiter(|p| p.max_concurrent(4))),
    );
    let busy = upstream.url("t.test", "/status?code=429&retry_after=1");
    let redirect = upstream.redirect_url("r.test", &busy, 302);
    assert_eq!(send_all(&client, vec![redirect]).await, [429]);
    // Both hosts again, at once: t.test waits out its hold, r.test does not.
    let again = vec![
        upstream.url("t.test", "/?after"),
        upstream.url("r.test", "/?after"),
    ];
    assert_eq!(send_all(&client, again).await, [200, 200]);

    crate::assert_only_the_target_was_held(&upstream, hold);
}

/// Regression: t.test was hit again 2 ms after its 429, and r.test (which
/// only redirected) was held for 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_behind_a_redirect_holds_only_the_host_that_sent_it() {
    retry_after_behind_a_redirect(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_that_follows_redirects_the_answering_host_is_penalized() {
    retry_after_behind_a_redirect(true).await;
}

/// The hops are reported in the request's extensions, and each hop's
/// permit is back before the next hop to the same host is paced (one in
/// flight per host, and a hopeless wait fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hops_are_reported_and_each_frees_its_slot() {
    let upstream = Upstream::start().await;
    let gap = 50 * MS;
    let client = client(
        &upstream,
        Policy::none(),
        PacingMiddleware::new(domain_limiter(|p| p.max_concurrent(1).min_delay(gap)))
            .with_options(PaceOptions::default().with_max_wait(Duration::from_secs(2))),
    );
    let last = upstream.url("s.test", "/?last");
    let middle = upstream.redirect_url("s.test", &last, 307);
    let first = upstream.redirect_url("s.test", &middle, 301);
    let mut extensions = http::Extensions::new();
    let request = client.get(&first).build().unwrap();
    let response = bounded(10, client.execute_with_extensions(request, &mut extensions))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.url().as_str(), last);
    response.bytes().await.unwrap();
    let hops = extensions
        .get::<Redirects>()
        .expect("no Redirects extension");
    let hops: Vec<&str> = hops.0.iter().map(|u| u.as_str()).collect();
    assert_eq!(hops, [first.as_str(), middle.as_str()]);
    let seen = upstream.recorder().host("s.test");
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_serialized(&seen, gap);
}

fn redirect_error(err: &reqwest_middleware::Error) -> Option<&RedirectError> {
    match err {
        reqwest_middleware::Error::Middleware(e) => e.downcast_ref(),
        _ => None,
    }
}

/// A loop and a chain longer than the limit end in typed errors, each hop
/// still paced (the upstream saw them spaced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loops_and_long_chains_are_typed_errors() {
    let upstream = Upstream::start().await;
    let gap = 20 * MS;
    let client = client(
        &upstream,
        Policy::none(),
        PacingMiddleware::new(domain_limiter(|p| p.min_delay(gap))).with_max_redirects(3),
    );
    let looping = upstream.url("s.test", "/loop?n=1");
    let err = bounded(10, client.get(&looping).send()).await.unwrap_err();
    assert!(
        matches!(redirect_error(&err), Some(RedirectError::Loop { url }) if url.as_str() == looping),
        "{err:?}"
    );
    let mut url = upstream.url("t.test", "/?end");
    for _ in 0..4 {
        url = upstream.redirect_url("t.test", &url, 302);
    }
    let err = bounded(10, client.get(&url).send()).await.unwrap_err();
    assert!(
        matches!(
            redirect_error(&err),
            Some(RedirectError::TooMany { max: 3, .. })
        ),
        "{err:?}"
    );
    // The loop was tried once; the chain hop by hop up to the limit.
    assert_eq!(upstream.recorder().host("s.test").len(), 1);
    let chain = upstream.recorder().host("t.test");
    assert_eq!(chain.len(), 4, "{chain:?}");
    assert_serialized(&chain, gap);
}

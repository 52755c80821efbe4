//! What servers say about their budget: a spent `RateLimit` field or
//! `X-RateLimit-*` headers hold the host until the reset, through the
//! reqwest middleware and the tower layer; judged at the upstream.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redislimit_reqwest::{PaceOptions, PacingMiddleware, RateLimitHeaders};
use redislimit_tests::Upstream;
use reqwest_middleware::ClientBuilder;

use crate::{bounded, domain_limiter};

/// Sends `first` then, once its body is read, `next` on the same host and
/// a request to another host; returns how long after the first the
/// upstream saw the next one, and the other host's request.
async fn hold_after(
    middleware: PacingMiddleware,
    first: &dyn Fn(&Upstream) -> String,
) -> (Duration, Duration) {
    let upstream = Upstream::start().await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .resolve("t.test", upstream.addr())
        .resolve("o.test", upstream.addr())
        .build()
        .unwrap();
    let client = ClientBuilder::new(http).with(middleware).build();
    let url = first(&upstream);
    let response = bounded(10, client.get(&url).send()).await.unwrap();
    response.bytes().await.unwrap();
    let next = upstream.url("t.test", "/?next");
    let other = upstream.url("o.test", "/?other");
    let read = |url: String| {
        let client = client.clone();
        async move { client.get(url).send().await.unwrap().bytes().await.unwrap() }
    };
    drop(tokio::join!(read(next), read(other)));
    let t = upstream.recorder().host("t.test");
    let o = upstream.recorder().host("o.test");
    assert_eq!((t.len(), o.len()), (2, 1));
    (t[1].send - t[0].send, o[0].send - t[0].send)
}

/// `t.test` waited at least `hold` for its next request; `o.test` did not.
fn assert_held_alone((next, other): (Duration, Duration), hold: Duration) {
    assert!(next >= hold, "t.test was not held: {next:?}");
    assert!(other < hold, "o.test was held too: {other:?}");
}

fn plain() -> PacingMiddleware {
    PacingMiddleware::new(domain_limiter(|p| p.max_concurrent(2)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_ietf_ratelimit_field_holds_the_host_until_its_reset() {
    let spent = |u: &Upstream| u.headers_url("t.test", &[("ratelimit", r#""default";r=0;t=1"#)]);
    assert_held_alone(hold_after(plain(), &spent).await, Duration::from_secs(1));
    // Budget left: no hold.
    let left = |u: &Upstream| u.headers_url("t.test", &[("ratelimit", r#""default";r=4;t=1"#)]);
    let (next, _) = hold_after(plain(), &left).await;
    assert!(
        next < Duration::from_secs(1),
        "held with budget left: {next:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_style_headers_hold_the_host_until_the_epoch_reset() {
    // A reset two seconds ahead, as a Unix time (the upstream's Date header
    // has a one-second resolution, so the hold is 1 to 2 s).
    let reset = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 2;
    let spent = move |u: &Upstream| {
        u.headers_url(
            "t.test",
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &reset.to_string()),
            ],
        )
    };
    assert_held_alone(
        hold_after(plain(), &spent).await,
        Duration::from_millis(900),
    );
    // Switched off, the same answer holds nothing.
    let (next, _) = hold_after(
        plain()
            .with_options(PaceOptions::default().with_rate_limit_headers(RateLimitHeaders::Ignore)),
        &spent,
    )
    .await;
    assert!(
        next < Duration::from_millis(900),
        "held although switched off: {next:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_takes_precedence_over_the_ratelimit_field() {
    let both = |u: &Upstream| {
        u.headers_url(
            "t.test",
            &[("ratelimit", r#""default";r=0;t=30"#), ("retry-after", "1")],
        )
        .replace("/headers?", "/headers?code=429&")
    };
    let (next, _) = hold_after(plain(), &both).await;
    assert!(next >= Duration::from_secs(1), "not held: {next:?}");
    assert!(
        next < Duration::from_secs(10),
        "the RateLimit reset won: {next:?}"
    );
}

/// The tower layer reads the same signals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tower_layer_holds_a_host_whose_budget_is_spent() {
    use tower::ServiceBuilder;
    let upstream = Upstream::start().await;
    let layer = redislimit_tower::PaceLayer::new(domain_limiter(|p| p.max_concurrent(2)));
    let mut client = ServiceBuilder::new()
        .layer(layer)
        .service(crate::tower_client::hyper_client(&upstream));
    let spent = upstream.headers_url("t.test", &[("ratelimit", r#""default";r=0;t=1"#)]);
    let status = bounded(10, crate::tower_client::get(&mut client, &spent))
        .await
        .unwrap();
    assert_eq!(status, 200);
    let next = upstream.url("t.test", "/?next");
    bounded(10, crate::tower_client::get(&mut client, &next))
        .await
        .unwrap();
    let seen = upstream.recorder().host("t.test");
    assert_eq!(seen.len(), 2);
    assert!(
        seen[1].send - seen[0].send >= Duration::from_secs(1),
        "t.test was not held: {:?}",
        seen[1].send - seen[0].send
    );
}

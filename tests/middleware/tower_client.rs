//! `PaceLayer` in front of the hyper-util client, end to end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;
use redislimit::{Error, Limiter};
use redislimit_tests::Upstream;
use redislimit_tests::record::{assert_serialized, max_in_flight};
use redislimit_tower::{PaceLayer, PaceOptions};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

use crate::{HOSTS, MS, bounded, domain_limiter};

/// Resolves every name to the upstream.
#[derive(Debug, Clone)]
pub(crate) struct ToUpstream(SocketAddr);

impl Service<Name> for ToUpstream {
    type Response = std::iter::Once<SocketAddr>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Name) -> Self::Future {
        std::future::ready(Ok(std::iter::once(self.0)))
    }
}

/// A hyper-util client that resolves every name to the upstream.
pub(crate) fn hyper_client(upstream: &Upstream) -> Client<HttpConnector<ToUpstream>, Empty<Bytes>> {
    let connector = HttpConnector::new_with_resolver(ToUpstream(upstream.addr()));
    Client::builder(TokioExecutor::new()).build(connector)
}

/// GETs `url` through `client` and reads the whole body.
pub(crate) async fn get<S>(client: &mut S, url: &str) -> Result<http::StatusCode, BoxError>
where
    S: Service<
            http::Request<Empty<Bytes>>,
            Response = http::Response<redislimit_tower::PermitBody<hyper::body::Incoming>>,
            Error = BoxError,
        >,
{
    let request = http::Request::get(url).body(Empty::new())?;
    let response = client.ready().await?.call(request).await?;
    let status = response.status();
    response.into_body().collect().await?;
    Ok(status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_paces_the_hyper_client_end_to_end() {
    let upstream = Upstream::start().await;
    let gap = 40 * MS;
    let layer = PaceLayer::new(domain_limiter(|p| p.max_concurrent(1).min_delay(gap)));
    let client = ServiceBuilder::new()
        .layer(layer)
        .service(hyper_client(&upstream));
    let mut tasks = Vec::new();
    for host in HOSTS {
        for _ in 0..2 {
            let (mut client, url) = (
                client.clone(),
                upstream.url(host, "/slow?chunks=3&every=20"),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..2 {
                    assert_eq!(get(&mut client, &url).await.unwrap(), 200);
                }
            }));
        }
    }
    for t in tasks {
        bounded(30, t).await.unwrap();
    }
    for host in HOSTS {
        let seen = upstream.recorder().host(host);
        assert_eq!(seen.len(), 4, "{host}");
        assert_serialized(&seen, gap);
    }
    assert!(max_in_flight(&upstream.recorder().all()) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_through_the_layer_holds_the_host_for_every_clone() {
    let upstream = Upstream::start().await;
    let layer = PaceLayer::new(domain_limiter(|p| p.max_concurrent(4)));
    let mut first = ServiceBuilder::new()
        .layer(layer.clone())
        .service(hyper_client(&upstream));
    let mut second = ServiceBuilder::new()
        .layer(layer)
        .service(hyper_client(&upstream));
    let status = get(
        &mut first,
        &upstream.url("a.test", "/status?code=503&retry_in=1"),
    )
    .await
    .unwrap();
    assert_eq!(status, 503);
    assert_eq!(
        bounded(10, get(&mut second, &upstream.url("a.test", "/")))
            .await
            .unwrap(),
        200
    );
    let seen = upstream.recorder().host("a.test");
    assert!(
        seen[1].send - seen[0].end >= Duration::from_secs(1),
        "{:?}",
        seen[1].send - seen[0].end
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_body_releases_and_a_hopeless_wait_fails_fast_with_a_typed_error() {
    let upstream = Upstream::start().await;
    let limiter: Arc<dyn Limiter> = Arc::new(domain_limiter(|p| p.max_concurrent(1)));
    let mut client = ServiceBuilder::new()
        .layer(
            PaceLayer::from_arc(limiter)
                .with_options(PaceOptions::default().with_max_wait(Duration::from_secs(1))),
        )
        .service(hyper_client(&upstream));
    let request = http::Request::get(upstream.url("a.test", "/slow?chunks=100&every=100"))
        .body(Empty::new())
        .unwrap();
    let response = client.ready().await.unwrap().call(request).await.unwrap();
    assert!(response.body().holds_permit());
    // While the body is held, the host is full: the next request fails
    // when its 1 s budget runs out, with the limiter's error.
    let err = get(&mut client, &upstream.url("a.test", "/"))
        .await
        .unwrap_err();
    assert!(
        matches!(err.downcast_ref::<Error>(), Some(Error::WaitBudget { .. })),
        "{err}"
    );
    drop(response);
    assert_eq!(
        bounded(10, get(&mut client, &upstream.url("a.test", "/")))
            .await
            .unwrap(),
        200
    );
    // A URI without a host is refused before anything is sent.
    let err = get(&mut client, "/relative").await.unwrap_err();
    assert!(
        matches!(err.downcast_ref::<Error>(), Some(Error::InvalidUrl { .. })),
        "{err}"
    );
}

//! A hyper-util client behind the tower `PaceLayer`, following redirects.
//!
//! Run it with `cargo run -p examples --example hyper_client`.
//!
//! Three requests to each of `a.test` and `b.test` (served on loopback) go
//! through one client; clones of the service share the limiter. One more
//! request, to `a.test/to/b.test`, is redirected to `b.test`.
//! `FollowRedirectLayer` sits outside `PaceLayer`, so each hop is a request
//! of its own: the redirect is paced on `a.test` and the request it leads
//! to on `b.test`. Look at the server's lines: each host's requests are at
//! least 250 ms apart (`b.test` has four), the two hosts run alongside.

use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;
use redislimit::{DomainLimiter, Limiter, Pacing};
use redislimit_tower::{PaceLayer, PaceOptions};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_http::follow_redirect::{FollowRedirectLayer, RequestUri};

/// Resolves every name to the local upstream (a real client would use the
/// default resolver).
#[derive(Clone)]
struct Local(SocketAddr);

impl Service<Name> for Local {
    type Response = std::iter::Once<SocketAddr>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Name) -> Self::Future {
        std::future::ready(Ok(std::iter::once(self.0)))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let upstream = examples::local_upstream(false).await;
    let limiter = DomainLimiter::new(
        Pacing::builder()
            .min_delay(Duration::from_millis(250))
            .build()?,
    );
    let hyper = Client::builder(TokioExecutor::new())
        .build::<_, Empty<Bytes>>(HttpConnector::new_with_resolver(Local(upstream)));
    // Outermost first: FollowRedirectLayer outside PaceLayer sends every
    // hop through PaceLayer again, to be paced (and, on a 429/503 with
    // Retry-After, penalized) at the host it goes to. The other way round,
    // PaceLayer would see only the first URL and charge every hop to its
    // host. A hop's response is dropped before the next hop, which releases
    // its permit.
    let pace = PaceLayer::new(limiter).with_options(PaceOptions::default().with_engine("example"));
    let client = ServiceBuilder::new()
        .layer(FollowRedirectLayer::new())
        .layer(pace.clone())
        .service(hyper);

    let started = Instant::now();
    let port = upstream.port();
    let mut uris: Vec<_> = ["a.test", "b.test"]
        .into_iter()
        .flat_map(|host| std::iter::repeat_n(format!("http://{host}:{port}/"), 3))
        .collect();
    uris.push(format!("http://a.test:{port}/to/b.test"));
    let mut requests = Vec::new();
    for uri in uris {
        let mut client = client.clone();
        requests.push(tokio::spawn(async move {
            let request = http::Request::get(&uri).body(Empty::new())?;
            let response = client.ready().await?.call(request).await?;
            let status = response.status();
            // Where the last hop went.
            let last = response
                .extensions()
                .get::<RequestUri>()
                .map(|u| u.0.clone());
            response.into_body().collect().await?; // releases the permit
            println!(
                "client: {:>5} ms  {uri} -> {status} from {}",
                started.elapsed().as_millis(),
                last.map_or_else(|| uri.clone(), |u| u.to_string()),
            );
            Ok::<_, tower::BoxError>(())
        }));
    }
    for request in requests {
        request.await??;
    }
    // Before the runtime ends: the layer's limiter sends its last releases.
    pace.limiter().close(None).await?;
    Ok(())
}

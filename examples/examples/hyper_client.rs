//! A hyper-util client behind the tower `PaceLayer`.
//!
//! Run it with `cargo run -p examples --example hyper_client`.
//!
//! Three requests to each of `a.test` and `b.test` (served on loopback) go
//! through one `Pace<Client>`; clones of the service share the limiter.
//! Look at the server's lines: one host's requests are at least 250 ms
//! apart, the other host's run alongside.

use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;
use redislimit::{DomainLimiter, Pacing};
use redislimit_tower::PaceLayer;
use tower::{Service, ServiceBuilder, ServiceExt};

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
    let client = ServiceBuilder::new()
        .layer(PaceLayer::new(limiter).with_engine("example"))
        .service(hyper);

    let started = Instant::now();
    let mut requests = Vec::new();
    for host in ["a.test", "b.test"] {
        for _ in 0..3 {
            let mut client = client.clone();
            let uri = format!("http://{host}:{}/", upstream.port());
            requests.push(tokio::spawn(async move {
                let request = http::Request::get(&uri).body(Empty::new())?;
                let response = client.ready().await?.call(request).await?;
                let status = response.status();
                response.into_body().collect().await?; // releases the permit
                println!(
                    "client: {:>5} ms  {uri} -> {status}",
                    started.elapsed().as_millis()
                );
                Ok::<_, tower::BoxError>(())
            }));
        }
    }
    for request in requests {
        request.await??;
    }
    Ok(())
}

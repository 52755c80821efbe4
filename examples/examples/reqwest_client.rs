//! A reqwest client paced per host by the in-process limiter.
//!
//! Run it with `cargo run -p examples --example reqwest_client`.
//!
//! Two hosts, `a.test` and `b.test` (both served on loopback), get four
//! requests each, all started at once. Look at the server's lines: requests
//! to one host are at least 300 ms apart, while the two hosts proceed side
//! by side. `a.test/busy` answers 429 with `Retry-After: 1`, after which
//! `a.test` is held back for a second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redislimit::{DomainLimiter, Limiter, Pacing};
use redislimit_reqwest::{PaceOptions, PacingMiddleware};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let upstream = examples::local_upstream(false).await;
    let limiter = DomainLimiter::new(
        Pacing::builder()
            .max_concurrent(1)
            .min_delay(Duration::from_millis(300))
            .build()?,
    );
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .resolve("a.test", upstream)
        .resolve("b.test", upstream)
        .build()?;
    let pacing =
        PacingMiddleware::new(limiter).with_options(PaceOptions::default().with_engine("example"));
    // Kept to close the limiter at the end.
    let limiter = Arc::clone(pacing.limiter());
    let client = reqwest_middleware::ClientBuilder::new(http)
        .with(pacing)
        .build();

    let started = Instant::now();
    let mut requests = Vec::new();
    for host in ["a.test", "b.test"] {
        for path in ["/", "/busy", "/", "/"] {
            let url = format!("http://{host}:{}{path}", upstream.port());
            let client = client.clone();
            requests.push(tokio::spawn(async move {
                let response = client.get(&url).send().await?;
                let status = response.status();
                response.bytes().await?; // the permit is held until here
                println!(
                    "client: {:>5} ms  {url} -> {status}",
                    started.elapsed().as_millis()
                );
                Ok::<_, reqwest_middleware::Error>(())
            }));
        }
    }
    for request in requests {
        request.await??;
    }
    // Before the runtime ends (a Redis-backed limiter sends its last
    // releases here; this in-process one has nothing left to send).
    limiter.close(None).await?;
    Ok(())
}

//! Retries with reqwest-retry, each attempt paced.
//!
//! Run it with `cargo run -p examples --example retry`.
//!
//! `a.test/flaky` (served on loopback) answers 503 twice before it answers
//! 200. The retry middleware retries at once (its backoff is set to a few
//! milliseconds), yet the server's lines show the three attempts 500 ms
//! apart: the pacing middleware sits *inside* the retry middleware, so
//! every attempt asks the limiter for its turn.
//!
//! Order matters: `reqwest_middleware::ClientBuilder::with` adds middleware
//! from the outside in. With retry outermost, one call to the pacing
//! middleware happens per attempt. The other way round, pacing would be
//! asked once and every retry would hit the host back to back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redislimit::{DomainLimiter, Limiter, Pacing};
use redislimit_reqwest::PacingMiddleware;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let upstream = examples::local_upstream(false).await;
    let limiter = DomainLimiter::new(
        Pacing::builder()
            .min_delay(Duration::from_millis(500))
            .build()?,
    );
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(1), Duration::from_millis(5))
        .build_with_max_retries(3);
    let pacing = PacingMiddleware::new(limiter);
    let limiter = Arc::clone(pacing.limiter());
    let client = reqwest_middleware::ClientBuilder::new(
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .resolve("a.test", upstream)
            .build()?,
    )
    .with(RetryTransientMiddleware::new_with_policy(policy)) // outermost: retries...
    .with(pacing) // ...each attempt through pacing
    .build();

    let started = Instant::now();
    let url = format!("http://a.test:{}/flaky", upstream.port());
    let response = client.get(&url).send().await?;
    println!(
        "client: {:>5} ms  {url} -> {} after the retries",
        started.elapsed().as_millis(),
        response.status()
    );
    limiter.close(None).await?;
    Ok(())
}

//! `--metrics-addr`: a Prometheus scrape during a crawl finds the
//! documented series with the counts the upstream saw.

use std::time::Duration;

use redislimit_tests::Upstream;

use crate::{finish, spawn, tempdir};

/// The value of the series `name{labels}` in a Prometheus text page.
fn value(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_during_the_crawl_counts_admissions_and_holds() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Four quick requests, one answered 503 with Retry-After, and one
    // slow body that keeps the crawl (and its exporter) up while we look.
    let list = vec![
        upstream.url("a.test", "/status?code=503&retry_after=1"),
        upstream.url("b.test", "/?1"),
        upstream.url("b.test", "/?2"),
        upstream.url("b.test", "/?3"),
        upstream.url("c.test", "/slow?chunks=40&every=100"),
    ];
    let addr = format!("127.0.0.1:{port}");
    let args = ["--metrics-addr", &addr, "--min-delay", "10ms"];
    let replica = spawn(dir.path(), 0, &upstream, &list, &args);
    let scrape = format!("http://{addr}/metrics");
    let client = reqwest::Client::new();
    let mut page = String::new();
    let mut counted = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Ok(response) = client.get(&scrape).send().await else {
            continue;
        };
        page = response.text().await.unwrap_or_default();
        let acquired = value(
            &page,
            r#"redislimit_acquires_total{engine="crawl",outcome="acquired"}"#,
        );
        let held = value(&page, r#"redislimit_holds_total{cause="retry-after"}"#);
        if acquired == Some(5.0) && held == Some(1.0) {
            counted = Some(page.clone());
            break;
        }
    }
    let page = counted.unwrap_or_else(|| panic!("never counted 5 admissions and 1 hold:\n{page}"));
    // Every request the upstream saw start was admitted once.
    assert_eq!(upstream.arrivals(), 5);
    assert!(
        page.contains("redislimit_wait_seconds_count{engine=\"crawl\",outcome=\"acquired\"} 5")
            || page
                .contains("redislimit_wait_seconds_count{outcome=\"acquired\",engine=\"crawl\"} 5"),
        "{page}"
    );
    assert!(!page.contains("host=\""), "no host label unless asked for");
    // Histograms with buckets (they add up across replicas), every metric
    // described, the gauge present though the fallback never ran.
    assert!(
        page.contains("# TYPE redislimit_wait_seconds histogram"),
        "{page}"
    );
    for le in ["0.001", "0.1", "1", "300", "+Inf"] {
        assert!(
            page.lines()
                .any(|line| line.starts_with("redislimit_wait_seconds_bucket{")
                    && line.contains(&format!("le=\"{le}\""))),
            "no bucket le={le}:\n{page}"
        );
    }
    assert!(
        page.contains("# TYPE redislimit_hold_seconds histogram"),
        "{page}"
    );
    for metric in [
        "redislimit_acquires_total",
        "redislimit_wait_seconds",
        "redislimit_holds_total",
        "redislimit_hold_seconds",
        "redislimit_fallback_active",
    ] {
        assert!(
            page.contains(&format!("# HELP {metric} ")),
            "no HELP for {metric}:\n{page}"
        );
    }
    assert_eq!(
        value(&page, "redislimit_fallback_active"),
        Some(0.0),
        "{page}"
    );
    finish(vec![replica]).await;
}

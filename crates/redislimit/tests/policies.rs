//! Per-host rules and keying in the in-process limiter, under a paused
//! clock: exact assertions on when each request is admitted.

use std::time::Duration;

use redislimit::{DomainLimiter, HostKey, KeyBy, Limiter, Pacing, Policies, Rule};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

fn gap(ms: u64) -> Pacing {
    Pacing::builder()
        .min_delay(Duration::from_millis(ms))
        .build()
        .unwrap()
}

fn host(url: &str) -> HostKey {
    HostKey::parse(url).unwrap()
}

/// When each of `urls`, acquired in turn (each released at once), was
/// admitted, in ms from the start.
async fn admitted(limiter: &DomainLimiter, urls: &[&str]) -> Vec<u128> {
    let start = Instant::now();
    let mut at = Vec::new();
    for url in urls {
        let permit = limiter.acquire_host("t", host(url), None).await.unwrap();
        at.push(start.elapsed().as_millis());
        permit.release();
    }
    at
}

#[tokio::test(start_paused = true)]
async fn each_host_is_paced_by_its_own_rule() {
    let policies = Policies::new(gap(100))
        .with_rule(Rule::new("a.test", gap(1000)))
        .unwrap()
        .with_rule(Rule::new("*.b.test", gap(300)))
        .unwrap();
    let limiter = DomainLimiter::new(policies);
    // a.test by its exact rule, x.b.test by the suffix, b.test (the apex)
    // and c.test by the default; each host on its own, all at once.
    let run = |url: &'static str| {
        let limiter = limiter.clone();
        async move { admitted(&limiter, &[url, url, url]).await }
    };
    let (a, xb, b, c) = tokio::join!(
        run("http://a.test/"),
        run("http://x.b.test/"),
        run("http://b.test/"),
        run("http://c.test/"),
    );
    assert_eq!(a, [0, 1000, 2000]);
    assert_eq!(xb, [0, 300, 600]);
    assert_eq!(b, [0, 100, 200]);
    assert_eq!(c, [0, 100, 200]);
    // Penalties are capped by the host's own rule.
    let capped = Pacing::builder()
        .min_delay(Duration::ZERO)
        .max_penalty(50 * MS)
        .build()
        .unwrap();
    let limiter = DomainLimiter::new(
        Policies::new(gap(0))
            .with_rule(Rule::new("p.test", capped))
            .unwrap(),
    );
    limiter
        .penalize_host(host("http://p.test/"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(admitted(&limiter, &["http://p.test/"]).await, [50]);
}

#[tokio::test(start_paused = true)]
async fn hosts_of_one_registrable_domain_share_one_pace() {
    let by_domain =
        DomainLimiter::new(Policies::new(gap(200)).with_key_by(KeyBy::RegistrableDomain));
    let urls = [
        "http://a.example.co.uk/",
        "http://b.example.co.uk/",
        "http://a.example.co.uk/",
    ];
    assert_eq!(admitted(&by_domain, &urls).await, [0, 200, 400]);
    let permit = by_domain
        .acquire_host("t", host("http://b.example.co.uk/"), None)
        .await
        .unwrap();
    assert_eq!(
        permit.host().as_str(),
        "example.co.uk",
        "the permit names the key"
    );
    drop(permit);
    // Keyed by host, they do not.
    let by_host = DomainLimiter::new(gap(200));
    assert_eq!(admitted(&by_host, &urls[..2]).await, [0, 0]);
    // Keyed by host and port, ports are apart.
    let by_port = DomainLimiter::new(Policies::new(gap(200)).with_key_by(KeyBy::HostPort));
    let ports = ["http://a.test:1/", "http://a.test:2/", "http://a.test:1/"];
    assert_eq!(admitted(&by_port, &ports).await, [0, 0, 200]);
}

/// `a.test` and `b.test` on one machine, `c.test` on another (and on a
/// third address, higher); `gone.test` resolving to nothing.
#[derive(Debug, Default)]
struct Machines {
    asked: std::sync::atomic::AtomicUsize,
}

impl redislimit::AddressResolver for Machines {
    fn resolve<'a>(
        &'a self,
        name: &'a str,
    ) -> redislimit::BoxFuture<'a, std::io::Result<redislimit::Resolved>> {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            // A lookup takes time: requests wait for it, not for each other.
            tokio::time::sleep(5 * MS).await;
            let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
            match name {
                "a.test" | "b.test" => Ok(redislimit::Resolved::new([ip("10.0.0.1")])),
                "c.test" => Ok(redislimit::Resolved::new([ip("10.0.0.7"), ip("10.0.0.2")])),
                _ => Err(std::io::ErrorKind::NotFound.into()),
            }
        })
    }
}

#[tokio::test(start_paused = true)]
async fn hosts_on_one_address_share_one_pace() {
    let machines = std::sync::Arc::new(Machines::default());
    let policies = Policies::new(gap(200))
        .with_key_by(KeyBy::Ip)
        .with_address_resolver(machines.clone());
    let by_ip = DomainLimiter::new(policies.clone());
    let urls = [
        "http://a.test/",
        "http://b.test:8080/",
        "http://c.test/",
        "http://10.0.0.1/",
        "http://c.test/",
    ];
    // Each name's first request waits 5 ms for its lookup.
    assert_eq!(admitted(&by_ip, &urls).await, [5, 205, 210, 405, 410]);
    let permit = by_ip
        .acquire_host("t", host("http://c.test/"), None)
        .await
        .unwrap();
    assert_eq!(permit.host().as_str(), "10.0.0.2", "the lowest address");
    drop(permit);
    assert_eq!(policies.key(&host("http://b.test/")).as_str(), "10.0.0.1");
    assert_eq!(
        machines.asked.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "once per name while the addresses hold"
    );
    // A name that does not resolve is paced under itself.
    let gone = by_ip
        .acquire_host("t", host("http://gone.test/"), None)
        .await
        .unwrap();
    assert_eq!(gone.host().as_str(), "gone.test");
    // A hold on a name holds its address.
    by_ip
        .penalize_host(host("http://a.test/"), Duration::from_secs(1))
        .await
        .unwrap();
    let start = Instant::now();
    drop(
        by_ip
            .acquire_host("t", host("http://10.0.0.1/"), None)
            .await
            .unwrap(),
    );
    assert_eq!(start.elapsed().as_millis(), 1000);
}

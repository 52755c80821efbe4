//! The command line's small promises, each checked by running the crawl.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use redislimit_tests::Upstream;
use serde_json::Value;
use tokio::process::Command;

use crate::{MS, SLACK, read_report, tempdir};

/// What one crawl left behind.
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    report: Vec<Value>,
}

/// The crawl binary with stdout and stderr piped (so neither is a terminal).
fn crawl() -> Command {
    let mut cmd = Command::new(crate::crawl_binary());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// `--resolve NAME:ADDR` for each of `names`, to the upstream.
fn resolve(upstream: &Upstream, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .flat_map(|name| {
            [
                "--resolve".into(),
                format!("{name}:{}", upstream.addr().ip()),
            ]
        })
        .collect()
}

/// Runs the crawl with `args` and a `--report` in `dir`, to its end.
async fn run<S: AsRef<OsStr>>(dir: &Path, args: impl IntoIterator<Item = S>) -> Ran {
    let report = dir.join("report.jsonl");
    let mut cmd = crawl();
    cmd.args(args).arg("--report").arg(&report);
    let output = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the crawl did not finish")
        .expect("start the crawl binary");
    Ran {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        report: read_report(&report),
    }
}

/// The report line of the URL whose path and query is `path`.
fn line<'a>(ran: &'a Ran, path: &str) -> &'a Value {
    ran.report
        .iter()
        .find(|l| l["url"].as_str().is_some_and(|u| u.ends_with(path)))
        .unwrap_or_else(|| panic!("no report line for {path}: {:?}", ran.report))
}

/// How long after the first request to `host` the upstream saw the second.
fn second_after_first(upstream: &Upstream, host: &str) -> Duration {
    let seen = upstream.recorder().host(host);
    assert_eq!(seen.len(), 2, "{host}: {seen:?}");
    seen[1].send - seen[0].send
}

/// Before: `retry_after_ms` was `as_millis() as u64`, which wraps for a
/// `Retry-After` of more seconds than fit, and the hold applied was not
/// reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_after_saturates_and_is_capped_by_max_penalty() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let cases = [
        ("a.test", "18446744073709551615", u64::MAX),
        ("b.test", "99999999999", 99_999_999_999_000),
    ];
    let mut args = resolve(&upstream, &["a.test", "b.test"]);
    args.extend(["--max-penalty".into(), "2s".into()]);
    for (host, value, _) in cases {
        args.push(upstream.url(host, &format!("/status?code=429&retry_after={value}")));
        args.push(upstream.url(host, "/next"));
    }
    let ran = run(dir.path(), &args).await;
    assert!(ran.status.success(), "{}\n{}", ran.status, ran.stderr);
    for (host, value, asked_ms) in cases {
        let penalized = ran
            .report
            .iter()
            .find(|l| l["host"] == host && l["status"] == 429)
            .unwrap_or_else(|| panic!("no 429 from {host}: {:?}", ran.report));
        assert_eq!(
            penalized["retry_after_ms"], asked_ms,
            "{value}: {penalized}"
        );
        assert_eq!(penalized["hold_ms"], 2000, "{value}: {penalized}");
        let apart = second_after_first(&upstream, host);
        assert!(
            apart >= 2000 * MS && apart < 3500 * MS,
            "{host}: the next request came {apart:?} after Retry-After: {value} \
             with --max-penalty 2s"
        );
    }
}

/// Before: URLs that were never sent (a blown `--max-wait`) counted in the
/// host's rate, stamped when they gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_rate_counts_only_sent_requests() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let mut args = resolve(&upstream, &["a.test"]);
    args.extend(["--max-wait", "100ms", "--min-delay", "50ms"].map(String::from));
    args.push(upstream.url("a.test", "/first"));
    args.push(upstream.url("a.test", "/status?code=429&retry_after=5"));
    args.extend((0..3).map(|i| upstream.url("a.test", &format!("/held?i={i}"))));
    let ran = run(dir.path(), &args).await;
    // The URLs that never left got no response: the exit code says so.
    assert_eq!(ran.status.code(), Some(4), "{}\n{}", ran.status, ran.stderr);
    let mut sent: Vec<u64> = ran
        .report
        .iter()
        .filter(|l| l["sent"] == true)
        .map(|l| l["start_ms"].as_u64().unwrap())
        .collect();
    sent.sort_unstable();
    let held = ran.report.len() - sent.len();
    // The 429 lands well within --min-delay, so the three after it
    // would wait about 5 s, more than --max-wait: none of them leaves.
    assert!(held >= 1, "{:?}", ran.report);
    let seen = upstream.recorder().all();
    assert_eq!(seen.len(), sent.len(), "{seen:?}");
    // The rate of the requests that left, as summary.rs computes it.
    let span = sent[sent.len() - 1] - sent[0];
    let rate = format!("{:.2}/s", (sent.len() - 1) as f64 * 1000.0 / span as f64);
    let row: Vec<&str> = ran
        .stdout
        .lines()
        .find(|l| l.starts_with("a.test "))
        .unwrap_or_else(|| panic!("no a.test row:\n{}", ran.stdout))
        .split_whitespace()
        .collect();
    assert_eq!(
        row[1..=2],
        ["5".to_owned(), held.to_string()],
        "requests, errors:\n{}",
        ran.stdout
    );
    assert_eq!(row[4], rate, "the rate column:\n{}", ran.stdout);
    let last_line = ran.stdout.lines().last().unwrap_or_default();
    assert!(
        last_line.starts_with(&format!("{} requests sent, 5 URLs ended", seen.len())),
        "{last_line}"
    );
}

/// Before: a line that is not UTF-8 failed the whole file, and the crawl
/// exited before any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_utf8_line_is_skipped_with_its_number() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let list = dir.path().join("urls.txt");
    let port = upstream.addr().port();
    let mut bytes = format!("http://a.test:{port}/one\n").into_bytes();
    bytes.extend(format!("http://a.test:{port}/bad").bytes());
    bytes.extend(b"\xff\xfe\n");
    bytes.extend(format!("http://a.test:{port}/three\n").bytes());
    std::fs::write(&list, bytes).unwrap();
    let mut args = resolve(&upstream, &["a.test"]);
    args.extend(["--min-delay".into(), "10ms".into(), "--urls".into()]);
    args.push(list.display().to_string());
    let ran = run(dir.path(), &args).await;
    assert!(ran.status.success(), "{}\n{}", ran.status, ran.stderr);
    assert!(
        ran.stderr
            .lines()
            .any(|l| l.contains("urls.txt:2:") && l.contains("not UTF-8")),
        "{}",
        ran.stderr
    );
    let paths: Vec<String> = upstream
        .recorder()
        .all()
        .into_iter()
        .map(|r| r.path)
        .collect();
    assert_eq!(paths, ["/one", "/three"]);
}

/// Before: the summary went out with `println!`, which panics when stdout
/// is a closed pipe (`crawl ... | head`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_the_crawl_quietly() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let mut cmd = crawl();
    cmd.args(resolve(&upstream, &["a.test"]))
        .arg(upstream.url("a.test", "/piped"));
    let mut child = cmd.spawn().expect("start the crawl binary");
    // The reader goes away before the crawl prints anything.
    drop(child.stdout.take());
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the crawl did not finish")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}\n{stderr}", output.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(upstream.recorder().all().len(), 1, "the crawl did not run");
}

/// Before: `--resolve` names were only lowercased, so a name differing
/// from the URL's in a final dot or in its Unicode/punycode form was
/// looked up in DNS instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_names_match_urls_in_any_spelling() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let mut args = resolve(
        &upstream,
        &["A.TEST.", "b.test", "bücher.test", "XN--MNCHEN-3YA.test"],
    );
    args.extend(["--timeout".into(), "5s".into()]);
    args.push(upstream.url("a.test", "/plain"));
    args.push(upstream.url("a.test.", "/dot"));
    args.push(upstream.url("b.test.", "/dot"));
    args.push(upstream.url("xn--bcher-kva.test", "/punycode"));
    args.push(upstream.url("münchen.test", "/unicode"));
    let ran = run(dir.path(), &args).await;
    assert!(ran.status.success(), "{}\n{}", ran.status, ran.stderr);
    assert_eq!(ran.report.len(), 5, "{:?}", ran.report);
    for line in &ran.report {
        assert_eq!(line["status"], 200, "{line}");
    }
    let mut seen: Vec<(String, String)> = upstream
        .recorder()
        .all()
        .into_iter()
        .map(|r| (r.host, r.path))
        .collect();
    seen.sort();
    let expect = [
        ("a.test", "/plain"),
        ("a.test.", "/dot"),
        ("b.test.", "/dot"),
        ("xn--bcher-kva.test", "/punycode"),
        ("xn--mnchen-3ya.test", "/unicode"),
    ]
    .map(|(h, p)| (h.to_owned(), p.to_owned()));
    assert_eq!(seen, expect);
}

/// Before: `--concurrency 0` was accepted, and so were the Redis-only
/// settings without `--redis` (and then ignored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meaningless_flags_exit_2_naming_what_is_wrong() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let cases = [
        (["--concurrency", "0"], "--concurrency"),
        (["--cluster-concurrency", "2"], "--redis"),
        (["--lease-ttl", "5s"], "--redis"),
        (["--scope", "x"], "--redis"),
        (["--fallback", "full"], "--redis"),
        (["--slot-margin", "1ms"], "--redis"),
        (["--max-lateness", "5ms"], "--redis"),
        (["--book-ahead", "10ms"], "--redis"),
        (["--max-lateness", "0"], "would hand back every admission"),
    ];
    for (flag, named) in cases {
        let mut args = resolve(&upstream, &["a.test"]);
        args.extend(flag.map(String::from));
        args.push(upstream.url("a.test", "/never"));
        let ran = run(dir.path(), &args).await;
        assert_eq!(ran.status.code(), Some(2), "{flag:?}: {}", ran.stderr);
        // The message itself, not the usage line that follows it.
        let message = ran.stderr.split("Usage:").next().unwrap_or_default();
        assert!(message.contains(named), "{flag:?}: {}", ran.stderr);
    }
    assert!(upstream.recorder().all().is_empty());
}

/// Before: the report showed URLs as given, password and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_urls_are_redacted() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let mut args = resolve(&upstream, &["a.test"]);
    args.push(upstream.url("user:secret@a.test", "/private"));
    let ran = run(dir.path(), &args).await;
    assert!(ran.status.success(), "{}\n{}", ran.status, ran.stderr);
    let line = line(&ran, "/private");
    let url = line["url"].as_str().unwrap();
    assert!(
        !url.contains("secret") && !url.contains("user:") && url.contains("redacted@"),
        "{line}"
    );
    assert_eq!(line["status"], 200, "{line}");
    // Not redirected: no final URL, although reqwest reports the URL
    // without its credentials.
    assert!(line["final_url"].is_null(), "{line}");
    for text in [&ran.stdout, &ran.stderr] {
        assert!(!text.contains("secret"), "{text}");
    }
    let seen = upstream.recorder().all();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].host.as_str(), seen[0].path.as_str()),
        ("a.test", "/private")
    );
}

/// Before: there was no `--default-penalty`; a 503 without `Retry-After`
/// held nothing back. The run without the flag shows it makes the
/// difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_penalty_holds_a_host_after_a_bare_503() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    // Without the adaptive backoff, which a bare 503 would start too.
    let with_flag = ["--default-penalty", "1s", "--no-backoff"];
    let without = ["--no-backoff"];
    let mut gaps = Vec::new();
    for (host, extra) in [("a.test", &with_flag[..]), ("b.test", &without[..])] {
        let mut args = resolve(&upstream, &[host]);
        args.extend(["--min-delay", "50ms"].map(String::from));
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args.push(upstream.url(host, "/status?code=503"));
        args.push(upstream.url(host, "/next"));
        let ran = run(dir.path(), &args).await;
        assert!(ran.status.success(), "{}\n{}", ran.status, ran.stderr);
        let hold = &line(&ran, "/status?code=503")["hold_ms"];
        assert_eq!(
            *hold,
            if extra.len() == 1 {
                Value::Null
            } else {
                1000.into()
            }
        );
        gaps.push(second_after_first(&upstream, host));
    }
    let (held, paced) = (gaps[0], gaps[1]);
    assert!(held >= 1000 * MS, "with --default-penalty 1s: {held:?}");
    assert!(
        paced + SLACK >= 50 * MS && paced < 500 * MS,
        "without it, at --min-delay 50ms: {paced:?}"
    );
}

/// Before: the report said only `error sending request for url (...)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_error_names_its_root_cause() {
    let _turn = crate::one_at_a_time().await;
    let dir = tempdir();
    let closed = {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        listener.local_addr().unwrap().port()
    };
    let ran = run(
        dir.path(),
        [
            "--resolve".to_owned(),
            "a.test:127.0.0.1".to_owned(),
            format!("http://a.test:{closed}/closed"),
        ],
    )
    .await;
    // Its one URL got no response: the exit code says so.
    assert_eq!(ran.status.code(), Some(4), "{}\n{}", ran.status, ran.stderr);
    let line = line(&ran, "/closed");
    let error = line["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("error sending request") && error.contains("Connection refused"),
        "{line}"
    );
}

/// Before: progress was shown only as a bar on a terminal; piped to a log,
/// a long crawl said nothing until its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_lines_are_logged_when_stderr_is_not_a_terminal() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let mut args = resolve(&upstream, &["a.test"]);
    args.extend(["--min-delay", "100ms", "--progress-every", "200ms"].map(String::from));
    args.extend((0..10).map(|i| upstream.url("a.test", &format!("/p?i={i}"))));
    let ran = run(dir.path(), &args).await;
    assert!(ran.status.success(), "{}\n{}", ran.status, ran.stderr);
    let progress = ran
        .stderr
        .lines()
        .filter(|l| {
            l.contains("progress:") && l.contains("done") && l.contains("pacing in-process")
        })
        .count();
    assert!(progress >= 2, "{progress} progress lines:\n{}", ran.stderr);
    assert_eq!(upstream.recorder().all().len(), 10);
}

/// Before: `--redis rediss://...` failed with "TLS feature not enabled".
/// Two crawls share one pace through a TLS-only Redis whose certificate a
/// CA made for this test issued (`--redis-ca`); the upstream sees them
/// keep it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_pace_through_redis_over_tls() {
    let _turn = crate::one_at_a_time().await;
    let server = redislimit_tests::RedisServer::start_tls();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, server.tls().expect("a TLS server").ca_pem()).unwrap();
    let url = server.url();
    assert!(url.starts_with("rediss://"), "{url}");
    let ca = ca.to_string_lossy().into_owned();
    let args = ["--redis", &url, "--redis-ca", &ca, "--min-delay", "30ms"];
    // Bodies take 60 ms, longer than the gap: only the shared
    // serialization keeps the replicas from overlapping.
    let list = crate::urls(&upstream, &["a.test"], 12, "/slow?chunks=2&every=30");
    let replicas = crate::spawn_all(dir.path(), &upstream, &list, 2, &args);
    crate::finish(replicas).await;
    let seen = upstream.recorder().host("a.test");
    assert_eq!(seen.len(), 12);
    assert!(seen.iter().any(|r| r.replica == 0) && seen.iter().any(|r| r.replica == 1));
    redislimit_tests::record::assert_serialized(&seen, 30 * MS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_file_priorities_order_each_hosts_urls() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    // a.test: five low ones, a high one, one without a priority; b.test's
    // order is its own.
    let mut lines: Vec<String> = (0..5)
        .map(|i| format!("{} 10", upstream.url("a.test", &format!("/?low={i}"))))
        .collect();
    lines.push(format!("{}\t250", upstream.url("a.test", "/?high")));
    lines.push(upstream.url("a.test", "/?plain"));
    lines.push(format!("{} 0", upstream.url("b.test", "/?b")));
    let list = dir.path().join("urls.txt");
    std::fs::write(&list, lines.join("\n")).unwrap();
    let mut args = resolve(&upstream, &["a.test", "b.test"]);
    args.extend(["--min-delay", "20ms", "--urls"].map(String::from));
    args.push(list.to_str().unwrap().to_owned());
    let ran = run(dir.path(), &args).await;
    assert!(ran.status.success(), "{}\n{}", ran.status, ran.stderr);
    let order: Vec<String> = upstream
        .recorder()
        .host("a.test")
        .into_iter()
        .map(|r| r.path)
        .collect();
    let mut expected = vec!["/?high".to_owned(), "/?plain".to_owned()];
    expected.extend((0..5).map(|i| format!("/?low={i}")));
    assert_eq!(order, expected);
    assert_eq!(upstream.recorder().host("b.test").len(), 1);
}

/// A crawl over more hosts than it keeps in play (64 with one slot) sends
/// every URL once, each host's second a `--min-delay` after its first; a
/// `--resolve` pattern sends every name under it to the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_hosts_than_in_play_are_all_crawled_through_a_resolve_pattern() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let dir = tempdir();
    const HOSTS: usize = 150;
    let host = |h: usize| format!("h{h}.many.test");
    let list = dir.path().join("urls.txt");
    let lines: Vec<String> = (0..2)
        .flat_map(|i| (0..HOSTS).map(move |h| (i, h)))
        .map(|(i, h)| upstream.url(&host(h), &format!("/p?i={i}")))
        .collect();
    std::fs::write(&list, lines.join("\n")).unwrap();
    let pattern = format!("*.many.test:{}", upstream.addr().ip());
    let list = list.display().to_string();
    let args = [
        "--resolve",
        &pattern,
        "--urls",
        &list,
        "--concurrency",
        "1",
        "--min-delay",
        "30ms",
    ];
    let ran = run(dir.path(), args).await;
    assert!(ran.status.success(), "{}\n{}", ran.status, ran.stderr);
    assert!(
        ran.stdout.contains(&format!("{} requests sent", 2 * HOSTS)),
        "{}",
        ran.stdout
    );
    for h in 0..HOSTS {
        let apart = second_after_first(&upstream, &host(h));
        assert!(apart >= 30 * MS - SLACK, "{}: {apart:?}", host(h));
    }
}

/// `--report -` writes one JSON line per URL to standard output and
/// nothing else there (the summary goes to stderr); a URL that got no
/// HTTP response (nothing listens on its port) makes the exit code 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_on_stdout_and_exit_4_for_a_url_without_a_response() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let port = {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        closed.local_addr().unwrap().port()
    };
    let mut cmd = crawl();
    cmd.args(resolve(&upstream, &["a.test"]))
        .args(["--report", "-", "--timeout", "5s"])
        .arg(upstream.url("a.test", "/one"))
        .arg(upstream.url("a.test", "/two"))
        .arg(format!("http://127.0.0.1:{port}/refused"));
    let output = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the crawl did not finish")
        .expect("start the crawl binary");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| {
                panic!("standard output holds more than the report: {l:?}: {e}")
            })
        })
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for line in &lines {
        let url = line["url"].as_str().unwrap();
        if url.ends_with("/refused") {
            assert!(
                line["status"].is_null() && line["error"].is_string(),
                "{line}"
            );
        } else {
            assert_eq!(line["status"], 200, "{line}");
        }
    }
    assert_eq!(upstream.recorder().host("a.test").len(), 2);
    assert!(stderr.contains("3 URLs ended"), "{stderr}");
    assert!(stderr.contains("1 without a response"), "{stderr}");
}

/// A report that cannot be written (a full disk: `/dev/full`) stops the
/// crawl: no URL starts after the first line failed, and the exit code is
/// 2. Before, the crawl went on and only said so at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_that_cannot_be_written_stops_the_crawl() {
    let _turn = crate::one_at_a_time().await;
    let upstream = Upstream::start().await;
    let mut cmd = crawl();
    cmd.args(resolve(&upstream, &["a.test"]))
        .args(["--report", "/dev/full", "--min-delay", "200ms"])
        .args((0..20).map(|i| upstream.url("a.test", &format!("/p?i={i}"))));
    let output = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the crawl did not finish")
        .expect("start the crawl binary");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot write the report"), "{stderr}");
    // The first URL's line failed while the second waited its 200 ms.
    let served = upstream.recorder().host("a.test").len();
    assert!((1..=2).contains(&served), "{served} of 20 served");
}

//! A crawl stopped by a signal and resumed from its report: every URL
//! ends exactly once across the two runs, judged by what the upstream
//! served.

use std::collections::BTreeMap;

use redislimit_tests::{RedisServer, Upstream};

use crate::{MS, Replica, exit, read_report, signal, spawn, tempdir};

/// How many lines of `lines` name each URL, those written as not started
/// apart.
fn count(lines: &[serde_json::Value], not_started: bool) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in lines
        .iter()
        .filter(|l| (l["not_started"] == true) == not_started)
    {
        *counts
            .entry(line["url"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    counts
}

/// Three replicas through Redis are sent SIGTERM mid-crawl, then run again
/// with `--resume` (replica 0 adding to its own report, the others writing
/// new ones). The upstream serves every URL exactly once over the two runs;
/// the first reports name every URL (those not started as such), and
/// each URL ends in exactly one line across both reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_then_resume_ends_every_url_exactly_once() {
    let _turn = crate::one_at_a_time().await;
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempdir();
    let lists: Vec<Vec<String>> = (0..3)
        .map(|n| {
            crate::HOSTS
                .iter()
                .flat_map(|host| (0..6).map(move |i| (host, i)))
                .map(|(host, i)| upstream.url(host, &format!("/r{n}?i={i}")))
                .collect()
        })
        .collect();
    let args = ["--redis", &server.url(), "--min-delay", "100ms"];
    let first: Vec<Replica> = lists
        .iter()
        .enumerate()
        .map(|(n, urls)| spawn(dir.path(), n, &upstream, urls, &args))
        .collect();
    // 54 URLs over three hosts at 100 ms: about 1.8 s to the end.
    while upstream.arrivals() < 12 {
        tokio::time::sleep(10 * MS).await;
    }
    for replica in &first {
        signal(replica.child.id().unwrap(), "TERM");
    }
    let mut reports = Vec::new();
    for replica in first {
        let report = replica.report.clone();
        let (code, stderr) = exit(replica).await;
        assert_eq!(code, Some(143), "{stderr}");
        reports.push(read_report(&report));
    }
    let served_first = upstream.recorder().all().len();
    assert!(
        served_first < 54,
        "the signal came too late: all {served_first} served"
    );
    // Every URL is in the first report: ended, or not started.
    for (n, urls) in lists.iter().enumerate() {
        let (ended, unstarted) = (count(&reports[n], false), count(&reports[n], true));
        for url in urls {
            let lines = ended.get(url).unwrap_or(&0) + unstarted.get(url).unwrap_or(&0);
            assert_eq!(lines, 1, "{url} in the first report: {:?}", reports[n]);
        }
    }

    let mut second = Vec::new();
    for (n, urls) in lists.iter().enumerate() {
        let resume = dir.path().join(format!("report-{n}.jsonl"));
        let resume = resume.to_str().unwrap();
        // Replica 0 goes on in its own report; the others write new ones.
        let as_n = if n == 0 { 0 } else { n + 10 };
        let mut extra = args.to_vec();
        extra.extend(["--resume", resume]);
        second.push((n, spawn(dir.path(), as_n, &upstream, urls, &extra)));
    }
    for (n, replica) in second {
        let report = replica.report.clone();
        let (code, stderr) = exit(replica).await;
        assert_eq!(code, Some(0), "{stderr}");
        assert!(stderr.contains("resuming"), "{stderr}");
        let lines = read_report(&report);
        if n == 0 {
            reports[0] = lines;
        } else {
            reports[n].extend(lines);
        }
    }

    // The upstream served each URL once, over both runs.
    let mut served: BTreeMap<String, usize> = BTreeMap::new();
    for request in upstream.recorder().all() {
        *served
            .entry(format!("{}{}", request.host, request.path))
            .or_default() += 1;
    }
    for (n, urls) in lists.iter().enumerate() {
        let ended = count(&reports[n], false);
        for url in urls {
            let key = url.split_once("://").unwrap().1.replacen(
                &format!(":{}", upstream.addr().port()),
                "",
                1,
            );
            assert_eq!(served.get(&key), Some(&1), "{key} served: {served:?}");
            assert_eq!(
                ended.get(url),
                Some(&1),
                "{url} ended in the reports: {:?}",
                reports[n]
            );
        }
    }
    assert_eq!(served.values().sum::<usize>(), 54, "{served:?}");
}

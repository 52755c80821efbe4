//! [`Frontier`]: the URLs a crawl fetches, grouped by host as they are
//! read. A URL read from a file is kept as where its line starts (8 bytes;
//! the line is read again when its turn comes), any other as its text (a
//! third of a parsed `Url`'s size); a repeat is recognised by a 128-bit
//! fingerprint of each URL added, not by a copy of it. A million URLs from
//! a file take about 30 MB, not the 130 MB of their text.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use redislimit::HostKey;
use url::Url;

/// The URLs of a crawl, each host's in the order added, hosts in the order
/// first seen; each URL once.
#[derive(Debug, Default)]
pub struct Frontier {
    hosts: Vec<(String, VecDeque<Kept>)>,
    index: HashMap<String, usize>,
    seen: HashSet<u128>,
    len: usize,
    /// The file the kept lines are in.
    file: Option<Arc<File>>,
    /// URLs an earlier run ended (as its report names them), to be left
    /// out (see [`has_ended`](Frontier::has_ended)).
    ended: HashSet<u128>,
}

/// How a URL is kept until its turn.
#[derive(Debug)]
pub(crate) enum Kept {
    /// Its text.
    Text(Box<str>),
    /// Where its line starts in the frontier's file.
    Line(u64),
}

/// Each host and its URLs, as a crawl takes them.
#[derive(Debug)]
pub(crate) struct Hosts {
    pub(crate) hosts: Vec<(String, VecDeque<Kept>)>,
}

/// Reads URLs kept as lines back from their file.
#[derive(Debug, Clone)]
pub(crate) struct Lines(Option<Arc<File>>);

impl Lines {
    /// The URL `kept` holds; `None` when its line no longer reads as one
    /// (the file changed during the crawl).
    pub(crate) fn url(&self, kept: &Kept) -> Option<Url> {
        match kept {
            Kept::Text(text) => Url::parse(text).ok(),
            Kept::Line(at) => Url::parse(&self.line(*at)?).ok(),
        }
    }

    /// The first word of the line at byte `at` of the file.
    fn line(&self, at: u64) -> Option<String> {
        let file = self.0.as_deref()?;
        let mut buf = vec![0; 512];
        loop {
            let read = read_at(file, &mut buf, at)?;
            let end = buf[..read].iter().position(|&b| b == b'\n');
            if end.is_some() || read < buf.len() {
                let line = std::str::from_utf8(&buf[..end.unwrap_or(read)]).ok()?;
                return line.split_whitespace().next().map(str::to_owned);
            }
            buf.resize(buf.len() * 2, 0);
        }
    }
}

/// Reads `buf.len()` bytes (fewer at the end of the file) at `at`.
#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], at: u64) -> Option<usize> {
    use std::os::unix::fs::FileExt;
    let mut read = 0;
    while read < buf.len() {
        match file.read_at(&mut buf[read..], at + read as u64) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(read)
}

/// Without positioned reads, no URL is kept as a line.
#[cfg(not(unix))]
fn read_at(_: &File, _: &mut [u8], _: u64) -> Option<usize> {
    None
}

/// A URL's fingerprint: two 64-bit SipHashes of its text. Two different
/// URLs share one with a chance of about 2^-128 per pair.
fn fingerprint(url: &str) -> u128 {
    let half = |salt: u8| {
        let mut hasher = std::hash::DefaultHasher::new();
        salt.hash(&mut hasher);
        url.hash(&mut hasher);
        hasher.finish()
    };
    (u128::from(half(0)) << 64) | u128::from(half(1))
}

impl Frontier {
    /// An empty frontier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `url` to its host's URLs; false (and nothing added) when it was
    /// added before.
    pub fn push(&mut self, url: &Url) -> bool {
        self.add(url, Kept::Text(url.as_str().into()))
    }

    /// [`push`](Self::push) for `url` read from the line at byte `at` of
    /// `file`, which keeps only where the line is (where positioned reads
    /// exist). The file must not change while the crawl runs. All the
    /// lines kept are in one file: a frontier given another keeps text.
    pub fn push_line(&mut self, url: &Url, file: &Arc<File>, at: u64) -> bool {
        let same = self.file.get_or_insert_with(|| Arc::clone(file));
        let kept = if cfg!(unix) && Arc::ptr_eq(same, file) {
            Kept::Line(at)
        } else {
            Kept::Text(url.as_str().into())
        };
        self.add(url, kept)
    }

    /// Marks the URL a report names `reported` (credentials redacted, see
    /// [`redact`](crate::redact)) as ended by an earlier run.
    pub fn mark_ended(&mut self, reported: &str) {
        self.ended.insert(fingerprint(reported));
    }

    /// Whether an earlier run ended `url` (see
    /// [`mark_ended`](Self::mark_ended)): a crawl resumed from its report
    /// leaves it out.
    pub fn has_ended(&self, url: &Url) -> bool {
        !self.ended.is_empty() && self.ended.contains(&fingerprint(&crate::redact(url)))
    }

    fn add(&mut self, url: &Url, kept: Kept) -> bool {
        if !self.seen.insert(fingerprint(url.as_str())) {
            return false;
        }
        let host = HostKey::from_url(url)
            .map(|h| h.to_string())
            .unwrap_or_default();
        let at = match self.index.entry(host) {
            Entry::Occupied(at) => *at.get(),
            Entry::Vacant(vacant) => {
                self.hosts.push((vacant.key().clone(), VecDeque::new()));
                *vacant.insert(self.hosts.len() - 1)
            }
        };
        self.hosts[at].1.push_back(kept);
        self.len += 1;
        true
    }

    /// How many URLs it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many hosts its URLs are on.
    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// The URLs, each host's in the order added, hosts in the order first
    /// seen (those kept as lines read back from the file).
    pub fn urls(&self) -> Vec<Url> {
        let lines = Lines(self.file.clone());
        self.hosts
            .iter()
            .flat_map(|(_, urls)| urls.iter().filter_map(|kept| lines.url(kept)))
            .collect()
    }

    /// Each host and its URLs, in order (see [`lines`](Self::lines) to read
    /// them); the fingerprints are let go.
    pub(crate) fn into_hosts(self) -> Hosts {
        Hosts { hosts: self.hosts }
    }

    /// What reads the URLs kept as lines back.
    pub(crate) fn lines(&self) -> Lines {
        Lines(self.file.clone())
    }
}

impl FromIterator<Url> for Frontier {
    fn from_iter<I: IntoIterator<Item = Url>>(urls: I) -> Self {
        let mut frontier = Self::new();
        for url in urls {
            frontier.push(&url);
        }
        frontier
    }
}

impl From<Vec<Url>> for Frontier {
    fn from(urls: Vec<Url>) -> Self {
        urls.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[test]
    fn urls_are_grouped_by_host_in_order_and_added_once() {
        let mut frontier = Frontier::new();
        for text in [
            "http://b.test/1",
            "http://a.test/1",
            "http://B.test/2",
            "http://b.test/1",
            "http://a.test/2",
        ] {
            frontier.push(&url(text));
        }
        assert_eq!(frontier.len(), 4);
        assert_eq!(frontier.hosts(), 2);
        let urls: Vec<String> = frontier.urls().iter().map(|u| u.to_string()).collect();
        assert_eq!(
            urls,
            [
                "http://b.test/1",
                "http://b.test/2",
                "http://a.test/1",
                "http://a.test/2"
            ]
        );
        assert!(!frontier.push(&url("http://a.test/2")), "a repeat");
        let hosts: Vec<String> = frontier
            .into_hosts()
            .hosts
            .into_iter()
            .map(|(h, _)| h)
            .collect();
        assert_eq!(hosts, ["b.test", "a.test"]);
    }

    /// A URL read from a file is kept as where its line starts, and read
    /// back from there, whatever follows it on the line.
    #[test]
    fn urls_kept_as_lines_read_back() {
        let dir = std::env::temp_dir().join(format!("crawl-frontier-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("urls.txt");
        let long = format!("http://b.test/{}", "x".repeat(2_000));
        let text = format!("http://a.test/1 200\n{long}\nhttp://a.test/2");
        std::fs::write(&path, &text).unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        let mut frontier = Frontier::new();
        let mut at = 0;
        for line in text.split('\n') {
            let url = url(line.split_whitespace().next().unwrap());
            assert!(frontier.push_line(&url, &file, at));
            at += line.len() as u64 + 1;
        }
        assert!(!frontier.push_line(&url("http://a.test/2"), &file, 0));
        let urls: Vec<String> = frontier.urls().iter().map(|u| u.to_string()).collect();
        assert_eq!(urls, ["http://a.test/1", "http://a.test/2", long.as_str()]);
        let hosts = frontier.into_hosts();
        assert!(hosts.hosts[0].1.iter().all(|k| matches!(k, Kept::Line(_))));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn fingerprints_differ_for_near_urls() {
        let a = fingerprint("http://a.test/1");
        assert_ne!(a, fingerprint("http://a.test/2"));
        assert_ne!(a, fingerprint("http://a.test/1/"));
        assert_eq!(a, fingerprint("http://a.test/1"));
    }
}

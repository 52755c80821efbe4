//! Where the URLs come from: the command line and a file (or stdin).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use redislimit::HostKey;
use url::Url;

use crate::Frontier;

/// The URLs to fetch, and the lines that were skipped (with why).
#[derive(Debug, Default)]
pub struct Input {
    /// Distinct URLs, grouped by host: each host's in the order read,
    /// hosts in the order first seen.
    pub urls: Frontier,
    /// `FILE:LINE: why` for every line that was not used.
    pub skipped: Vec<String>,
    /// The priorities lines gave (`URL PRIORITY`); the others have the
    /// default.
    pub priorities: std::collections::HashMap<Url, u8>,
    /// URLs left out because an earlier run ended them (see
    /// [`resume_from`]).
    pub resumed: usize,
}

/// An input that leaves out the URLs the report at `path` holds as ended
/// (fetched, failed, or skipped by robots.txt; not those written as
/// `not_started`): [`read_urls_into`] it to resume a crawl. A line of the
/// report that cannot be read (cut short when its replica was killed) is
/// counted in `skipped`, and its URL fetched again.
pub fn resume_from(path: &Path) -> anyhow::Result<Input> {
    let context = || format!("cannot read the report {}", path.display());
    let file = std::fs::File::open(path).with_context(context)?;
    let mut input = Input::default();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.with_context(context)?;
        if line.trim().is_empty() {
            continue;
        }
        let value = serde_json::from_str::<serde_json::Value>(&line).ok();
        match value.as_ref().and_then(|v| Some((v["url"].as_str()?, v))) {
            Some((url, v)) if v["not_started"] != true => input.urls.mark_ended(url),
            Some(_) => {}
            None => input.skipped.push(format!(
                "{}:{}: not a report line; its URL is fetched again",
                path.display(),
                n + 1
            )),
        }
    }
    Ok(input)
}

/// A file line: a URL, optionally followed by whitespace and a priority
/// from 0 to 255 (higher goes first among its host's URLs; 128 when
/// absent).
pub(crate) fn check_line(text: &str) -> Result<(Url, Option<u8>), String> {
    let mut words = text.split_whitespace();
    let url = check(words.next().unwrap_or_default())?;
    let priority = match words.next() {
        None => None,
        Some(word) => Some(
            word.parse::<u8>()
                .map_err(|_| format!("{word:?} is not a priority from 0 to 255"))?,
        ),
    };
    if words.next().is_some() {
        return Err("a line is a URL and at most a priority".into());
    }
    Ok((url, priority))
}

/// `text` as a URL the crawl can fetch: it parses, is http(s), and has a
/// host key; otherwise why not.
pub fn check(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{text:?} is not an http(s) URL"));
    }
    HostKey::from_url(&url).map_err(|e| e.to_string())?;
    Ok(url)
}

/// Reads the URLs given as arguments (a bad one is an error: it was typed
/// by hand) and those in `file` (`-` for stdin; a bad line is skipped and
/// reported with its line number). A URL seen twice is fetched once.
pub fn read_urls(args: &[String], file: Option<&Path>) -> anyhow::Result<Input> {
    read_urls_into(Input::default(), args, file)
}

/// [`read_urls`] into `input`, leaving out the URLs it holds as ended
/// (see [`resume_from`]).
pub fn read_urls_into(
    mut input: Input,
    args: &[String],
    file: Option<&Path>,
) -> anyhow::Result<Input> {
    for arg in args {
        match check(arg) {
            Ok(url) if input.urls.has_ended(&url) => input.resumed += 1,
            Ok(url) => {
                input.urls.push(&url);
            }
            Err(why) => bail!("invalid URL: {why}"),
        }
    }
    let Some(path) = file else { return Ok(input) };
    let context = || format!("cannot read {}", path.display());
    if path == Path::new("-") {
        let reader = BufReader::new(std::io::stdin());
        read_lines(reader, &path.display(), &mut input).with_context(context)?;
    } else {
        // The URLs are kept as where their lines start, and read again
        // from this handle when their turn comes.
        let file = Arc::new(std::fs::File::open(path).with_context(context)?);
        let reader = BufReader::new(file.try_clone().with_context(context)?);
        read_from(reader, &path.display(), &mut input, Some(&file)).with_context(context)?;
    }
    Ok(input)
}

/// Adds the URLs of the lines of `reader` to `input`, those it holds
/// already skipped as repeats: what [`read_urls`] does with its file, named
/// `name` in the `skipped` lines. Blank lines and `#` comments are ignored;
/// a line that is not UTF-8 or not a URL (and optional priority) is
/// skipped with its line number.
pub fn read_lines(
    reader: impl BufRead,
    name: &dyn std::fmt::Display,
    input: &mut Input,
) -> std::io::Result<()> {
    read_from(reader, name, input, None)
}

/// [`read_lines`], keeping each URL as where its line starts in `file`
/// (which `reader` reads from its start) when given.
fn read_from(
    mut reader: impl BufRead,
    name: &dyn std::fmt::Display,
    input: &mut Input,
    file: Option<&Arc<std::fs::File>>,
) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    let mut at = 0_u64;
    for n in 0_u64.. {
        bytes.clear();
        let read = reader.read_until(b'\n', &mut bytes)?;
        if read == 0 {
            break;
        }
        let line_at = at;
        at += read as u64;
        // One undecodable line is skipped, not the whole file.
        let Ok(line) = std::str::from_utf8(&bytes) else {
            input.skipped.push(format!("{name}:{}: not UTF-8", n + 1));
            continue;
        };
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let added = |input: &mut Input, url: &Url| match file {
            // The line's first word is the URL (leading blanks aside).
            Some(file) => {
                let blanks = (line.len() - line.trim_start().len()) as u64;
                input.urls.push_line(url, file, line_at + blanks)
            }
            None => input.urls.push(url),
        };
        match check_line(text) {
            Ok((url, _)) if input.urls.has_ended(&url) => input.resumed += 1,
            Ok((url, priority)) if added(input, &url) => {
                if let Some(priority) = priority {
                    input.priorities.insert(url, priority);
                }
            }
            Ok(_) => input
                .skipped
                .push(format!("{name}:{}: a repeat of an earlier URL", n + 1)),
            Err(why) => input.skipped.push(format!("{name}:{}: {why}", n + 1)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_lines_are_checked_one_by_one() {
        let dir = std::env::temp_dir().join(format!("crawl-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("urls.txt");
        std::fs::write(
            &path,
            "# comment\n\nhttp://a.test/1\nnot a url\nmailto:x@y.z\nhttp://a.test/1\n  https://b.test/2  \nftp://c.test/\n",
        )
        .unwrap();
        let input = read_urls(&["http://c.test/0".into()], Some(&path)).unwrap();
        let urls: Vec<String> = input.urls.urls().iter().map(Url::to_string).collect();
        assert_eq!(
            urls,
            ["http://c.test/0", "http://a.test/1", "https://b.test/2"]
        );
        assert_eq!(input.skipped.len(), 4, "{:?}", input.skipped);
        assert!(input.skipped[0].contains(":4:"), "{:?}", input.skipped);
        assert!(input.skipped[1].contains(":5:"));
        assert!(input.skipped[2].contains(":6: a repeat"));
        assert!(input.skipped[3].contains(":8:"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_line_may_end_with_a_priority() {
        let dir = std::env::temp_dir().join(format!("crawl-prio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("urls.txt");
        std::fs::write(
            &path,
            "http://a.test/1 200
http://a.test/2
http://a.test/3	0
http://a.test/4 high
http://a.test/5 1 2
http://a.test/6 256
",
        )
        .unwrap();
        let input = read_urls(&[], Some(&path)).unwrap();
        let urls: Vec<String> = input.urls.urls().iter().map(Url::to_string).collect();
        assert_eq!(
            urls,
            ["http://a.test/1", "http://a.test/2", "http://a.test/3"]
        );
        let p = |u: &str| input.priorities.get(&Url::parse(u).unwrap()).copied();
        assert_eq!(p("http://a.test/1"), Some(200));
        assert_eq!(p("http://a.test/2"), None);
        assert_eq!(p("http://a.test/3"), Some(0));
        assert_eq!(input.skipped.len(), 3, "{:?}", input.skipped);
        assert!(input.skipped[0].contains(":4: \"high\" is not a priority"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_undecodable_line_is_skipped_with_its_number() {
        let dir = std::env::temp_dir().join(format!("crawl-utf8-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("urls.txt");
        std::fs::write(
            &path,
            b"http://a.test/1\nhttp://a.test/\xff\xfe\r\nhttp://a.test/3",
        )
        .unwrap();
        let input = read_urls(&[], Some(&path)).unwrap();
        let urls: Vec<String> = input.urls.urls().iter().map(Url::to_string).collect();
        assert_eq!(urls, ["http://a.test/1", "http://a.test/3"]);
        assert_eq!(input.skipped.len(), 1, "{:?}", input.skipped);
        assert!(
            input.skipped[0].ends_with(":2: not UTF-8"),
            "{:?}",
            input.skipped
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A resumed input leaves out what the report holds as ended (by its
    /// redacted form for a URL with credentials), fetches what it holds as
    /// not started, and fetches again a URL whose line is cut short.
    #[test]
    fn a_resumed_input_leaves_out_what_the_report_ended() {
        let dir = std::env::temp_dir().join(format!("crawl-resume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let report = dir.join("report.jsonl");
        std::fs::write(
            &report,
            concat!(
                r#"{"url":"http://a.test/1","status":200,"not_started":false}"#,
                "\n",
                r#"{"url":"http://redacted@a.test/2","status":null,"error":"refused"}"#,
                "\n",
                r#"{"url":"http://a.test/3","not_started":true}"#,
                "\n",
                r#"{"url":"http://a.test/4","sta"#,
            ),
        )
        .unwrap();
        let urls = dir.join("urls.txt");
        std::fs::write(
            &urls,
            "http://a.test/1\nhttp://user:pw@a.test/2\nhttp://a.test/3\nhttp://a.test/4\nhttp://a.test/5\n",
        )
        .unwrap();
        let input = read_urls_into(resume_from(&report).unwrap(), &[], Some(&urls)).unwrap();
        let left: Vec<String> = input.urls.urls().iter().map(Url::to_string).collect();
        assert_eq!(
            left,
            ["http://a.test/3", "http://a.test/4", "http://a.test/5"]
        );
        assert_eq!(input.resumed, 2);
        assert_eq!(input.skipped.len(), 1, "{:?}", input.skipped);
        assert!(
            input.skipped[0].contains(":4: not a report line"),
            "{:?}",
            input.skipped
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_bad_argument_or_a_missing_file_is_an_error() {
        assert!(read_urls(&["nope".into()], None).is_err());
        let err = read_urls(&[], Some(Path::new("/nonexistent/urls.txt"))).unwrap_err();
        assert!(format!("{err:#}").contains("cannot read /nonexistent/urls.txt"));
    }
}

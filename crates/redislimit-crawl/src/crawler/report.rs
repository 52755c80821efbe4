//! The `--report`: one JSON object per URL, a line each, to a file or to
//! standard output.

use std::fs::{File, OpenOptions};
use std::io::{LineWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use serde::Serialize;

/// Where the report's lines go. A line that cannot be written is an
/// error the crawl stops on: a report that misses URLs would make a
/// resumed crawl fetch them again.
pub(super) struct Report {
    out: Mutex<LineWriter<Box<dyn Write + Send>>>,
    failed: AtomicBool,
}

impl Report {
    /// The report at `path`: standard output for `-`, else the file,
    /// created (emptied when it exists), or added to when `append`.
    pub(super) fn open(path: &Path, append: bool) -> anyhow::Result<Self> {
        let out: Box<dyn Write + Send> = if path == Path::new("-") {
            Box::new(std::io::stdout())
        } else {
            let file = if append {
                OpenOptions::new().create(true).append(true).open(path)
            } else {
                File::create(path)
            };
            Box::new(file.with_context(|| format!("cannot write {}", path.display()))?)
        };
        Ok(Self {
            out: Mutex::new(LineWriter::new(out)),
            failed: AtomicBool::new(false),
        })
    }

    /// Writes `fetched` as one line; the error when it could not be (after
    /// a first failure every line is refused, so the report never has a
    /// hole in the middle).
    pub(super) fn write(&self, fetched: &Fetched) -> Result<(), String> {
        if self.failed() {
            return Err("an earlier line could not be written".to_owned());
        }
        let line = serde_json::to_string(fetched).map_err(|e| e.to_string())?;
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        writeln!(out, "{line}").map_err(|err| {
            self.failed.store(true, Ordering::Relaxed);
            err.to_string()
        })
    }

    /// Whether a line could not be written.
    pub(super) fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
}

/// What happened to one URL; one line of the `--report` file.
#[derive(Debug, Clone, Serialize)]
pub struct Fetched {
    /// The URL (with any user name and password redacted).
    pub url: String,
    /// Its host key (the limiter's key: the registrable domain or
    /// `host:port` with `--key-by domain` or `host-port`).
    pub host: String,
    /// The response status, when there was a response.
    pub status: Option<u16>,
    /// Why there was no (complete) response, with its causes.
    pub error: Option<String>,
    /// Whether the request left (an error before sending, such as a
    /// blown `--max-wait`, leaves it false).
    pub sent: bool,
    /// When the request was sent (Unix epoch milliseconds).
    pub start_ms: u64,
    /// When the body had been read to the end, or the request failed.
    pub end_ms: u64,
    /// How long it waited for its host's turn.
    pub waited_ms: u64,
    /// The delay a `Retry-After` header asked for, if any (saturating).
    pub retry_after_ms: Option<u64>,
    /// The hold the host was given for this response: what it asked for
    /// (or `--default-penalty`, or the backoff), capped by `--max-penalty`.
    pub hold_ms: Option<u64>,
    /// Why it was held: `retry-after`, `budget-spent`, `budget-low`,
    /// `default-penalty`, `backoff` or `recovering` (see
    /// `redislimit::http::ServerSignal::cause`).
    pub asked: Option<String>,
    /// The URLs redirected from, in order (redacted).
    pub redirects: Vec<String>,
    /// The URL of the last response, when it differs from `url`.
    pub final_url: Option<String>,
    /// Why it was not tried (robots.txt), when it was not; not an error.
    pub skipped: Option<String>,
    /// Not started: the crawl was stopped (a signal, an error it cannot go
    /// on after) before this URL's turn; a crawl resumed from this report
    /// (`--resume`) fetches it.
    pub not_started: bool,
}

//! The progress line and its counters: URLs done and sent, hosts waiting
//! for their turns, hosts held back by a penalty.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Counters for the progress line.
#[derive(Debug, Default)]
pub(super) struct Progress {
    pub(super) done: AtomicUsize,
    pub(super) sent: AtomicUsize,
    /// Hosts whose next URL is waiting for its turn.
    pub(super) waiting: AtomicUsize,
    /// Hosts held back by a penalty, until when.
    pub(super) penalized: Mutex<HashMap<String, Instant>>,
}

impl Progress {
    pub(super) fn penalized_now(&self) -> usize {
        let now = Instant::now();
        let mut held = self
            .penalized
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.retain(|_, until| *until > now);
        held.len()
    }
}

/// A host whose head URL waits for its turn, counted while it lives.
pub(super) struct Waiting<'a>(&'a Progress);

impl<'a> Waiting<'a> {
    pub(super) fn new(counters: &'a Progress) -> Self {
        counters.waiting.fetch_add(1, Ordering::Relaxed);
        Self(counters)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts the host of a response that asked for a long hold as penalized.
pub(super) fn note_penalty(
    counters: &Progress,
    host: &str,
    hold_ms: Option<u64>,
    max_penalty: Duration,
) {
    if let Some(hold) = hold_ms {
        let hold = Duration::from_millis(hold).min(max_penalty);
        if hold >= Duration::from_secs(1) {
            note_hold(counters, host, hold);
        }
    }
}

pub(super) fn note_hold(counters: &Progress, host: &str, hold: Duration) {
    let until = Instant::now() + hold;
    let mut held = counters
        .penalized
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let entry = held.entry(host.to_owned()).or_insert(until);
    *entry = (*entry).max(until);
}

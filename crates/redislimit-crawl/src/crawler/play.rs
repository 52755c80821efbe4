//! [`Play`]: which hosts a crawl is working on. Not all of its hosts at
//! once: each host in play holds a task, its next URL's wait, and (through
//! the HTTP client) a connection kept for its next request, so a crawl
//! over 100,000 hosts that started them all held a connection and a task
//! for each, gigabytes for a million URLs, and reused few connections. A
//! few hosts per `--concurrency` slot are in play; the next comes in when
//! one has sent its last URL, and more come in while slots are free that
//! no URL asks for (every host in play waiting for its turn).

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::frontier::{Hosts, Kept};

/// Hosts in play per `--concurrency` slot, before any widening.
const PER_SLOT: usize = 16;

/// The fewest hosts in play.
const AT_LEAST: usize = 64;

/// How often free slots that nobody asks for bring more hosts into play.
pub(super) const FEED_EVERY: Duration = Duration::from_millis(10);

/// The hosts of a crawl not yet in play, and those in play, each sending
/// what becomes of its URLs as `T`.
pub(super) struct Play<T> {
    waiting: std::vec::IntoIter<(String, VecDeque<Kept>)>,
    playing: JoinSet<()>,
    /// How many hosts to keep in play; widened while slots go unasked.
    width: usize,
    /// Handed to each host in play; dropped once every host has come into
    /// play, so the results' channel ends with the last of them.
    tx: Option<mpsc::UnboundedSender<T>>,
}

impl<T: Send + 'static> Play<T> {
    pub(super) fn new(hosts: Hosts, tx: mpsc::UnboundedSender<T>, concurrency: usize) -> Self {
        Self {
            waiting: hosts.hosts.into_iter(),
            playing: JoinSet::new(),
            width: concurrency.saturating_mul(PER_SLOT).max(AT_LEAST),
            tx: Some(tx),
        }
    }

    /// Brings hosts into play until `width` are, each served by the task
    /// `serve` makes of it (its name, its URLs and where to send what
    /// becomes of them); none once the crawl is not `running`.
    pub(super) fn fill<F>(
        &mut self,
        running: bool,
        serve: &mut impl FnMut(String, VecDeque<Kept>, mpsc::UnboundedSender<T>) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        while self.playing.len() < self.width {
            let next = if running { self.waiting.next() } else { None };
            let (Some((host, queue)), Some(tx)) = (next, &self.tx) else {
                // Nothing left to bring in: the channel ends with the
                // hosts in play.
                self.tx = None;
                return;
            };
            self.playing.spawn(serve(host, queue, tx.clone()));
        }
    }

    /// Widens the play by `idle` (slots free that no URL asks for, so
    /// every host in play waits for its turn) and fills it.
    pub(super) fn widen<F>(
        &mut self,
        idle: usize,
        running: bool,
        serve: &mut impl FnMut(String, VecDeque<Kept>, mpsc::UnboundedSender<T>) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        if idle > 0 && self.tx.is_some() && self.playing.len() >= self.width {
            self.width += idle;
        }
        self.fill(running, serve);
    }

    /// The hosts that never came into play (the crawl stopped first), and
    /// their URLs.
    pub(super) fn rest(self) -> impl Iterator<Item = (String, VecDeque<Kept>)> {
        self.waiting
    }

    /// Resolves when a host in play has sent its last URL (never while
    /// none is in play).
    pub(super) async fn host_done(&mut self) {
        if self.playing.join_next().await.is_none() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(hosts: usize) -> Hosts {
        (0..hosts)
            .map(|h| url::Url::parse(&format!("http://h{h}.test/")).unwrap())
            .collect::<crate::Frontier>()
            .into_hosts()
    }

    /// Hosts come into play up to the width, one more as each leaves, more
    /// while slots go unasked; the channel ends with the last host.
    #[tokio::test]
    async fn hosts_come_into_play_a_few_at_a_time() {
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        // One slot: the fewest hosts in play, 64 of 100.
        let mut play = Play::new(hosts(100), tx, 1);
        let (release, _) = tokio::sync::broadcast::channel::<()>(1);
        let mut serve = |host: String, _: VecDeque<Kept>, tx: mpsc::UnboundedSender<String>| {
            let mut go = release.subscribe();
            async move {
                let _ = go.recv().await;
                let _ = tx.send(host);
            }
        };
        play.fill(true, &mut serve);
        assert_eq!(play.playing.len(), AT_LEAST);
        play.widen(0, true, &mut serve);
        assert_eq!(play.playing.len(), AT_LEAST, "no idle slot, no wider");
        play.widen(3, true, &mut serve);
        assert_eq!(play.playing.len(), AT_LEAST + 3);
        // A stopping crawl brings no host in, and lets the channel go.
        play.widen(40, false, &mut serve);
        assert_eq!(play.playing.len(), AT_LEAST + 3);
        assert!(play.tx.is_none());
        release.send(()).unwrap();
        let mut served = 0;
        while rx.recv().await.is_some() {
            served += 1;
        }
        assert_eq!(served, AT_LEAST + 3);
    }
}

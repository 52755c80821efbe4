//! [`StallProxy`]: a TCP proxy on loopback that can stall or slow the
//! traffic it carries, as a congested or paused network path would.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Forwards every connection made to it to one target. While stalled, it
/// keeps accepting connections and reading, but holds every byte (both
/// ways, or one way) until it is resumed: nothing is lost, everything
/// arrives late. While it delays replies, each piece the target sends is
/// held for its own random time within a range, in order. A cut closes
/// every connection open, and what it held is lost.
///
/// Stops when dropped.
#[derive(Debug)]
pub struct StallProxy {
    addr: SocketAddr,
    /// What is held.
    stalled: watch::Sender<Held>,
    /// How many cuts were made.
    cuts: watch::Sender<u64>,
    server: JoinHandle<()>,
}

impl StallProxy {
    /// Starts a proxy to `target` on a free loopback port, on the current
    /// Tokio runtime.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stalled, _) = watch::channel(Held::Nothing);
        let (cuts, _) = watch::channel(0);
        let (gate, cutter) = (stalled.clone(), cuts.clone());
        let server = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let gate = gate.subscribe();
                let mut cut = cutter.subscribe();
                tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect(target).await else {
                        return;
                    };
                    // As the client and the server set theirs: Nagle's
                    // algorithm would hold a command's last piece for the
                    // other side's delayed ACK (40 ms), and lateness
                    // measured through the proxy would be the proxy's.
                    let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
                    let (cr, cw) = client.into_split();
                    let (ur, uw) = upstream.into_split();
                    let pumps = async {
                        tokio::join!(pump(cr, uw, gate.clone(), false), pump(ur, cw, gate, true))
                    };
                    // A cut drops both sockets, and the bytes held: looked
                    // at first, so that a resume right after it lets
                    // nothing held through.
                    tokio::select! {
                        biased;
                        _ = cut.changed() => {}
                        _ = pumps => {}
                    }
                });
            }
        });
        Self {
            addr,
            stalled,
            cuts,
            server,
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A `redis://` URL for the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Holds all traffic from now on, until [`resume`](Self::resume).
    pub fn stall(&self) {
        self.stalled.send_replace(Held::BothWays);
    }

    /// Holds the target's replies from now on, until
    /// [`resume`](Self::resume); what clients send still goes through, so
    /// the target acts at once and its answers arrive late.
    pub fn stall_replies(&self) {
        self.stalled.send_replace(Held::Replies);
    }

    /// Holds what clients send from now on, until [`resume`](Self::resume);
    /// the target's replies still come through.
    pub fn stall_requests(&self) {
        self.stalled.send_replace(Held::Requests);
    }

    /// Closes every connection open now, losing what they held; new ones
    /// are carried as before (stalled if the proxy is).
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Holds each reply of the target from now on for a random time
    /// between `least` and `most` (each piece of it as it arrives, in
    /// order: a piece never overtakes the one before), until
    /// [`resume`](Self::resume): a Redis slow to answer, or a slow path
    /// back from it.
    pub fn delay_replies(&self, least: Duration, most: Duration) {
        self.stalled.send_replace(Held::Delayed {
            least,
            most: most.max(least),
        });
    }

    /// Lets the held traffic through and carries on.
    pub fn resume(&self) {
        self.stalled.send_replace(Held::Nothing);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// What a [`StallProxy`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Nothing,
    BothWays,
    /// The target's replies only.
    Replies,
    /// What clients send only.
    Requests,
    /// Nothing, but each reply is delayed by a random time in this range.
    Delayed {
        least: Duration,
        most: Duration,
    },
}

/// Copies `from` to `to` (the target's `replies`, or what clients send),
/// holding each read while the gate holds that direction.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: watch::Receiver<Held>,
    replies: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let arrived = tokio::time::Instant::now();
        let mut delay = Duration::ZERO;
        if gate
            .wait_for(|held| match *held {
                Held::Nothing => true,
                Held::BothWays => false,
                Held::Replies => !replies,
                Held::Requests => replies,
                Held::Delayed { least, most } => {
                    if replies {
                        delay = between(&mut seed, least, most);
                    }
                    true
                }
            })
            .await
            .is_err()
        {
            break;
        }
        // Held its own time after it was read. What comes meanwhile waits
        // in the socket and is read after: a connection that carries one
        // call at a time (a pooled Redis connection) has each reply delayed
        // within the range.
        tokio::time::sleep_until(arrived + delay).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A pseudo-random time in `least..=most` (xorshift on `seed`).
fn between(seed: &mut u64, least: Duration, most: Duration) -> Duration {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    let span = u64::try_from((most - least).as_micros()).unwrap_or(u64::MAX);
    least + Duration::from_micros(*seed % span.saturating_add(1))
}

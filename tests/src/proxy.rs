//! [`StallProxy`]: a TCP proxy on loopback that can stall the traffic it
//! carries, as a congested or paused network path would.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Forwards every connection made to it to one target. While stalled, it
/// keeps accepting connections and reading, but holds every byte (both
/// ways, or only the target's replies) until it is resumed: nothing is
/// lost, everything arrives late.
///
/// Stops when dropped.
#[derive(Debug)]
pub struct StallProxy {
    addr: SocketAddr,
    /// What is held: [`BOTH_WAYS`] and/or [`REPLIES`].
    stalled: watch::Sender<u8>,
    server: JoinHandle<()>,
}

impl StallProxy {
    /// Starts a proxy to `target` on a free loopback port, on the current
    /// Tokio runtime.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stalled, _) = watch::channel(0);
        let gate = stalled.clone();
        let server = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let gate = gate.subscribe();
                tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (ur, uw) = upstream.into_split();
                    tokio::join!(
                        pump(cr, uw, gate.clone(), BOTH_WAYS),
                        pump(ur, cw, gate, BOTH_WAYS | REPLIES)
                    );
                });
            }
        });
        Self {
            addr,
            stalled,
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
        self.stalled.send_replace(BOTH_WAYS);
    }

    /// Holds the target's replies from now on, until
    /// [`resume`](Self::resume); what clients send still goes through, so
    /// the target acts at once and its answers arrive late.
    pub fn stall_replies(&self) {
        self.stalled.send_replace(REPLIES);
    }

    /// Lets the held traffic through and carries on.
    pub fn resume(&self) {
        self.stalled.send_replace(0);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A stall of both directions.
const BOTH_WAYS: u8 = 1;
/// A stall of the target's replies only.
const REPLIES: u8 = 2;

/// Copies `from` to `to`, holding each read while the gate holds any of
/// the stalls in `held_by`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: watch::Receiver<u8>,
    held_by: u8,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if gate
            .wait_for(|stalled| stalled & held_by == 0)
            .await
            .is_err()
        {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

//! Lease renewal: how a held permit keeps its slot in Redis.
//!
//! A permit renews its lease every `lease_ttl / 2`. A renewal that fails
//! (Redis slow, unreachable, a stalled connection) is retried at once with
//! a short backoff, for as long as the lease may still be alive, so only a
//! stall longer than the time left on the lease can lose the slot. A lost
//! lease (Redis says the token no longer holds its slot) is reported
//! through [`Hooks::on_error`](crate::Hooks::on_error) with
//! [`Op::Renew`] and a `tracing` warning.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::Cmd;
use tokio::time::Instant;

use super::keys::RedisKeys;
use super::limiter::{Args, Shared, unavailable};
use super::script::RENEW;
use crate::pacing::after;
use crate::{Error, Op};

/// The first retry after a failed renewal; each next one waits twice as long.
const FIRST_RETRY: Duration = Duration::from_millis(20);

impl Shared {
    /// Renews the lease while the permit is held (this task is aborted when
    /// it is released).
    pub(super) async fn renew_until_released(
        self: Arc<Self>,
        keys: Arc<RedisKeys>,
        token: Arc<str>,
        args: Args,
    ) {
        let period = self.lease_ttl / 2;
        // A renewal's effect starts no earlier than when it was asked for,
        // so `asked + lease_ttl` is a lower bound of the lease deadline.
        let mut alive_until = after(Instant::now(), self.lease_ttl);
        let mut next = after(Instant::now(), period);
        let mut retry = FIRST_RETRY;
        let mut failing = false;
        let mut past_deadline = false;
        loop {
            tokio::time::sleep_until(next).await;
            let asked = Instant::now();
            // Bounded, so a call that hangs (a pool without timeouts) cannot
            // keep the next attempt from being made in time.
            let bound = after(asked, period.max(FIRST_RETRY));
            let renewed =
                match tokio::time::timeout_at(bound, self.renew(&keys, &token, args)).await {
                    Ok(renewed) => renewed,
                    Err(_) => Err(Error::unavailable(
                        Op::Renew,
                        "Redis did not answer the renewal in time",
                    )),
                };
            match renewed {
                Ok(true) => {
                    if failing {
                        tracing::info!(gate = %keys.gate, "lease renewed after failed attempts");
                    }
                    failing = false;
                    past_deadline = false;
                    alive_until = after(asked, self.lease_ttl);
                    next = after(asked, period);
                    retry = FIRST_RETRY;
                }
                Ok(false) => {
                    let err = Error::unavailable(
                        Op::Renew,
                        "the lease had lapsed before it was renewed; its slot may be taken",
                    );
                    tracing::warn!(gate = %keys.gate, "lease lost");
                    self.hooks.on_lease_lost(&keys.gate);
                    self.hooks.on_error(Op::Renew, &err);
                    return;
                }
                Err(err) => {
                    let now = Instant::now();
                    if !failing {
                        tracing::warn!(gate = %keys.gate, error = %crate::Causes(&err), "lease renewal failed; retrying");
                        self.hooks.on_error(Op::Renew, &err);
                    }
                    failing = true;
                    if now >= alive_until && !past_deadline {
                        past_deadline = true;
                        tracing::warn!(gate = %keys.gate, "lease renewal failed until the lease deadline; its slot may be taken");
                    }
                    // Retry soon, and keep retrying: while the lease may be
                    // alive every attempt can save it, and after that the
                    // answer says whether it survived.
                    next = after(now, retry);
                    retry = (retry * 2).min((self.lease_ttl / 8).max(FIRST_RETRY));
                }
            }
        }
    }

    /// One renewal: whether the token still held its slot.
    async fn renew(&self, keys: &RedisKeys, token: &str, args: Args) -> Result<bool, Error> {
        let renewed = RENEW
            .run::<i64>(&self.redis, &keys.all()[..2], |cmd: &mut Cmd| {
                cmd.arg(token)
                    .arg(args.cap)
                    .arg(self.lease_ttl_us)
                    .arg(args.min_delay_us)
                    .arg(args.weight);
            })
            .await;
        self.circuit.observe(&renewed);
        renewed
            .map(|n| n == 1)
            .map_err(|e| unavailable(Op::Renew, e))
    }
}

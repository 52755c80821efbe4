//! acquire.lua's arguments and replies (its header says what each is).

use deadpool_redis::redis::{Cmd, FromRedisValue, ParsingError, Value};
use tokio::time::Instant;

use super::{ACQUIRE, ScriptError};
use crate::redis::keys::RedisKeys;
use crate::redis::pool::Connections;
use crate::redis::settings::Args;

/// What acquire.lua answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Admitted when Redis's clock read `now_us`, for a send `ahead_us`
    /// later (0: at once).
    Admitted { now_us: u64, ahead_us: u64 },
    /// No send for `wait_us`; `full` when the in-flight cap is taken.
    Wait { wait_us: u64, full: bool },
    /// This acquire had been abandoned (its call timed out) before it ran.
    Voided,
    /// The host's state was garbage and was replaced, holding the host for
    /// `wait_us` (`lease_ttl`).
    Healed { wait_us: u64 },
}

/// The reply as three integers: an admission at once comes as the Redis
/// clock alone (an integer reply costs the server less than a table) and
/// reads as `[1, now, 0]`. Read without an allocation; a reply of another
/// length is kept whole, for [`decode`] to refuse.
enum Raw {
    Three([i64; 3]),
    Other(Vec<i64>),
}

impl Raw {
    fn as_slice(&self) -> &[i64] {
        match self {
            Self::Three(three) => three,
            Self::Other(other) => other,
        }
    }
}

impl FromRedisValue for Raw {
    fn from_redis_value_ref(v: &Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(now) => Ok(Self::Three([1, *now, 0])),
            Value::Array(items) if items.len() == 3 => {
                let mut three = [0; 3];
                for (n, item) in three.iter_mut().zip(items) {
                    *n = i64::from_redis_value_ref(item)?;
                }
                Ok(Self::Three(three))
            }
            other => Vec::from_redis_value_ref(other).map(Self::Other),
        }
    }

    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        Self::from_redis_value_ref(&v)
    }
}

/// Runs acquire.lua for `token` on `keys` under `args`, booked ahead when
/// its wait is at most `horizon_us`; with when its call was sent.
pub(crate) async fn run(
    redis: &Connections,
    keys: &RedisKeys,
    token: &str,
    args: &Args,
    lease_ttl_us: u64,
    horizon_us: u64,
) -> (Result<Reply, ScriptError>, Instant) {
    let (reply, sent) = ACQUIRE
        .run_timed::<Raw>(redis, &keys.all(), |cmd: &mut Cmd| {
            cmd.arg(token)
                .arg(args.min_delay_us)
                .arg(args.mode.script_cap())
                .arg(lease_ttl_us)
                .arg(args.quota)
                .arg(args.window_us)
                .arg(args.max_wait_us)
                .arg(args.weight)
                .arg(horizon_us)
                .arg(args.bucket_us)
                // Heavier requests stay out of the line (best fit).
                .arg(if args.weight > 1 { 0 } else { args.patience_us })
                .arg(args.room_us);
            if args.shun_n > 0 {
                // The lapsed replicas' turns: the tolerance of a turn, then
                // n, then their indexes.
                cmd.arg(shun_tolerance_us(args.min_delay_us))
                    .arg(args.shun_n);
                for index in args.shun_turns.iter() {
                    cmd.arg(index);
                }
            }
        })
        .await;
    let reply = match reply {
        Ok(raw) => decode(raw.as_slice(), args.max_wait_us),
        Err(err) => Err(ScriptError::Query(err)),
    };
    (reply, sent)
}

/// How late into its turn a replica taking turns in-process may send (as
/// `fallback::plan::turn_window` says): a tenth of `min_delay`, at most
/// 10 ms.
fn shun_tolerance_us(min_delay_us: u64) -> u64 {
    (min_delay_us / 10).min(10_000)
}

/// Reads the three integers, capping every wait at `max_wait_us` (as the
/// script does).
fn decode(raw: &[i64], max_wait_us: u64) -> Result<Reply, ScriptError> {
    let us = |n: i64| (n as u64).min(max_wait_us);
    match *raw {
        [1, now, ahead] if ahead >= 0 && now >= 0 => Ok(Reply::Admitted {
            now_us: now as u64,
            // Within the horizon asked for, which is far below this.
            ahead_us: us(ahead),
        }),
        [0, _, 2] => Ok(Reply::Voided),
        [0, wait, 3] if wait >= 0 => Ok(Reply::Healed { wait_us: us(wait) }),
        [0, wait, full @ (0 | 1)] if wait >= 0 => Ok(Reply::Wait {
            wait_us: us(wait),
            full: full == 1,
        }),
        _ => Err(ScriptError::BadReply(format!(
            "unexpected reply from the acquire script: {raw:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_as_three_integers_or_kept_whole() {
        let read = |v: Value| Raw::from_redis_value(v).map(|raw| raw.as_slice().to_vec());
        assert_eq!(read(Value::Int(7)).unwrap(), [1, 7, 0]);
        let ints = |ns: &[i64]| Value::Array(ns.iter().map(|&n| Value::Int(n)).collect());
        assert_eq!(read(ints(&[0, 5, 1])).unwrap(), [0, 5, 1]);
        assert_eq!(read(ints(&[1, 5])).unwrap(), [1, 5]);
        assert_eq!(read(ints(&[0, 1, 2, 3])).unwrap(), [0, 1, 2, 3]);
        let text = Value::Array(vec![Value::Int(1), Value::Okay, Value::Int(0)]);
        assert!(read(text).is_err());
    }

    #[test]
    fn every_reply_shape_is_read_and_garbage_is_refused() {
        let max = 1_000;
        assert_eq!(
            decode(&[1, 5, 0], max).unwrap(),
            Reply::Admitted {
                now_us: 5,
                ahead_us: 0
            }
        );
        assert_eq!(
            decode(&[0, 5_000, 1], max).unwrap(),
            Reply::Wait {
                wait_us: 1_000,
                full: true
            }
        );
        assert_eq!(decode(&[0, 0, 2], max).unwrap(), Reply::Voided);
        assert_eq!(
            decode(&[0, 7, 3], max).unwrap(),
            Reply::Healed { wait_us: 7 }
        );
        for bad in [&[0, -1, 0][..], &[2, 0, 0], &[1, 5], &[0, 5, 4]] {
            assert!(
                matches!(decode(bad, max), Err(ScriptError::BadReply(_))),
                "{bad:?}"
            );
        }
    }
}

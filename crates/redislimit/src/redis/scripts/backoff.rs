//! backoff.lua's arguments and reply (its header says what each is).

use deadpool_redis::redis::Cmd;

use super::{BACKOFF, ScriptError};
use crate::redis::pool::Connections;

/// One move of a host's backoff gap.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    /// An overload signal: the gap doubles from `start_us`, up to `max_us`.
    Widen { start_us: u64, max_us: u64 },
    /// A success: the gap narrows, and is dropped below `start_us`.
    Narrow { start_us: u64, max_us: u64 },
}

/// Runs backoff.lua on the host's `gate`: the gap now in force (µs; 0 when
/// the host is not backing off).
pub(crate) async fn run(
    redis: &Connections,
    gate: &str,
    step: Step,
    lease_ttl_us: u64,
) -> Result<u64, ScriptError> {
    let (code, start_us, max_us) = match step {
        Step::Widen { start_us, max_us } => (1, start_us, max_us),
        Step::Narrow { start_us, max_us } => (2, start_us, max_us),
    };
    let gap = BACKOFF
        .run::<i64>(redis, &[gate], |cmd: &mut Cmd| {
            cmd.arg(code).arg(start_us).arg(max_us).arg(lease_ttl_us);
        })
        .await?;
    Ok(u64::try_from(gap).unwrap_or(0))
}

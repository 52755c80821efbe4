//! penalize.lua's arguments and reply (its header says what each is).

use deadpool_redis::redis::Cmd;

use super::{PENALIZE, ScriptError};
use crate::redis::pool::Connections;

/// What penalize.lua is asked to do with its `hold_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Hold the host that long.
    Hold,
    /// Grow the host's byte debt by that much, and hold it until paid.
    Charge,
    /// Cap the host's requests in flight at this many for that long.
    Cap(u32),
}

/// Runs penalize.lua on the host's `gate` as `kind` says: whether it
/// changed anything.
pub(crate) async fn run(
    redis: &Connections,
    gate: &str,
    hold_us: u64,
    lease_ttl_us: u64,
    kind: Kind,
) -> Result<bool, ScriptError> {
    let extended = PENALIZE
        .run::<i64>(redis, &[gate], |cmd: &mut Cmd| {
            cmd.arg(hold_us).arg(lease_ttl_us);
            match kind {
                Kind::Hold => {}
                Kind::Charge => {
                    cmd.arg(1);
                }
                Kind::Cap(cap) => {
                    cmd.arg(2).arg(cap);
                }
            }
        })
        .await?;
    Ok(extended == 1)
}

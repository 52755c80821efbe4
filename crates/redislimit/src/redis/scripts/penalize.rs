//! penalize.lua's arguments and reply (its header says what each is).

use deadpool_redis::redis::Cmd;

use super::{PENALIZE, ScriptError};
use crate::redis::pool::Connections;

/// Runs penalize.lua on the host's `gate`, holding it `hold_us` (with
/// `charge`: growing its byte debt by `hold_us`): whether the hold was
/// extended.
pub(crate) async fn run(
    redis: &Connections,
    gate: &str,
    hold_us: u64,
    lease_ttl_us: u64,
    charge: bool,
) -> Result<bool, ScriptError> {
    let extended = PENALIZE
        .run::<i64>(redis, &[gate], |cmd: &mut Cmd| {
            cmd.arg(hold_us).arg(lease_ttl_us);
            if charge {
                cmd.arg(1);
            }
        })
        .await?;
    Ok(extended == 1)
}

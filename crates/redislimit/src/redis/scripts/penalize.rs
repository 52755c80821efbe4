//! penalize.lua's arguments and reply (its header says what each is).

use deadpool_redis::redis::Cmd;

use super::{PENALIZE, ScriptError};
use crate::redis::pool::Connections;

/// Runs penalize.lua on the host's `gate`, holding it `hold_us`: whether
/// the hold was extended.
pub(crate) async fn run(
    redis: &Connections,
    gate: &str,
    hold_us: u64,
    lease_ttl_us: u64,
) -> Result<bool, ScriptError> {
    let extended = PENALIZE
        .run::<i64>(redis, &[gate], |cmd: &mut Cmd| {
            cmd.arg(hold_us).arg(lease_ttl_us);
        })
        .await?;
    Ok(extended == 1)
}

//! register.lua's arguments and reply (its header says what each is).

use deadpool_redis::redis::Cmd;

use super::{REGISTER, ScriptError};
use crate::redis::pool::Connections;

/// Runs register.lua on the scope's registry `key` for this replica's
/// `id`, its entry living `ttl_us` unrenewed: the ids of the live
/// replicas, this one included.
pub(crate) async fn run(
    redis: &Connections,
    key: &str,
    id: &str,
    ttl_us: u64,
) -> Result<Vec<String>, ScriptError> {
    let ids = REGISTER
        .run::<Vec<String>>(redis, &[key], |cmd: &mut Cmd| {
            cmd.arg(id).arg(ttl_us);
        })
        .await?;
    Ok(ids)
}

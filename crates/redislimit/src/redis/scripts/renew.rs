//! renew.lua's arguments and reply (its header says what each is).

use deadpool_redis::redis::Cmd;

use super::{RENEW, ScriptError};
use crate::redis::keys::RedisKeys;
use crate::redis::pool::Connections;
use crate::redis::settings::Args;

/// Runs renew.lua for `token` on `keys`: whether it still held its slot.
pub(crate) async fn run(
    redis: &Connections,
    keys: &RedisKeys,
    token: &str,
    args: &Args,
    lease_ttl_us: u64,
) -> Result<bool, ScriptError> {
    let renewed = RENEW
        .run::<i64>(redis, &keys.all()[..2], |cmd: &mut Cmd| {
            cmd.arg(token)
                .arg(args.mode.script_cap())
                .arg(lease_ttl_us)
                .arg(args.min_delay_us)
                .arg(args.weight);
        })
        .await?;
    Ok(renewed == 1)
}

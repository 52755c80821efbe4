//! adopt.lua's arguments and reply (its header says what each is).

use deadpool_redis::redis::Cmd;

use super::{ADOPT, ScriptError};
use crate::redis::keys::RedisKeys;
use crate::redis::pool::Connections;
use crate::redis::settings::Args;

/// Runs adopt.lua for `token` on `keys`, a request sent `ago_us` ago:
/// whether it now holds a slot.
pub(crate) async fn run(
    redis: &Connections,
    keys: &RedisKeys,
    token: &str,
    args: &Args,
    lease_ttl_us: u64,
    ago_us: u64,
) -> Result<bool, ScriptError> {
    let adopted = ADOPT
        .run::<i64>(redis, &keys.all()[..3], |cmd: &mut Cmd| {
            cmd.arg(token)
                .arg(args.mode.script_cap())
                .arg(lease_ttl_us)
                .arg(args.min_delay_us)
                .arg(ago_us)
                .arg(args.quota)
                .arg(args.window_us)
                .arg(args.weight)
                .arg(args.bucket_us);
        })
        .await?;
    Ok(adopted == 1)
}

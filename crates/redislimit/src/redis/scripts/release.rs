//! release.lua's arguments and reply (its header says what each is).

use deadpool_redis::redis::Cmd;

use super::{RELEASE, ScriptError};
use crate::redis::keys::RedisKeys;
use crate::redis::pool::Connections;
use crate::redis::settings::Args;

/// Runs release.lua for `token` on `keys` (as `abandoned` when its
/// request was never sent): whether the token still held its slot.
pub(crate) async fn run(
    redis: &Connections,
    keys: &RedisKeys,
    token: &str,
    abandoned: bool,
    args: &Args,
    lease_ttl_us: u64,
) -> Result<bool, ScriptError> {
    let held = RELEASE
        .run::<i64>(redis, &keys.all(), |cmd: &mut Cmd| {
            cmd.arg(token)
                .arg(args.min_delay_us)
                .arg(args.mode.script_cap())
                .arg(u8::from(abandoned))
                .arg(lease_ttl_us)
                .arg(args.weight)
                .arg(args.bucket_us)
                .arg(args.admitted_us);
        })
        .await?;
    Ok(held == 1)
}

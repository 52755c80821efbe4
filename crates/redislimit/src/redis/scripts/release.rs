//! release.lua's arguments and reply (its header says what each is), and
//! the completion of a lease, which needs no script.

use deadpool_redis::redis::{self, Cmd};

use super::{RELEASE, ScriptError};
use crate::redis::keys::RedisKeys;
use crate::redis::pool::{Connections, QueryError};
use crate::redis::settings::{Args, Mode};

/// Runs release.lua for `token` on `keys` (as `abandoned` when its
/// request was never sent): whether the token still held its slot.
///
/// A request completed in lease mode only gives its lease back (a
/// completion moves nothing else there): that is one `ZREM` of its
/// members, a fraction of the script's cost on the server. The script
/// still runs when the lease set is not a ZSET, so that garbage is
/// replaced as every operation replaces it, and for a user the server
/// does not allow `ZREM`.
pub(crate) async fn run(
    redis: &Connections,
    keys: &RedisKeys,
    token: &str,
    abandoned: bool,
    args: &Args,
    lease_ttl_us: u64,
) -> Result<bool, ScriptError> {
    if !abandoned && matches!(args.mode, Mode::Lease(_)) {
        match redis
            .query::<i64>(&lease_members(keys, token, args.weight))
            .await
        {
            Ok(removed) => return Ok(removed > 0),
            Err(QueryError::Redis(e)) if matches!(e.code(), Some("WRONGTYPE" | "NOPERM")) => {}
            Err(e) => return Err(e.into()),
        }
    }
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

/// The completions of lease-mode requests `leases` (their keys, tokens and
/// weights) as one pipeline of `ZREM`s: for each, whether it landed, or
/// `false` where the server refused its `ZREM` (the lease set is not a
/// ZSET, a user without `ZREM`): [`run`] then releases it on its own,
/// which replaces garbage as every operation does. (Whether the token still
/// held its slot does not matter to a completion: a lapsed lease is gone
/// either way.) One answer for each, or none at all when the pipeline
/// failed.
pub(crate) async fn complete_leases(
    redis: &Connections,
    leases: &[(&RedisKeys, &str, u32)],
) -> Result<Vec<bool>, QueryError> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for &(keys, token, weight) in leases {
        pipe.add_command(lease_members(keys, token, weight));
    }
    let replies: Vec<redis::RedisResult<i64>> = redis.query_pipe(&pipe).await?;
    if replies.len() != leases.len() {
        // Not what a pipeline answers: each is released on its own.
        return Ok(vec![false; leases.len()]);
    }
    Ok(replies.iter().map(Result::is_ok).collect())
}

/// `ZREM` of the members a request of `weight` is kept as in the lease set
/// (`members` in common.lua: its token, then `token#2` .. `token#weight`).
fn lease_members(keys: &RedisKeys, token: &str, weight: u32) -> Cmd {
    let members = weight as usize;
    // Made to fit: allocated twice, never grown.
    let mut cmd = Cmd::with_capacity(
        2 + members,
        4 + keys.leases().len() + members * (token.len() + 11),
    );
    cmd.arg("ZREM").arg(keys.leases()).arg(token);
    for i in 2..=weight {
        cmd.arg(format!("{token}#{i}"));
    }
    cmd
}

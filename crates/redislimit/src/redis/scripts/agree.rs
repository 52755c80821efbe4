//! agree.lua's arguments and replies (its header says what each is).

use deadpool_redis::redis::Cmd;

use super::{AGREE, ScriptError};
use crate::redis::pool::Connections;

/// What agree.lua answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The record is (now) these settings.
    Agreed,
    /// Another configuration holds the scope: its settings.
    Theirs(String),
}

/// Runs agree.lua on the scope's record `key` with `settings`, kept
/// `ttl_us` past the last replica that agreed.
pub(crate) async fn run(
    redis: &Connections,
    key: &str,
    settings: &str,
    ttl_us: u64,
) -> Result<Reply, ScriptError> {
    let reply = AGREE
        .run::<Vec<String>>(redis, &[key], |cmd: &mut Cmd| {
            cmd.arg(settings).arg(ttl_us);
        })
        .await?;
    match reply.as_slice() {
        [ok] if ok == "1" => Ok(Reply::Agreed),
        [no, theirs] if no == "0" => Ok(Reply::Theirs(theirs.clone())),
        _ => Err(ScriptError::BadReply(format!(
            "unexpected reply from the agreement script: {reply:?}"
        ))),
    }
}

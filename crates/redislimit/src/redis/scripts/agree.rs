//! agree.lua's arguments and replies (its header says what each is).

use deadpool_redis::redis::Cmd;

use super::{AGREE, ScriptError};
use crate::redis::pool::Connections;

/// What agree.lua answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The record is (now) these settings, first recorded at `since` (µs
    /// on the server's clock).
    Agreed {
        /// When the settings were first recorded.
        since: u64,
        /// Whether this call put back a record this replica had agreed
        /// with, which Redis had lost (or another had displaced since).
        back: bool,
    },
    /// Another configuration holds the scope: its settings.
    Theirs(String),
}

/// Runs agree.lua on the scope's record `keys` (the record and its
/// `since`) with `settings`, kept `ttl_us` past the last replica that
/// agreed; `claim` is the `since` of the record this replica last agreed
/// with while it is in use (0: none); `extend` extends a record of these
/// settings (else only a missing or displaced one is put back).
pub(crate) async fn run(
    redis: &Connections,
    keys: [&str; 2],
    settings: &str,
    ttl_us: u64,
    claim: u64,
    extend: bool,
) -> Result<Reply, ScriptError> {
    let reply = AGREE
        .run::<Vec<String>>(redis, &keys, |cmd: &mut Cmd| {
            cmd.arg(settings)
                .arg(ttl_us)
                .arg(claim)
                .arg(u8::from(extend));
        })
        .await?;
    match reply.as_slice() {
        [ok, since, back] if ok == "1" && since.parse::<u64>().is_ok() => Ok(Reply::Agreed {
            since: since.parse().unwrap_or_default(),
            back: back == "1",
        }),
        [no, theirs] if no == "0" => Ok(Reply::Theirs(theirs.clone())),
        _ => Err(ScriptError::BadReply(format!(
            "unexpected reply from the agreement script: {reply:?}"
        ))),
    }
}

//! Bounded polling: wait for a condition on a server, or panic saying what never happened.

use std::{
    thread,
    time::{Duration, Instant},
};

/// How often conditions are polled.
const POLL: Duration = Duration::from_millis(50);

/// Polls `check` until it returns `Ok`, for at most `timeout`; then panics with `what` and
/// the last reason `check` gave. A test that needs a server must fail, never skip, when
/// the server does not come up.
pub(crate) fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return value,
            Err(reason) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last status: {reason}")
            }
            Err(_) => thread::sleep(POLL),
        }
    }
}

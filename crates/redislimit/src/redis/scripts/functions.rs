//! The server's answers that decide how the scripts are run: a function
//! missing (load the library), or functions refused (run the scripts).

use deadpool_redis::redis::{ErrorKind, ServerErrorKind};

use crate::redis::pool::QueryError;

/// Whether the server answered that the function called is not loaded.
pub(crate) fn is_missing_function(err: &QueryError) -> bool {
    matches!(err, QueryError::Redis(e) if e.to_string().contains("Function not found"))
}

/// Whether the server has no Redis Functions (an unknown command, or a
/// proxy's unsupported one), or does not let this user call or load them.
pub(crate) fn refuses_functions(err: &QueryError) -> bool {
    matches!(err, QueryError::Redis(e)
        if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
            || names_a_missing_command(&e.to_string()))
}

/// Whether an error's text says the command itself is missing: Redis and
/// Valkey answer "unknown command", proxies (Envoy's, for one) "unsupported
/// command".
fn names_a_missing_command(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    text.contains("unknown command") || text.contains("unsupported command")
}

#[cfg(test)]
mod tests {
    use super::names_a_missing_command;

    #[test]
    fn a_missing_fcall_is_read_from_the_servers_and_proxies_words() {
        // Redis 6, Envoy's proxy, and errors that must not switch the path.
        assert!(names_a_missing_command(
            "ERR unknown command 'FCALL', with args beginning with: 'x' '5' "
        ));
        assert!(names_a_missing_command("unsupported command 'fcall'"));
        assert!(!names_a_missing_command(
            "ERR Error running script (call to f_x): @user_script:1: \
             Unknown Redis command called from script"
        ));
        assert!(!names_a_missing_command("ERR Function not found"));
        assert!(!names_a_missing_command(
            "BUSY Redis is busy running a script"
        ));
    }
}

//! Makes sure the Redis binaries the integration tests spawn are installed (apt-get as root).

use std::{
    env,
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    process::{Command, Stdio},
};

/// The programs the test harness starts.
const BINARIES: [&str; 3] = ["redis-server", "redis-cli", "redis-sentinel"];

/// The Debian packages that provide [`BINARIES`].
const PACKAGES: [&str; 3] = ["redis-server", "redis-tools", "redis-sentinel"];

/// Succeeds when every binary is on `PATH`, installing them with apt-get first when some
/// are missing and we are root. The error is a paragraph for the user.
pub(crate) fn ensure_installed() -> Result<(), String> {
    let missing = missing_binaries();
    if missing.is_empty() {
        println!("all found");
        return Ok(());
    }
    println!("missing: {}", missing.join(", "));

    let why_not = if !is_root() {
        Some("not running as root, so they were not installed automatically")
    } else if find_on_path("apt-get").is_none() {
        Some("apt-get is not available, so they were not installed automatically")
    } else {
        install();
        None
    };

    let missing = missing_binaries();
    if missing.is_empty() {
        println!("all found");
        return Ok(());
    }
    let why = why_not.unwrap_or("installing them with apt-get did not put them on PATH");
    Err(format!(
        "{} not found on PATH ({why}). The integration tests start real Redis processes and \
         need redis-server, redis-cli and redis-sentinel: install them with `apt-get install \
         {}` (Debian/Ubuntu, as root), or the equivalent packages or build from redis.io, \
         then rerun `cargo xtask test`.",
        missing.join(", "),
        PACKAGES.join(" "),
    ))
}

/// Runs `apt-get update` and `apt-get install` for [`PACKAGES`]. Failures are reported but
/// not fatal: the caller checks `PATH` again afterwards, which is what counts.
fn install() {
    println!(
        "installing {} with apt-get (Debian may start a system redis service; harmless, the \
         tests use their own free ports)",
        PACKAGES.join(" ")
    );
    let update = apt_get().arg("update").status();
    match update {
        Ok(status) if status.success() => {}
        Ok(status) => eprintln!("warning: `apt-get update` exited with {status}"),
        Err(e) => eprintln!("warning: could not run `apt-get update`: {e}"),
    }
    let install = apt_get()
        .args(["install", "-y", "--no-install-recommends"])
        .args(PACKAGES)
        .status();
    match install {
        Ok(status) if status.success() => {}
        Ok(status) => eprintln!("warning: `apt-get install` exited with {status}"),
        Err(e) => eprintln!("warning: could not run `apt-get install`: {e}"),
    }
}

fn apt_get() -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null());
    cmd
}

fn missing_binaries() -> Vec<&'static str> {
    BINARIES
        .into_iter()
        .filter(|name| find_on_path(name).is_none())
        .collect()
}

/// `id -u` prints 0.
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// The first executable file called `name` in a `PATH` directory.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::find_on_path;

    #[test]
    fn finds_a_program_every_system_has() {
        assert!(find_on_path("sh").is_some(), "sh should be on PATH");
    }

    #[test]
    fn does_not_find_a_program_that_does_not_exist() {
        assert!(find_on_path("redislimit-no-such-program").is_none());
    }
}

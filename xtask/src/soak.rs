//! `cargo xtask soak --minutes N`: the long soak (not part of `test`): eight crawl
//! replicas, 10,000 hosts, Redis restarted and a replica killed every minute, judged
//! from the upstream's record; the figures go to `target/soak/summary.json`.

use crate::{Failure, cargo, header, redis, step};

/// Builds the soak and crawl binaries (release) and runs the soak for `minutes`.
pub(crate) fn run(minutes: u64) -> Result<(), Failure> {
    header("servers: redis-server, redis-cli, redis-sentinel, nginx and faketime");
    redis::ensure_installed().map_err(|detail| Failure::new("redis", detail))?;
    step(
        "build",
        cargo().args([
            "build",
            "--release",
            "-p",
            "redislimit-tests",
            "--bin",
            "soak",
        ]),
    )?;
    crate::bench::build_crawl()?;
    let target = crate::target_dir()?;
    let binary = target.join("release/soak");
    step(
        "soak",
        std::process::Command::new(binary)
            .current_dir(crate::project_root())
            .args(["--minutes", &minutes.to_string()])
            .arg("--out")
            .arg(target.join("soak/summary.json")),
    )
}

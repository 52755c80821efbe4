//! The fuzz targets' seeds as regression tests: every file of `fuzz/seeds/<target>/`
//! (hand-written inputs and what `cargo xtask fuzz` found) through the target's body in
//! `fuzz/src/lib.rs`, which panics when a parser panics or breaks an invariant. The
//! bodies are compiled here as a module, so the seeds run on stable Rust.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

// The bodies are `pub` for the fuzz crate, which is their home.
#[allow(unreachable_pub)]
#[path = "../../../fuzz/src/lib.rs"]
mod fuzzing;

use fuzzing::{TARGETS, target};

/// The `fuzz/` directory at the workspace root.
fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files directly in `dir`, sorted; a directory that cannot be listed fails the test.
fn files(dir: &Path) -> Vec<PathBuf> {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// Runs `body` over every seed of `name`; the seeds that fail, with why.
fn failures(name: &str, body: fn(&[u8])) -> Vec<String> {
    let dir = fuzz_dir().join("seeds").join(name);
    let seeds = files(&dir);
    assert!(
        !seeds.is_empty(),
        "{} holds no seeds: every fuzz target needs some",
        dir.display()
    );
    let mut failed = Vec::new();
    for seed in seeds {
        let data = std::fs::read(&seed).unwrap_or_else(|e| panic!("{}: {e}", seed.display()));
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| body(&data))) {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            failed.push(format!("{}: {why}", seed.display()));
        }
    }
    failed
}

#[test]
fn every_target_passes_its_seeds() {
    let mut failed = Vec::new();
    for (name, body) in TARGETS {
        failed.extend(failures(name, body));
    }
    assert!(
        failed.is_empty(),
        "{} seed(s) fail:\n  {}",
        failed.len(),
        failed.join("\n  ")
    );
}

#[test]
fn the_fuzz_targets_and_their_seeds_match_the_bodies() {
    let dir = fuzz_dir();
    let stems = |sub: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join(sub))
            .unwrap_or_else(|e| panic!("cannot list fuzz/{sub}: {e}"))
            .map(|entry| entry.expect("a directory entry").path())
            .filter_map(|path| {
                let stem = path.file_stem()?.to_string_lossy().into_owned();
                (sub != "fuzz_targets" || path.extension().is_some_and(|e| e == "rs"))
                    .then_some(stem)
            })
            .collect();
        names.sort();
        names
    };
    let mut bodies: Vec<String> = TARGETS.iter().map(|(n, _)| (*n).to_owned()).collect();
    bodies.sort();
    assert_eq!(stems("fuzz_targets"), bodies, "fuzz/fuzz_targets/*.rs");
    assert_eq!(stems("seeds"), bodies, "fuzz/seeds/*/");
    for name in &bodies {
        let source = std::fs::read_to_string(dir.join("fuzz_targets").join(format!("{name}.rs")))
            .expect("the target's source");
        assert!(target(name).is_some(), "{name} has a body");
        assert!(
            source.contains("redislimit_fuzz::"),
            "fuzz/fuzz_targets/{name}.rs calls no body of fuzz/src/lib.rs (redislimit_fuzz)"
        );
    }
}

/// A seed that breaks an invariant is caught, naming the seed: the test can fail.
#[test]
fn a_failing_seed_is_reported() {
    static CALLED: AtomicBool = AtomicBool::new(false);
    // Fails on the first seed only (one panic message in the output).
    let failing = failures("host_key", |_| {
        assert!(CALLED.swap(true, Ordering::Relaxed), "on purpose");
    });
    assert_eq!(failing.len(), 1, "{failing:?}");
    assert!(failing[0].contains("seeds/host_key/"), "{failing:?}");
    assert!(failing[0].ends_with(": on purpose"), "{failing:?}");
}

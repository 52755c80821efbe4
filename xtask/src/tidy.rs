//! Tidy checks over the workspace's Rust sources, run as a test (`cargo test -p xtask`).
//!
//! - every `.rs` file under `crates/`, `examples/`, `tests/` and `xtask/` opens with a
//!   `//!` line saying what it holds;
//! - every crate root `crates/*/src/lib.rs` contains `#![forbid(unsafe_code)]`;
//! - no source file under `crates/*/src` is longer than [`MAX_LINES`] lines, not counting
//!   an inline test module (from its `#[cfg(test)]` to the end of the file);
//! - no two modules of one crate under `crates/*/src` import each other (see
//!   [`imports`]): a layer imports the layers below it, never the other way round;
//! - no module of a binary built with `test = false` holds a test (see [`untested`]):
//!   `cargo test` never runs it.

mod imports;
mod untested;

use std::{
    fs,
    path::{Path, PathBuf},
};

/// Directories (relative to the workspace root) whose `.rs` files are checked.
const SOURCE_DIRS: [&str; 4] = ["crates", "examples", "tests", "xtask"];

const FORBID_UNSAFE: &str = "#![forbid(unsafe_code)]";

/// The most lines a source file under `crates/*/src` may have, its inline test module aside.
pub(crate) const MAX_LINES: usize = 600;

/// Every problem found under `root`, one line each, naming the file.
fn problems(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        collect_rs_files(&root.join(dir), &mut files, &mut problems);
    }
    files.sort();
    for file in &files {
        let shown = file.strip_prefix(root).unwrap_or(file).display();
        let text = match fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) => {
                problems.push(format!("{shown}: cannot read: {e}"));
                continue;
            }
        };
        if !text
            .lines()
            .next()
            .is_some_and(|line| line.starts_with("//!"))
        {
            problems.push(format!(
                "{shown}: does not open with a `//!` line saying what it holds"
            ));
        }
        if is_crate_root(root, file) && !text.contains(FORBID_UNSAFE) {
            problems.push(format!("{shown}: crate root lacks `{FORBID_UNSAFE}`"));
        }
        if crate_source(root, file).is_some() {
            let lines = lines_before_tests(&text);
            if lines > MAX_LINES {
                problems.push(format!(
                    "{shown}: {lines} lines (its test module aside), more than {MAX_LINES}: split it by what it decides"
                ));
            }
        }
    }
    problems.extend(imports::cycles(root, &files));
    problems.extend(untested::tests_in_untested_bins(root, &SOURCE_DIRS));
    problems
}

/// The crate directory (`crates/<name>`) and the path below its `src/` of a file under
/// `crates/*/src`, or `None`.
pub(crate) fn crate_source(root: &Path, file: &Path) -> Option<(PathBuf, PathBuf)> {
    let relative = file.strip_prefix(root.join("crates")).ok()?;
    let mut parts = relative.components();
    let name = parts.next()?;
    if parts.next()?.as_os_str() != "src" {
        return None;
    }
    Some((
        root.join("crates").join(name.as_os_str()),
        parts.as_path().to_path_buf(),
    ))
}

/// Lines of `text` before its inline test module: a `#[cfg(test)]` line followed by a
/// `mod` line (the whole file when it has none).
pub(crate) fn lines_before_tests(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .position(|pair| {
            pair[0].trim() == "#[cfg(test)]" && pair[1].trim_start().starts_with("mod ")
        })
        .unwrap_or(lines.len())
}

/// `crates/<name>/src/lib.rs`.
fn is_crate_root(root: &Path, file: &Path) -> bool {
    let Ok(relative) = file.strip_prefix(root.join("crates")) else {
        return false;
    };
    let parts: Vec<_> = relative.components().map(|c| c.as_os_str()).collect();
    parts.len() == 3 && parts[1] == "src" && parts[2] == "lib.rs"
}

/// Adds every `.rs` file below `dir` to `files`, skipping `target/` and hidden directories.
/// A missing `dir` is fine (not every workspace has every directory yet).
fn collect_rs_files(dir: &Path, files: &mut Vec<PathBuf>, problems: &mut Vec<String>) {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            problems.push(format!("{}: cannot list: {e}", dir.display()));
            return;
        }
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                problems.push(format!("{}: cannot list: {e}", dir.display()));
                continue;
            }
        };
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                collect_rs_files(&path, files, problems);
            }
        } else if name.ends_with(".rs") {
            files.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, path::PathBuf};

    use super::problems;

    #[test]
    fn workspace_sources_are_tidy() {
        let problems = problems(&crate::project_root());
        assert!(
            problems.is_empty(),
            "tidy check failed for {} file(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }

    /// A scratch workspace under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("xtask-tidy-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            Self(dir)
        }

        fn write(&self, relative: &str, text: &str) {
            let path = self.0.join(relative);
            fs::create_dir_all(path.parent().expect("file has a parent")).expect("mkdir");
            fs::write(path, text).expect("write");
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn reports_each_offending_file_and_skips_target() {
        let ws = Scratch::new("report");
        ws.write(
            "crates/good/src/lib.rs",
            "//! Good.\n#![forbid(unsafe_code)]\n",
        );
        ws.write("crates/good/src/inner/mod.rs", "//! Inner.\n");
        ws.write("crates/unsafe/src/lib.rs", "//! No forbid.\n");
        ws.write(
            "crates/undoc/src/lib.rs",
            "#![forbid(unsafe_code)]\n//! Late doc.\n",
        );
        ws.write("tests/harness/main.rs", "\n//! Blank line first.\n");
        ws.write(
            "examples/examples/demo.rs",
            "// plain comment\nfn main() {}\n",
        );
        ws.write("xtask/src/main.rs", "//! Fine.\n");
        ws.write("crates/good/target/debug/build/out.rs", "generated\n");
        ws.write("crates/good/.hidden/x.rs", "hidden\n");

        let found = problems(&ws.0);
        let expected = [
            "crates/undoc/src/lib.rs: does not open with a `//!` line",
            "crates/unsafe/src/lib.rs: crate root lacks `#![forbid(unsafe_code)]`",
            "examples/examples/demo.rs: does not open with a `//!` line",
            "tests/harness/main.rs: does not open with a `//!` line",
        ];
        assert_eq!(found.len(), expected.len(), "problems: {found:#?}");
        for (problem, prefix) in found.iter().zip(expected) {
            assert!(
                problem.starts_with(prefix),
                "{problem:?} should start with {prefix:?}"
            );
        }
    }

    #[test]
    fn a_long_file_and_two_modules_importing_each_other_are_refused() {
        let ws = Scratch::new("shape");
        let long: String = (0..601).map(|i| format!("// line {i}\n")).collect();
        ws.write(
            "crates/a/src/lib.rs",
            "//! A.\n#![forbid(unsafe_code)]\nmod b;\nmod c;\nmod d;\npub use self::b::B;\n",
        );
        // Too long, but for its test module.
        let tested = format!(
            "//! D.\n{}\n#[cfg(test)]\nmod tests {{\n{long}}}\n",
            "// x\n".repeat(500)
        );
        ws.write("crates/a/src/d.rs", &tested);
        ws.write(
            "crates/a/src/b.rs",
            &format!("//! B.\nuse crate::c::C;\n{long}"),
        );
        // `crate::B` is b's, re-exported by the root: c imports b.
        ws.write(
            "crates/a/src/c.rs",
            "//! C.\nuse crate::{B, d::D};\npub struct C;\n",
        );
        let found = problems(&ws.0);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(
            found[0].starts_with("crates/a/src/b.rs: 603 lines"),
            "{found:#?}"
        );
        assert!(
            found[1].starts_with("crates/a/src/b.rs and crates/a/src/c.rs import each other"),
            "{found:#?}"
        );
    }

    #[test]
    fn a_test_in_a_binary_built_without_its_test_harness_is_refused() {
        let ws = Scratch::new("untested");
        let manifest = |test: &str| {
            format!(
                "[package]\nname = \"a\"\n\n[[bin]]\nname = \"tool\"\npath = \"src/bin/tool/main.rs\"\n{test}\n[dependencies]\n"
            )
        };
        ws.write("crates/a/Cargo.toml", &manifest("test = false"));
        ws.write(
            "crates/a/src/lib.rs",
            "//! A.\n#![forbid(unsafe_code)]\n#[cfg(test)]\nmod tests {}\n",
        );
        ws.write(
            "crates/a/src/bin/tool/main.rs",
            "//! Tool.\nmod cli;\nfn main() {}\n",
        );
        ws.write(
            "crates/a/src/bin/tool/cli.rs",
            "//! Cli.\npub(crate) mod parse;\n",
        );
        ws.write(
            "crates/a/src/bin/tool/cli/parse.rs",
            "//! Parse.\n#[test]\nfn parses() {}\n",
        );
        let found = problems(&ws.0);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with(
                "crates/a/src/bin/tool/cli/parse.rs: holds a test, but the binary `tool`"
            ),
            "{found:#?}"
        );
        // With its test harness, the same binary's tests run: nothing to say.
        ws.write("crates/a/Cargo.toml", &manifest(""));
        assert_eq!(problems(&ws.0), Vec::<String>::new());
    }

    #[test]
    fn a_tidy_tree_has_no_problems() {
        let ws = Scratch::new("clean");
        ws.write("crates/a/src/lib.rs", "//! A.\n#![forbid(unsafe_code)]\n");
        ws.write("crates/a/tests/it.rs", "//! Integration.\n");
        assert_eq!(problems(&ws.0), Vec::<String>::new());
    }
}

//! Binaries declared with `test = false` hold no tests: `cargo test` never builds them as
//! a test harness, so a `#[test]` written in one of their modules would never run.
//!
//! Each `Cargo.toml` under the source directories is read for its `[[bin]]` tables; from
//! the `path` of each one with `test = false`, its modules are followed (`mod name;` to
//! `name.rs` or `name/mod.rs`), and a module with a test attribute is refused.

use std::{
    fs,
    path::{Path, PathBuf},
};

/// Attributes that make a test, or a module of tests.
const TEST_MARKS: [&str; 3] = ["#[test]", "#[tokio::test", "#[cfg(test)]"];

/// One problem for each module of a `test = false` binary that holds a test.
pub(super) fn tests_in_untested_bins(root: &Path, dirs: &[&str]) -> Vec<String> {
    let mut manifests = Vec::new();
    for dir in dirs {
        collect_manifests(&root.join(dir), &mut manifests);
    }
    manifests.sort();
    let mut problems = Vec::new();
    for manifest in manifests {
        let Ok(text) = fs::read_to_string(&manifest) else {
            continue;
        };
        let package = manifest.parent().unwrap_or(root);
        for (name, path) in untested_bins(&text) {
            let mut modules = Vec::new();
            walk_modules(&package.join(path), &mut modules);
            for module in modules {
                let Ok(source) = fs::read_to_string(&module) else {
                    continue;
                };
                if source
                    .lines()
                    .any(|l| TEST_MARKS.iter().any(|m| l.trim_start().starts_with(m)))
                {
                    let shown = module.strip_prefix(root).unwrap_or(&module).display();
                    let cargo = manifest.strip_prefix(root).unwrap_or(&manifest).display();
                    problems.push(format!(
                        "{shown}: holds a test, but the binary `{name}` is built with \
                         `test = false` ({cargo}), so it never runs: move it to the library"
                    ));
                }
            }
        }
    }
    problems
}

/// The name and path of each `[[bin]]` table of `manifest` with `test = false`.
fn untested_bins(manifest: &str) -> Vec<(String, String)> {
    let mut bins = Vec::new();
    let mut current: Option<(Option<String>, Option<String>, bool)> = None;
    let mut finish = |bin: Option<(Option<String>, Option<String>, bool)>| {
        if let Some((Some(name), Some(path), true)) = bin {
            bins.push((name, path));
        }
    };
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            finish(current.take());
            if line == "[[bin]]" {
                current = Some((None, None, false));
            }
            continue;
        }
        let Some((name, path, untested)) = current.as_mut() else {
            continue;
        };
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim().trim_matches('"').to_owned();
        match key.trim() {
            "name" => *name = Some(value),
            "path" => *path = Some(value),
            "test" => *untested = value == "false",
            _ => {}
        }
    }
    finish(current);
    bins
}

/// `file` and the modules it declares with `mod name;`, recursively.
fn walk_modules(file: &Path, modules: &mut Vec<PathBuf>) {
    let Ok(text) = fs::read_to_string(file) else {
        return;
    };
    modules.push(file.to_path_buf());
    // A crate root or `mod.rs` keeps its modules beside it; `foo.rs` in `foo/`.
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let parent = file.parent().unwrap_or(Path::new("."));
    let dir = if matches!(stem, "main" | "lib" | "mod") {
        parent.to_path_buf()
    } else {
        parent.join(stem)
    };
    for line in text.lines().map(str::trim) {
        let Some(name) = declared_module(line) else {
            continue;
        };
        let flat = dir.join(format!("{name}.rs"));
        let nested = dir.join(name).join("mod.rs");
        walk_modules(if flat.exists() { &flat } else { &nested }, modules);
    }
}

/// The name in a `mod name;` line (with any visibility), or `None`.
fn declared_module(line: &str) -> Option<&str> {
    let rest = line.strip_suffix(';')?;
    let at = rest.find("mod ")?;
    let (before, name) = (&rest[..at], rest[at + 4..].trim());
    let visibility = before.trim();
    (visibility.is_empty() || visibility.starts_with("pub"))
        .then_some(name)
        .filter(|n| n.chars().all(|c| c.is_alphanumeric() || c == '_'))
}

/// Every `Cargo.toml` below `dir`, skipping `target/` and hidden directories.
fn collect_manifests(dir: &Path, manifests: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                collect_manifests(&path, manifests);
            }
        } else if name == "Cargo.toml" {
            manifests.push(path);
        }
    }
}

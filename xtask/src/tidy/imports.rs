//! Modules of one crate that import each other.
//!
//! Each file under `crates/*/src` is a module (`lib.rs` the crate, `a.rs` or `a/mod.rs`
//! the module `a`, `a/b.rs` its child `b`). Its `use` items (outside its inline test
//! module) name other modules: `crate::a::b::Item`, `super::Item`, `self::c::Item` are
//! made absolute, and the longest prefix that is a module is the one imported, unless
//! what follows is a name that module re-exports (`pub use`), which is followed to where
//! it comes from. So `use crate::Error` in `redis/limiter.rs` imports `error`, not the
//! crate root that re-exports it. Re-exports themselves (`pub use`, `pub(crate) use`, ...)
//! are the facade of a module, not an import, and draw no edge. Two modules that import
//! each other, directly, are reported.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use super::{crate_source, lines_before_tests};

/// One `use` path, flattened: its segments, and whether it was a re-export.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UsePath {
    segments: Vec<String>,
    /// The name it is bound to (the last segment, or what follows `as`); `*` for a glob.
    name: String,
    public: bool,
}

/// The modules of one crate, by path (`[]` is the crate root), with what each re-exports
/// and imports.
#[derive(Debug, Default)]
struct Crate {
    modules: BTreeMap<Vec<String>, Module>,
}

#[derive(Debug, Default)]
struct Module {
    /// The file, as shown in a problem.
    shown: String,
    /// Name -> the absolute path it re-exports.
    exports: BTreeMap<String, Vec<String>>,
    /// Absolute paths imported.
    imports: Vec<Vec<String>>,
}

/// Every pair of modules of one crate that import each other, one line each.
pub(super) fn cycles(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut crates: BTreeMap<PathBuf, Crate> = BTreeMap::new();
    for file in files {
        let Some((krate, below)) = crate_source(root, file) else {
            continue;
        };
        let Some(module) = module_path(&below) else {
            continue;
        };
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        let entry = crates.entry(krate).or_default();
        let mut m = Module {
            shown,
            ..Module::default()
        };
        let code: String = text
            .lines()
            .take(lines_before_tests(&text))
            .collect::<Vec<_>>()
            .join("\n");
        for used in use_paths(&code) {
            let Some(absolute) = absolute(&module, &used.segments) else {
                continue;
            };
            if used.public {
                m.exports.insert(used.name.clone(), absolute);
            } else {
                m.imports.push(absolute);
            }
        }
        entry.modules.insert(module, m);
    }
    let mut problems = Vec::new();
    for krate in crates.values() {
        let mut edges: BTreeSet<(Vec<String>, Vec<String>)> = BTreeSet::new();
        for (path, module) in &krate.modules {
            for import in &module.imports {
                if let Some(target) = krate.target(import, 0)
                    && target != *path
                {
                    edges.insert((path.clone(), target));
                }
            }
        }
        for (a, b) in &edges {
            if a < b && edges.contains(&(b.clone(), a.clone())) {
                problems.push(format!(
                    "{} and {} import each other: a layer imports the layers below it only",
                    krate.modules[a].shown, krate.modules[b].shown
                ));
            }
        }
    }
    problems
}

impl Crate {
    /// The module `path` (an absolute path to an item or a module) comes from, following
    /// re-exports; `None` outside the crate.
    fn target(&self, path: &[String], depth: usize) -> Option<Vec<String>> {
        if depth > 16 {
            return None;
        }
        // The longest prefix that is a module.
        let len = (0..=path.len())
            .rev()
            .find(|&n| self.modules.contains_key(&path[..n]))?;
        let module = &path[..len];
        if let Some(next) = path.get(len)
            && let Some(source) = self.modules[module].exports.get(next)
        {
            let mut followed = source.clone();
            followed.extend_from_slice(&path[len + 1..]);
            if followed != path {
                return self.target(&followed, depth + 1);
            }
        }
        Some(module.to_vec())
    }
}

/// The module path of a file below `src/`: `lib.rs` is `[]`, `a.rs` and `a/mod.rs` are
/// `["a"]`, `a/b.rs` is `["a", "b"]`; `None` for `main.rs` and binaries.
fn module_path(below: &Path) -> Option<Vec<String>> {
    let parts: Vec<String> = below
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let (last, dirs) = parts.split_last()?;
    if dirs.first().is_some_and(|d| d == "bin") || last == "main.rs" {
        return None;
    }
    let mut path = dirs.to_vec();
    match last.strip_suffix(".rs")? {
        "lib" if dirs.is_empty() => {}
        "mod" => {}
        name => path.push(name.to_owned()),
    }
    Some(path)
}

/// `segments` as used in `module`, made absolute (`crate::`, `super::`, `self::`); `None`
/// for a path outside the crate (another crate, `std`).
fn absolute(module: &[String], segments: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String>;
    let mut rest = segments;
    match segments.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            rest = &segments[1..];
        }
        Some("self") => {
            base = module.to_vec();
            rest = &segments[1..];
        }
        Some("super") => {
            base = module.to_vec();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(base)
}

/// The `use` items of `code`, flattened (`use a::{b, c::{d as e, *}}` is `a::b`, `a::c::d`
/// bound as `e`, and `a::c::*`).
fn use_paths(code: &str) -> Vec<UsePath> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = find_use(rest) {
        let (public, after) = at;
        let Some(end) = after.find(';') else { break };
        let tree: String = after[..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        flatten(&tree, &[], public, &mut found);
        rest = &after[end + 1..];
    }
    found
}

/// The next `use` item: whether it is a re-export, and the text after `use `.
fn find_use(code: &str) -> Option<(bool, &str)> {
    let mut offset = 0;
    while let Some(found) = code[offset..].find("use ") {
        let at = offset + found;
        offset = at + 4;
        // At the start of a line, after any visibility.
        let line_start = code[..at].rfind('\n').map_or(0, |n| n + 1);
        let before = code[line_start..at].trim();
        let public = match before {
            "" => false,
            b if b.starts_with("pub") => true,
            _ => continue,
        };
        if before.contains("//") {
            continue;
        }
        return Some((public, &code[at + 4..]));
    }
    None
}

/// Flattens one use tree (text without the trailing `;`) under `prefix`.
fn flatten(tree: &str, prefix: &[String], public: bool, found: &mut Vec<UsePath>) {
    let tree = tree.trim().trim_start_matches("::");
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let mut base = prefix.to_vec();
        base.extend(segments(head));
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        for part in split_top(inner) {
            flatten(part, &base, public, found);
        }
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((path, alias)) => (path.trim(), Some(alias.trim())),
        None => (tree, None),
    };
    let mut full = prefix.to_vec();
    full.extend(segments(path));
    let Some(last) = full.last().cloned() else {
        return;
    };
    let name = alias.map_or_else(
        || {
            if last == "self" {
                full.get(full.len().wrapping_sub(2))
                    .cloned()
                    .unwrap_or(last)
            } else {
                last
            }
        },
        str::to_owned,
    );
    if full.last().is_some_and(|s| s == "*") {
        full.pop();
    }
    found.push(UsePath {
        segments: full,
        name,
        public,
    });
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Splits `text` at the commas outside braces.
fn split_top(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(code: &str) -> Vec<(String, String, bool)> {
        use_paths(code)
            .into_iter()
            .map(|u| (u.segments.join("::"), u.name, u.public))
            .collect()
    }

    #[test]
    fn use_trees_are_flattened() {
        let code = "use std::fmt;\nuse super::{keys::RedisKeys, pool::{self, QueryError as Q}, *};\n    pub use self::a::B;\n// use not::this;\nlet x = 1; // a use of nothing\n";
        assert_eq!(
            paths(code),
            [
                ("std::fmt".into(), "fmt".into(), false),
                ("super::keys::RedisKeys".into(), "RedisKeys".into(), false),
                ("super::pool::self".into(), "pool".into(), false),
                ("super::pool::QueryError".into(), "Q".into(), false),
                ("super".into(), "*".into(), false),
                ("self::a::B".into(), "B".into(), true),
            ]
        );
    }

    #[test]
    fn module_paths_and_absolute_paths() {
        assert_eq!(module_path(Path::new("lib.rs")), Some(vec![]));
        assert_eq!(
            module_path(Path::new("redis/limiter.rs")),
            Some(vec!["redis".to_owned(), "limiter".to_owned()])
        );
        assert_eq!(
            module_path(Path::new("a/mod.rs")),
            Some(vec!["a".to_owned()])
        );
        assert_eq!(module_path(Path::new("bin/x.rs")), None);
        let m = vec!["redis".to_owned(), "limiter".to_owned()];
        let seg = |s: &str| segments(s);
        assert_eq!(
            absolute(&m, &seg("super::keys::RedisKeys")),
            Some(seg("redis::keys::RedisKeys"))
        );
        assert_eq!(absolute(&m, &seg("crate::Error")), Some(seg("Error")));
        assert_eq!(absolute(&m, &seg("std::fmt")), None);
    }
}

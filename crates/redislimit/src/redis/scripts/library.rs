//! How the scripts become one Redis Functions library.
//!
//! Self-contained (no imports from the crate) so that the model test
//! (`tests/model/main.rs`) builds its library with the same code.

/// The source of a function library named `name`: `common` once, at load,
/// then each `(op, body)` as a function `{name}_{op}` whose body reads its
/// keys and arguments as `KEYS` and `ARGV`, exactly as the same body run by
/// `EVAL` after `common` does.
///
/// `name` must be a valid library name (letters, digits and underscores).
pub(crate) fn function_library(name: &str, common: &str, ops: &[(&str, &str)]) -> String {
    let mut lib = format!("#!lua name={name}\n{common}\n");
    for (op, body) in ops {
        lib.push_str(&format!(
            "local function op_{op}(KEYS, ARGV)\n{body}\nend\n\
             redis.register_function('{name}_{op}', op_{op})\n"
        ));
    }
    lib
}

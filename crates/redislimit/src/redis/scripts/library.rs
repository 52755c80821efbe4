//! How the scripts become one Redis Functions library.
//!
//! Self-contained (no imports from the crate) so that the model test
//! (`tests/model/main.rs`) builds its library with the same code.

/// The operations that free what a host holds (a lease, a booking) or
/// record a server's refusal (a penalty, a backoff): registered with
/// `allow-oom`, so that a server at its `maxmemory` without eviction still
/// runs them. (A function without flags is refused whole there, where a
/// script was refused only at its first command that may grow memory.)
/// The others are refused whole, as an acquire that would book a lease
/// should be.
const ALLOW_OOM: [&str; 4] = ["release", "renew", "penalize", "backoff"];

/// The source of a function library named `name`: `common` once, at load,
/// then each `(op, body)` as a function `{name}_{op}` whose body reads its
/// keys and arguments as `KEYS` and `ARGV`, exactly as the same body run by
/// `EVAL` after `common` does.
///
/// `name` must be a valid library name (letters, digits and underscores).
pub(crate) fn function_library(name: &str, common: &str, ops: &[(&str, &str)]) -> String {
    let mut lib = format!("#!lua name={name}\n{common}\n");
    for (op, body) in ops {
        let flags = if ALLOW_OOM.contains(op) {
            "{'allow-oom'}"
        } else {
            "{}"
        };
        lib.push_str(&format!(
            "local function op_{op}(KEYS, ARGV)\n{body}\nend\n\
             redis.register_function{{function_name='{name}_{op}', callback=op_{op}, \
             flags={flags}}}\n"
        ));
    }
    lib
}

//! Repository rules, checked over every Rust file under `crates/`,
//! `python/`, `xtask/`, `tests/` and `fuzz/fuzz_targets/`: module docs first, no panicking or
//! skipped tests, no leftover `dbg!`, `todo!` or `unimplemented!`, unsafe code
//! forbidden at every crate root, and a reason on every lint exception outside
//! tests.
//!
//! The patterns are spelled with `concat!` so that this file does not break
//! the rules it states.

use std::path::{Path, PathBuf};

/// The folders walked, relative to the repository root.
const ROOTS: [&str; 5] = ["crates", "python", "xtask", "tests", "fuzz/fuzz_targets"];

/// Text no Rust file may contain, and why.
const FORBIDDEN: [(&str, &str); 5] = [
    (
        concat!("#[", "should_panic"),
        "a test states the error it expects instead of expecting a panic",
    ),
    (
        concat!("#[", "ignore"),
        "slow tests are gated by an environment variable, not skipped",
    ),
    (concat!("dbg", "!("), "debugging output is not committed"),
    (concat!("todo", "!("), "unfinished code is not committed"),
    (
        concat!("unimplemented", "!("),
        "unfinished code is not committed",
    ),
];

/// Attributes that silence a lint, each of which must say why.
const LINT_EXCEPTIONS: [&str; 4] = [
    concat!("#[", "allow("),
    concat!("#![", "allow("),
    concat!("#[", "expect("),
    concat!("#![", "expect("),
];

/// A Rust file of the repository.
struct Source {
    /// Its path from the repository root, with `/` separators.
    path: String,
    /// Its contents.
    text: String,
}

impl Source {
    /// Whether the whole file is test code: an integration test, or a unit
    /// test module in its own `tests.rs`.
    fn is_test_file(&self) -> bool {
        self.path.starts_with("tests/")
            || self.path.contains("/tests/")
            || self.path.ends_with("/tests.rs")
    }

    /// The part of the file that is not test code: everything before an
    /// inline `#[cfg(test)] mod name {` (a `mod tests;` line leaves the rest in).
    fn non_test_text(&self) -> &str {
        if self.is_test_file() {
            return "";
        }
        non_test_part(&self.text)
    }
}

/// The text before an inline test module.
pub(super) fn non_test_part(text: &str) -> &str {
    let cfg_test = "#[cfg(test)]";
    let mut from = 0;
    while let Some(found) = text.get(from..).and_then(|rest| rest.find(cfg_test)) {
        let start = from + found;
        let after = text
            .get(start + cfg_test.len()..)
            .unwrap_or("")
            .trim_start();
        let item = after.lines().next().unwrap_or("");
        if item.starts_with("mod ") && !item.trim_end().ends_with(';') {
            return text.get(..start).unwrap_or(text);
        }
        from = start + cfg_test.len();
    }
    text
}

/// The 1-based line of a byte offset in a text.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(0, |before| before.matches('\n').count())
        + 1
}

/// The repository root: the parent of this package's directory.
pub(super) fn repo_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap().to_path_buf()
}

/// Every Rust file under the walked folders, skipping `target/` and hidden folders.
fn sources() -> Vec<Source> {
    let root = repo_root();
    let mut files = Vec::new();
    for dir in ROOTS {
        walk(&root.join(dir), &mut files);
    }
    files.sort();
    assert!(
        !files.is_empty(),
        "no Rust files found under {}",
        root.display()
    );
    files
        .into_iter()
        .map(|file| Source {
            path: file
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/"),
            text: std::fs::read_to_string(&file).unwrap(),
        })
        .collect()
}

/// Adds the `.rs` files under a folder.
fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                walk(&path, files);
            }
        } else if name.ends_with(".rs") {
            files.push(path);
        }
    }
}

/// Fails, listing every place that breaks a rule. `violations` gives, for one
/// file, a description of each place (`line N: ...`).
#[track_caller]
fn check(rule: &str, violations: impl Fn(&Source) -> Vec<String>) {
    let found: Vec<String> = sources()
        .iter()
        .flat_map(|source| {
            violations(source)
                .into_iter()
                .map(|place| format!("  {}: {place}", source.path))
        })
        .collect();
    assert!(
        found.is_empty(),
        "{rule}; {} place(s) break it:\n{}",
        found.len(),
        found.join("\n")
    );
}

/// Every place a pattern occurs in a text, as `line N: pattern`.
fn occurrences(text: &str, pattern: &str) -> Vec<String> {
    text.match_indices(pattern)
        .map(|(offset, _)| format!("line {}: `{pattern}`", line_of(text, offset)))
        .collect()
}

/// The lint exceptions in a text that give no reason, as `line N: attribute`.
fn exceptions_without_reason(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for pattern in LINT_EXCEPTIONS {
        for (offset, _) in text.match_indices(pattern) {
            let attribute = attribute_at(text.get(offset..).unwrap_or(""));
            if !attribute.contains("reason") {
                let one_line = attribute.split_whitespace().collect::<Vec<_>>().join(" ");
                found.push(format!("line {}: `{one_line}`", line_of(text, offset)));
            }
        }
    }
    found.sort();
    found
}

/// The attribute starting a text, up to its closing `]`.
fn attribute_at(text: &str) -> &str {
    let mut depth = 0usize;
    for (offset, c) in text.char_indices() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return text.get(..=offset).unwrap_or(text);
                }
            }
            _ => {}
        }
    }
    text
}

#[test]
fn every_file_starts_with_module_docs() {
    // A fuzz target is one line after `#![no_main]`, which libFuzzer needs
    // first; it is exempt.
    check("every Rust file starts with a `//!` line", |source| {
        let first = source.text.lines().next().unwrap_or("");
        let fuzz_target = source.path.starts_with("fuzz/fuzz_targets/") && first == "#![no_main]";
        if first.starts_with("//!") || fuzz_target {
            vec![]
        } else {
            vec![format!("line 1: `{first}`")]
        }
    });
}

#[test]
fn no_forbidden_text() {
    for (pattern, why) in FORBIDDEN {
        check(&format!("no `{pattern}`: {why}"), |source| {
            occurrences(&source.text, pattern)
        });
    }
}

/// The crates allowed unsafe code, each with the discipline above.
const UNSAFE_CRATES: [&str; 2] = ["crates/dk-device-c/", "crates/dk-espeak/"];

#[test]
fn crate_roots_forbid_unsafe_code() {
    let forbid = "#![forbid(unsafe_code)]";
    check(&format!("every crate root has `{forbid}`"), |source| {
        let parts: Vec<&str> = source.path.split('/').collect();
        // dk-device-c is the C ABI and dk-espeak the calls into
        // libespeak-ng, unsafe by nature: each Cargo.toml denies unsafe
        // code and every undocumented unsafe block, and each root allows
        // unsafe code with the reason.
        let crate_root = matches!(
            parts.as_slice(),
            ["crates" | "python", _, "src", "lib.rs" | "main.rs"] | ["xtask", "src", "main.rs"]
        ) && !UNSAFE_CRATES.iter().any(|dir| source.path.starts_with(dir));
        if crate_root && !source.text.contains(forbid) {
            vec!["no such line".to_owned()]
        } else {
            vec![]
        }
    });
}

#[test]
fn lint_exceptions_outside_tests_give_a_reason() {
    check(
        "every lint `allow` or `expect` outside tests has `reason = \"...\"`",
        |source| {
            // The non-test part starts the file, so its line numbers are the file's.
            exceptions_without_reason(source.non_test_text())
        },
    );
}

/// The scanners themselves, on small texts.
#[test]
fn scanners() {
    #[track_caller]
    fn check_scan(text: &str, expected: &[&str]) {
        assert_eq!(exceptions_without_reason(non_test_part(text)), expected);
    }
    let allow = LINT_EXCEPTIONS[0];
    let expect = LINT_EXCEPTIONS[2];
    check_scan("fn f() {}", &[]);
    check_scan(
        &format!("{allow}dead_code)]"),
        &["line 1: `#[allow(dead_code)]`"],
    );
    check_scan(&format!("{allow}dead_code, reason = \"kept\")]"), &[]);
    check_scan(
        &format!("a\n{expect}\n    clippy::indexing_slicing,\n    reason = \"checked above\"\n)]"),
        &[],
    );
    check_scan(
        &format!("a\n{expect}\n    clippy::indexing_slicing\n)]\nfn f() {{ g(\"reason\") }}"),
        &["line 2: `#[expect( clippy::indexing_slicing )]`"],
    );
    check_scan(
        &format!("#[cfg(test)]\nmod tests;\n{allow}x)]"),
        &["line 3: `#[allow(x)]`"],
    );
    check_scan(
        &format!("fn f() {{}}\n#[cfg(test)]\nmod tests {{\n{allow}x)]\n}}"),
        &[],
    );
}

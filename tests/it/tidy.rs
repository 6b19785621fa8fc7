//! Repository rules, checked over every Rust file under `crates/`,
//! `python/`, `xtask/`, `tests/` and `fuzz/fuzz_targets/`: module docs first, no panicking or
//! skipped tests, no leftover `dbg!`, `todo!` or `unimplemented!`, unsafe code
//! forbidden at every crate root, a reason on every lint exception outside
//! tests, and no assertion in test code that reads the wall clock.
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

/// Macros that assert, whose arguments are scanned for a clock reading.
const ASSERTIONS: [&str; 3] = [
    concat!("assert", "!("),
    concat!("assert_eq", "!("),
    concat!("assert_ne", "!("),
];

/// What reads the clock in an assertion's arguments: a test that bounds
/// how long something took fails on a loaded machine, or passes on a fast
/// one whatever the code does.
const CLOCK_READINGS: [&str; 4] = [
    concat!("Instant", "::now()"),
    concat!(".elapsed", "()"),
    concat!("duration_since", "("),
    concat!("SystemTime", "::now()"),
];

/// A sleep, which in test code must say why it is there.
const SLEEP: &str = concat!("sleep", "(");

/// How many lines above a sleep its comment may start.
const SLEEP_COMMENT_LINES: usize = 3;

/// What a file on tokio's paused clock says: its `Instant` is tokio's,
/// which moves only when every task waits, so its readings are exact.
const PAUSED_CLOCK: [&str; 2] = ["start_paused = true", "time::pause()"];

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

/// The test code of a file: all of a test file, else the text from its
/// inline `#[cfg(test)] mod name {` on; none of a bench (`benches/`),
/// which measures time.
fn test_part<'a>(path: &str, text: &'a str) -> &'a str {
    if path.contains("benches/") {
        return "";
    }
    let whole_file =
        path.starts_with("tests/") || path.contains("/tests/") || path.ends_with("tests.rs");
    if whole_file {
        return text;
    }
    text.get(non_test_part(text).len()..).unwrap_or("")
}

/// The assertions in a test text that read the wall clock, as `line N:
/// assertion`; none in a file on tokio's paused clock that never names
/// std's `Instant`. `offset` is where the text starts in its file.
fn wall_time_assertions(text: &str, offset_in_file: usize, file: &str) -> Vec<String> {
    let paused = PAUSED_CLOCK.iter().any(|p| file.contains(p))
        && !file.contains("std::time::Instant")
        && !file.contains("std::time::{Duration, Instant}")
        && !file.contains("std::time::{Instant");
    if paused {
        return Vec::new();
    }
    let mut found = Vec::new();
    for macro_name in ASSERTIONS {
        for (offset, _) in text.match_indices(macro_name) {
            // `debug_assert!(` and the like are assertions too.
            let arguments = arguments_at(text.get(offset + macro_name.len() - 1..).unwrap_or(""));
            if CLOCK_READINGS.iter().any(|r| arguments.contains(r)) {
                let one_line = arguments.split_whitespace().collect::<Vec<_>>().join(" ");
                found.push(format!(
                    "line {}: `{macro_name}{}`",
                    line_of(file, offset_in_file + offset),
                    one_line.get(1..).unwrap_or("")
                ));
            }
        }
    }
    found.sort();
    found
}

/// The parenthesised arguments starting a text, up to their closing `)`,
/// skipping brackets inside string and character literals; empty when
/// they do not close.
fn arguments_at(text: &str) -> &str {
    let mut depth = 0usize;
    let mut chars = text.char_indices().peekable();
    while let Some((offset, c)) = chars.next() {
        match c {
            '"' => {
                // A string: up to the next unescaped quote.
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' => {
                // A character literal (`'('`, `'\\''`); a lifetime has no
                // closing quote and is passed over.
                let rest = text.get(offset + 1..).unwrap_or("");
                let length = if rest.starts_with('\\') {
                    rest.get(2..).and_then(|r| r.find('\'')).map(|n| n + 3)
                } else {
                    rest.chars().next().and_then(|first| {
                        let after = first.len_utf8();
                        rest.get(after..)?.starts_with('\'').then_some(after + 1)
                    })
                };
                if let Some(length) = length {
                    while chars.peek().is_some_and(|(at, _)| *at <= offset + length) {
                        chars.next();
                    }
                }
            }
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return text.get(..=offset).unwrap_or(text);
                }
            }
            _ => {}
        }
    }
    ""
}

/// The sleeps in a test text with no `//` comment on their line or on the
/// [`SLEEP_COMMENT_LINES`] lines above, as `line N: text`; `first_line` is
/// the line the text starts on in its file.
fn unexplained_sleeps(text: &str, first_line: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        if !line.contains(SLEEP) || line.trim_start().starts_with("//") {
            continue;
        }
        let from = index.saturating_sub(SLEEP_COMMENT_LINES);
        let explained = lines
            .get(from..=index)
            .is_some_and(|near| near.iter().any(|l| l.contains("//")));
        if !explained {
            found.push(format!("line {}: `{}`", first_line + index, line.trim()));
        }
    }
    found
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

/// The crates allowed unsafe code, each with the discipline below
/// (ARCHITECTURE.md's invariants name the same, `map.rs` checks).
pub(super) const UNSAFE_CRATES: [&str; 2] = ["crates/dk-device-c/", "crates/dk-espeak/"];

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
            ["crates" | "python", _, "src", "lib.rs" | "main.rs"]
                | ["xtask", "src", "main.rs"]
                | ["tests", "lib.rs"]
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

#[test]
fn no_assertion_in_tests_reads_the_wall_clock() {
    check(
        "no assertion in test code reads the wall clock (wait for the condition with \
         dk-testkit's `eventually`, assert the order or the outcome, measure in a bench)",
        |source| {
            let tests = test_part(&source.path, &source.text);
            let offset = source.text.len() - tests.len();
            wall_time_assertions(tests, offset, &source.text)
        },
    );
}

#[test]
fn every_sleep_in_tests_says_why() {
    check(
        "a sleep in test code says why in a comment on its line or just above \
         (pacing traffic, holding time); a wait for something is dk-testkit's `eventually`",
        |source| {
            if source.path.starts_with("crates/dk-testkit/") {
                return Vec::new();
            }
            let tests = test_part(&source.path, &source.text);
            let first_line = line_of(&source.text, source.text.len() - tests.len());
            unexplained_sleeps(tests, first_line)
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

    #[track_caller]
    fn check_clock(path: &str, text: &str, expected: &[String]) {
        let tests = test_part(path, text);
        let offset = text.len() - tests.len();
        assert_eq!(wall_time_assertions(tests, offset, text), expected);
    }
    let sleep = format!("std::thread::{SLEEP}Duration::from_millis(5));");
    assert_eq!(
        unexplained_sleeps(&format!("a\n{sleep}\n// Paces.\nb\n{sleep}\n"), 10),
        [format!("line 11: `{sleep}`")]
    );
    assert!(unexplained_sleeps(&format!("// Paces.\na\nb\nc\n{sleep}"), 1).len() == 1);
    assert!(unexplained_sleeps(&format!("// Paces.\na\nb\n{sleep}"), 1).is_empty());

    let [assert, assert_eq, _] = ASSERTIONS;
    let [now, elapsed, since, _] = CLOCK_READINGS;
    check_clock("a/tests/x.rs", &format!("{assert}ok);"), &[]);
    check_clock(
        "tests/benches/x.rs",
        &format!("{assert}t{elapsed} < L);"),
        &[],
    );
    check_clock(
        "a/tests/x.rs",
        &format!("let t = Instant{now};\n{assert}\n  t{elapsed} < LIMIT,\n  \"slow )\"\n);"),
        &[format!(
            "line 2: `{assert} t{elapsed} < LIMIT, \"slow )\" )`"
        )],
    );
    check_clock(
        "a/tests/x.rs",
        &format!("{assert_eq}c, ']'); {assert}x == '\\'', \"[\"); {assert}f::<'a>(t{elapsed}));"),
        &[format!("line 1: `{assert}f::<'a>(t{elapsed}))`")],
    );
    check_clock(
        "a/src/x.rs",
        &format!(
            "fn f() {{ {assert}Instant{now} < d) }}\n#[cfg(test)]\nmod tests {{\n  \
             fn t() {{ debug_{assert_eq}a.{since}b), c); }}\n}}"
        ),
        &[format!("line 4: `{assert_eq}a.{since}b), c)`")],
    );
    check_clock(
        "a/src/tests.rs",
        &format!("#[tokio::test(start_paused = true)]\nfn t() {{ {assert}t{elapsed} >= S); }}"),
        &[],
    );
    check_clock(
        "a/src/tests.rs",
        &format!(
            "use std::time::Instant;\n#[tokio::test(start_paused = true)]\n\
             fn t() {{ {assert}t{elapsed} >= S); }}"
        ),
        &[format!("line 3: `{assert}t{elapsed} >= S)`")],
    );
}

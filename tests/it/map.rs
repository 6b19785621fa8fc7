//! ARCHITECTURE.md cannot drift from the code: three checks over the map
//! and the tree it describes.
//!
//! - every path it names in backticks exists (a `.rs` file, a folder written
//!   with a final `/`, or a file path with a folder), looked up from the
//!   section that names it: a crate's section from its `src/`, its folder,
//!   then the repository (a crate under `python/` as one under `crates/`);
//!   the `tests/` section from `tests/it/`, `tests/`,
//!   then the repository; every other section from the repository;
//! - every source file of a library crate is named in its crate's section,
//!   by its path under `src/` (`adapter/budget.rs`; a `mod.rs` by its folder,
//!   `file/`), but the crate root and test files;
//! - the table under "Crates and what they depend on" lists, for every crate
//!   under `crates/` and `python/`, exactly the dk crates in its `[dependencies]`, and of
//!   the outside crates the table names, exactly those it depends on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::layering::{crate_dirs, dependencies};
use super::tidy::repo_root;

/// The map's file, from the repository root.
const MAP: &str = "ARCHITECTURE.md";

/// The heading of the dependency table's section.
const TABLE_HEADING: &str = "## Crates and what they depend on";

/// Extensions of the files the map may name with a folder (`fixtures/x.json`).
const NAMED_EXTENSIONS: [&str; 11] = [
    "rs", "json", "md", "toml", "txt", "yaml", "yml", "py", "html", "css", "js",
];

/// A section of the map: where a relative path named in it is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Section {
    /// `### `crates/NAME``, `### `python/NAME``: the crate's folder, from
    /// the repository root.
    Crate(String),
    /// `### `tests/``.
    Tests,
    /// Any other section.
    Root,
}

impl Section {
    /// The section a heading line starts, if it is a heading.
    fn of_heading(line: &str) -> Option<Section> {
        if !line.starts_with('#') {
            return None;
        }
        let title = line.trim_start_matches('#').trim();
        let code = title.strip_prefix('`').and_then(|t| t.split('`').next());
        Some(match code {
            Some(path) if path.starts_with("crates/") || path.starts_with("python/") => {
                Section::Crate(path.trim_end_matches('/').to_owned())
            }
            Some("tests/") => Section::Tests,
            _ => Section::Root,
        })
    }

    /// The folders a relative path named in this section may start from.
    fn bases(&self, root: &Path) -> Vec<PathBuf> {
        match self {
            Section::Crate(folder) => {
                let dir = root.join(folder);
                vec![dir.join("src"), dir, root.to_path_buf()]
            }
            Section::Tests => vec![
                root.join("tests").join("it"),
                root.join("tests"),
                root.to_path_buf(),
            ],
            Section::Root => vec![root.to_path_buf()],
        }
    }
}

/// The code spans of `text` (between backticks), each with the section it
/// is in and its line number.
fn code_spans(text: &str) -> Vec<(Section, usize, String)> {
    let mut spans = Vec::new();
    let mut section = Section::Root;
    let mut in_block = false;
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        if let Some(next) = Section::of_heading(line) {
            section = next;
        }
        for (n, span) in line.split('`').enumerate() {
            if n % 2 == 1 {
                spans.push((section.clone(), index + 1, span.to_owned()));
            }
        }
    }
    spans
}

/// Whether a code span names a path in the repository: a `.rs` file, a
/// folder (`name/`), or a file under a folder with one of
/// `NAMED_EXTENSIONS`; never a template (`<id>`, `{id}`), a URL path
/// (`/mcp`), a pattern or a command.
fn is_repository_path(span: &str) -> bool {
    let plain = !span.is_empty()
        && span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && !span.starts_with('/')
        && !span.starts_with('.')
        && !span.contains("//");
    if !plain {
        return false;
    }
    let extension = span.rsplit_once('.').map(|(_, ext)| ext);
    span.ends_with(".rs")
        || (span.ends_with('/') && !span.trim_end_matches('/').contains('.'))
        || (span.contains('/') && extension.is_some_and(|ext| NAMED_EXTENSIONS.contains(&ext)))
}

/// The paths the map names that exist nowhere it could mean, as
/// `line N: path`.
fn missing_paths(map: &str, root: &Path) -> Vec<String> {
    code_spans(map)
        .into_iter()
        .filter(|(_, _, span)| is_repository_path(span))
        .filter(|(section, _, span)| {
            !section
                .bases(root)
                .iter()
                .any(|base| base.join(span).exists())
        })
        .map(|(_, line, span)| format!("line {line}: `{span}`"))
        .collect()
}

/// Whether a file under a crate's `src/` holds tests only.
fn is_test_file(relative: &str) -> bool {
    let name = relative.rsplit('/').next().unwrap_or(relative);
    name.ends_with("tests.rs") || relative.split('/').any(|part| part == "tests")
}

/// The `.rs` files under `dir`, as paths relative to it with `/`.
fn rust_files(dir: &Path, prefix: &str, found: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let relative = format!("{prefix}{name}");
        if path.is_dir() {
            rust_files(&path, &format!("{relative}/"), found);
        } else if name.ends_with(".rs") {
            found.push(relative);
        }
    }
}

/// The ways the map may name a source file: its path under `src/`, and for
/// a `mod.rs` its folder.
fn names_of(relative: &str) -> Vec<String> {
    match relative.strip_suffix("mod.rs") {
        Some(folder) if !folder.is_empty() => vec![relative.to_owned(), folder.to_owned()],
        _ => vec![relative.to_owned()],
    }
}

/// The library crates under `crates/` and `python/` (those with a
/// `src/lib.rs`), each by its folder from the repository root.
fn library_crates() -> Vec<(String, PathBuf)> {
    let root = repo_root();
    crate_dirs()
        .into_iter()
        .filter(|(_, dir)| dir.join("src").join("lib.rs").is_file())
        .map(|(_, dir)| {
            let folder = dir.strip_prefix(&root).unwrap().to_string_lossy();
            (folder.replace('\\', "/"), dir)
        })
        .collect()
}

/// The source files of library crates the map's crate sections never name.
fn unnamed_sources(map: &str) -> Vec<String> {
    let mut named: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (section, _, span) in code_spans(map) {
        if let Section::Crate(folder) = section {
            named.entry(folder).or_default().insert(span);
        }
    }
    let mut unnamed = Vec::new();
    for (folder, dir) in library_crates() {
        let mut files = Vec::new();
        rust_files(&dir.join("src"), "", &mut files);
        files.sort();
        let spans = named.get(&folder).cloned().unwrap_or_default();
        for file in files {
            if file == "lib.rs" || is_test_file(&file) {
                continue;
            }
            if !names_of(&file).iter().any(|n| spans.contains(n)) {
                unnamed.push(format!("{folder}/src/{file}"));
            }
        }
    }
    unnamed
}

/// The rows of the dependency table: crate -> (dk crates, outside crates).
fn dependency_table(map: &str) -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let mut rows = BTreeMap::new();
    let Some(start) = map.find(TABLE_HEADING) else {
        return rows;
    };
    let section = &map[start + TABLE_HEADING.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [name, dk, outside, ..] = cells.as_slice() else {
            continue;
        };
        let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) else {
            continue;
        };
        let list = |cell: &str| -> BTreeSet<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        };
        rows.insert(name.to_owned(), (list(dk), list(outside)));
    }
    rows
}

/// How the table and the manifests disagree.
fn table_mismatches(map: &str) -> Vec<String> {
    let table = dependency_table(map);
    let mut found = Vec::new();
    let outside_named: BTreeSet<String> = table.values().flat_map(|(_, o)| o.clone()).collect();
    let crates = crate_dirs();
    for (name, dir) in &crates {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let deps = dependencies(&manifest);
        let Some((dk, outside)) = table.get(name) else {
            found.push(format!("{name} has no row in the table"));
            continue;
        };
        let dk_deps: BTreeSet<String> = deps
            .iter()
            .filter(|d| d.as_str() == "dk" || d.starts_with("dk-"))
            .cloned()
            .collect();
        for missing in dk_deps.difference(dk) {
            found.push(format!(
                "{name} depends on {missing}, which its row does not list"
            ));
        }
        for extra in dk.difference(&dk_deps) {
            found.push(format!(
                "{name}'s row lists {extra}, which it does not depend on"
            ));
        }
        let used: BTreeSet<String> = deps.intersection(&outside_named).cloned().collect();
        for missing in used.difference(outside) {
            found.push(format!(
                "{name} depends on {missing}, which its row does not list"
            ));
        }
        for extra in outside.difference(&used) {
            found.push(format!(
                "{name}'s row lists {extra}, which it does not depend on"
            ));
        }
    }
    for name in table.keys() {
        if !crates.iter().any(|(n, _)| n == name) {
            found.push(format!(
                "the table has a row for {name}, which is not a crate"
            ));
        }
    }
    found
}

fn map_text() -> String {
    std::fs::read_to_string(repo_root().join(MAP)).unwrap()
}

#[test]
fn every_path_the_map_names_exists() {
    let missing = missing_paths(&map_text(), &repo_root());
    assert!(
        missing.is_empty(),
        "{MAP} names paths that do not exist:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn every_library_source_file_is_named_in_the_map() {
    let unnamed = unnamed_sources(&map_text());
    assert!(
        unnamed.is_empty(),
        "{MAP} never names these files in their crate's section:\n  {}",
        unnamed.join("\n  ")
    );
}

#[test]
fn the_map_lists_every_crates_dependencies() {
    let text = map_text();
    assert!(
        dependency_table(&text).len() >= 10,
        "{MAP} has no dependency table under `{TABLE_HEADING}`"
    );
    let found = table_mismatches(&text);
    assert!(
        found.is_empty(),
        "{MAP}'s dependency table disagrees with the manifests:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn map_scanners() {
    for path in [
        "adapter.rs",
        "console/assets/",
        "fixtures/rules/good.yaml",
        "tests/it/tidy.rs",
    ] {
        assert!(is_repository_path(path), "{path}");
    }
    for not_path in [
        "api/<crate>.txt",
        "/console/<secret>/",
        "dk://devices/{id}/events",
        "dk vessel --config",
        "Vessel::identity",
        "policies.yaml",
        "vessel.json",
        "./.dk/",
        "N per <window>",
    ] {
        assert!(!is_repository_path(not_path), "{not_path}");
    }
    let map =
        "# Map\n### `crates/dk-x`: x\n- `a.rs` and `b/`\n```\n`c.rs`\n```\n### `tests/`\n`it.rs`\n";
    let spans = code_spans(map);
    assert_eq!(
        spans,
        [
            (
                Section::Crate("crates/dk-x".into()),
                2,
                "crates/dk-x".into()
            ),
            (Section::Crate("crates/dk-x".into()), 3, "a.rs".into()),
            (Section::Crate("crates/dk-x".into()), 3, "b/".into()),
            (Section::Tests, 7, "tests/".into()),
            (Section::Tests, 8, "it.rs".into()),
        ]
    );
    assert_eq!(names_of("file/mod.rs"), ["file/mod.rs", "file/"]);
    assert_eq!(names_of("mod.rs"), ["mod.rs"]);
    assert!(is_test_file("adapter/tests.rs"));
    assert!(is_test_file("server/redact_tests.rs"));
    assert!(is_test_file("allowances/tests/through_adapter.rs"));
    assert!(!is_test_file("adapter/budget.rs"));

    let table = format!(
        "{TABLE_HEADING}\n\n| crate | dk crates | outside |\n|---|---|---|\n\
         | `dk-a` | `dk-b` | `axum`, `hyper` |\n| `dk-b` | | |\n\n## Next\n| `dk-c` | | |\n"
    );
    let rows = dependency_table(&table);
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows["dk-a"],
        (
            BTreeSet::from(["dk-b".to_owned()]),
            BTreeSet::from(["axum".to_owned(), "hyper".to_owned()])
        )
    );
}

//! ARCHITECTURE.md cannot drift from the code: three checks over the map
//! and the tree it describes.
//!
//! - every path it names in backticks exists (a `.rs` file, a folder written
//!   with a final `/`, or a file path with a folder), looked up from the
//!   section that names it: a crate's section from its `src/`, its folder,
//!   then the repository (a crate under `python/` as one under `crates/`);
//!   the `tests/` section from `tests/it/`, `tests/`,
//!   then the repository; every other section from the repository;
//! - every source file of a crate (library or program, the command line's
//!   and xtask's too) is named in its crate's section, by its path under
//!   `src/` (`adapter/budget.rs`; a `mod.rs` by its folder, `file/`) or from
//!   the repository root, but the crate root and test files; and every test
//!   file of `tests/it/` in the `tests/` section;
//! - the table under "Crates and what they depend on" lists, for every crate
//!   under `crates/` and `python/`, exactly the dk crates in its `[dependencies]`, and of
//!   the outside crates the table names, exactly those it depends on;
//! - the table under "Versions that appear twice" lists exactly the crates
//!   and versions `cargo tree -d -e normal --workspace` lists;
//! - the crates the invariants name as exceptions to `forbid(unsafe_code)`
//!   are exactly those the tidy test exempts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use std::process::Command;

use super::layering::{crate_dirs, dependencies};
use super::tidy::{UNSAFE_CRATES, repo_root};

/// The map's file, from the repository root.
const MAP: &str = "ARCHITECTURE.md";

/// The heading of the dependency table's section.
const TABLE_HEADING: &str = "## Crates and what they depend on";

/// The heading of the duplicate versions' section.
const TWICE_HEADING: &str = "## Versions that appear twice";

/// The heading of the invariants' section.
const INVARIANTS_HEADING: &str = "## Cross-cutting invariants";

/// The invariant that names the exceptions to it.
const FORBID_UNSAFE: &str = "- `#![forbid(unsafe_code)]`";

/// Extensions of the files the map may name with a folder (`fixtures/x.json`).
const NAMED_EXTENSIONS: [&str; 11] = [
    "rs", "json", "md", "toml", "txt", "yaml", "yml", "py", "html", "css", "js",
];

/// A section of the map: where a relative path named in it is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Section {
    /// `### `crates/NAME``, `### `python/NAME``, `### `xtask/``: the
    /// crate's folder, from the repository root.
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
            Some(path)
                if path.starts_with("crates/")
                    || path.starts_with("python/")
                    || path == "xtask/" =>
            {
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

/// Every crate whose sources the map must name, by its section's folder
/// from the repository root (`crates/dk`, `xtask`), with the folder its
/// sources are under: the crates under `crates/` and `python/`, libraries
/// and programs, and xtask.
fn source_crates() -> Vec<(String, PathBuf)> {
    let root = repo_root();
    let mut crates: Vec<(String, PathBuf)> = crate_dirs()
        .into_iter()
        .map(|(_, dir)| {
            let folder = dir.strip_prefix(&root).unwrap().to_string_lossy();
            (folder.replace('\\', "/"), dir.join("src"))
        })
        .collect();
    crates.push(("xtask".to_owned(), root.join("xtask").join("src")));
    crates
}

/// The source files the map's sections never name: a crate's in its own
/// section, `tests/it/`'s in the `tests/` section.
fn unnamed_sources(map: &str) -> Vec<String> {
    let mut named: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (section, _, span) in code_spans(map) {
        let key = match section {
            Section::Crate(folder) => folder,
            Section::Tests => "tests".to_owned(),
            Section::Root => continue,
        };
        named.entry(key).or_default().insert(span);
    }
    let mut unnamed = Vec::new();
    let root = repo_root();
    let mut sources = source_crates();
    sources.push(("tests".to_owned(), root.join("tests").join("it")));
    for (folder, dir) in sources {
        let mut files = Vec::new();
        rust_files(&dir, "", &mut files);
        files.sort();
        let spans = named.get(&folder).cloned().unwrap_or_default();
        let under = dir
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let in_tests = folder == "tests";
        for file in files {
            let root_file = matches!(file.as_str(), "lib.rs" | "main.rs");
            if !in_tests && (root_file || is_test_file(&file)) {
                continue;
            }
            if in_tests && file == "main.rs" {
                continue;
            }
            let full = format!("{under}/{file}");
            let mut names = names_of(&file);
            names.push(full.clone());
            if !names.iter().any(|n| spans.contains(n)) {
                unnamed.push(full);
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

/// The text of a `## ` section, without its heading, up to the next one.
fn section<'a>(map: &'a str, heading: &str) -> &'a str {
    let Some(start) = map.find(heading) else {
        return "";
    };
    let rest = &map[start + heading.len()..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

/// Crate name -> versions, as a set of `name major.minor` (or `name
/// major` from 1 on, as the table writes them).
type Versions = BTreeSet<String>;

/// A version as the table writes it: `0.2` for `0.2.17`, `2` for `2.0.119`.
fn short_version(version: &str) -> String {
    let parts: Vec<&str> = version.trim_start_matches('v').split('.').collect();
    match parts.as_slice() {
        ["0", minor, ..] => format!("0.{minor}"),
        [major, ..] => (*major).to_owned(),
        [] => String::new(),
    }
}

/// The duplicate table: `name version` for each crate and each of its
/// versions (`| `a`, `b` | 0.2 / 0.3, 0.1 / 0.2 | why |`).
fn twice_table(map: &str) -> Result<Versions, String> {
    let mut found = Versions::new();
    for line in section(map, TWICE_HEADING)
        .lines()
        .filter(|l| l.starts_with("| `"))
    {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [names, versions, ..] = cells.as_slice() else {
            return Err(format!("a row without versions: {line}"));
        };
        let names: Vec<&str> = names.split('`').skip(1).step_by(2).collect();
        let versions: Vec<&str> = versions.split(',').map(str::trim).collect();
        // One pair of versions for several crates is each one's.
        let versions = match versions.as_slice() {
            [one] => vec![*one; names.len()],
            _ => versions,
        };
        if names.len() != versions.len() {
            return Err(format!(
                "a row with {} crates and {} versions: {line}",
                names.len(),
                versions.len()
            ));
        }
        for (name, pair) in names.iter().zip(versions) {
            for version in pair.split('/') {
                found.insert(format!("{name} {}", version.trim()));
            }
        }
    }
    Ok(found)
}

/// What `cargo tree -d` prints, as `name version` for each crate and
/// version at the top of its inverted trees.
fn cargo_tree_duplicates(output: &str) -> Versions {
    output
        .lines()
        .filter(|line| {
            line.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
        })
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?;
            let version = words.next()?;
            Some(format!("{name} {}", short_version(version)))
        })
        .collect()
}

/// The crates the invariant on unsafe code names as its exceptions, each
/// as a folder with a final `/`.
fn unsafe_exceptions(map: &str) -> BTreeSet<String> {
    let invariants = section(map, INVARIANTS_HEADING);
    let Some(start) = invariants.find(FORBID_UNSAFE) else {
        return BTreeSet::new();
    };
    let bullet = &invariants[start + FORBID_UNSAFE.len()..];
    let bullet = &bullet[..bullet.find("\n- ").unwrap_or(bullet.len())];
    bullet
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.starts_with("crates/") || span.starts_with("python/"))
        .map(|span| format!("{}/", span.trim_end_matches('/')))
        .collect()
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
fn every_source_file_is_named_in_the_map() {
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
fn the_duplicate_table_is_what_cargo_tree_lists() {
    let text = map_text();
    let table = twice_table(&text).unwrap();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "tree",
            "-d",
            "-e",
            "normal",
            "--workspace",
            "--locked",
            "--offline",
        ])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listed = cargo_tree_duplicates(&String::from_utf8_lossy(&output.stdout));
    let missing: Vec<&String> = listed.difference(&table).collect();
    let extra: Vec<&String> = table.difference(&listed).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{MAP}'s `{TWICE_HEADING}` disagrees with `cargo tree -d -e normal --workspace`:\n  \
         listed there, not in the table: {missing:?}\n  in the table, not listed: {extra:?}"
    );
}

#[test]
fn the_map_names_the_crates_allowed_unsafe_code() {
    let named = unsafe_exceptions(&map_text());
    let exempt: BTreeSet<String> = UNSAFE_CRATES.iter().map(|&dir| dir.to_owned()).collect();
    assert_eq!(
        named, exempt,
        "{MAP}'s invariant on unsafe code names other exceptions than tests/it/tidy.rs allows"
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
    let twice = format!(
        "{TWICE_HEADING}\n\n| crate | versions | why |\n|---|---|---|\n\
         | `a`, `b` | 0.2 / 0.3, 1 / 2 | x |\n| `syn` | 2 / 3 | y |\n\n## Next\n| `c` | 1 / 2 | |\n"
    );
    assert_eq!(
        twice_table(&twice).unwrap(),
        BTreeSet::from(["a 0.2", "a 0.3", "b 1", "b 2", "syn 2", "syn 3"].map(str::to_owned))
    );
    assert_eq!(
        twice_table(&format!("{TWICE_HEADING}\n| `a`, `b` | 1 / 2 | x |\n")).unwrap(),
        BTreeSet::from(["a 1", "a 2", "b 1", "b 2"].map(str::to_owned))
    );
    assert!(
        twice_table(&format!(
            "{TWICE_HEADING}\n| `a`, `b`, `c` | 1 / 2, 3 / 4 | x |\n"
        ))
        .is_err()
    );
    let tree = "base64 v0.22.1\n└── postgres-protocol v0.6.8\n    └── dk-store v0.1.0 (/dk)\n\n\
                base64 v0.23.1\n├── dk v0.1.0\nsyn v2.0.119\nthiserror-impl v1.0.69 (proc-macro) (*)\n";
    assert_eq!(
        cargo_tree_duplicates(tree),
        BTreeSet::from(
            ["base64 0.22", "base64 0.23", "syn 2", "thiserror-impl 1"].map(str::to_owned)
        )
    );
    let invariants = format!(
        "{INVARIANTS_HEADING}\n\n{FORBID_UNSAFE} everywhere but `crates/dk-x` and\n  `python/y/` (`lib.rs`).\n- `crates/dk-z` other\n"
    );
    assert_eq!(
        unsafe_exceptions(&invariants),
        BTreeSet::from(["crates/dk-x/".to_owned(), "python/y/".to_owned()])
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

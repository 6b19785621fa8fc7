//! Layering rules, checked over the sources and manifests of `crates/` and
//! `python/`:
//!
//! - no module circles: inside each crate (but those on `CIRCLES_LEFT`), the modules (one per file) and the
//!   paths between them (`use` declarations and `crate::`, `super::`,
//!   `self::` paths outside comments and tests, followed through
//!   re-exports) form no cycle;
//! - crate dependency directions, from each `Cargo.toml`'s
//!   `[dependencies]` and `[build-dependencies]`: dk-proto depends on no dk
//!   crate, dk-policy on none but dk-proto, dk-device on none but dk-proto,
//!   dk-policy, dk-channel and dk-files, dk-channel and dk-files on none, no library crate on `dk`
//!   (the command line), a dk-core, when there is one, on none of axum,
//!   hyper, hyper-util, rusqlite, rmcp and tokio-tungstenite, no crate
//!   (nor the workspace's list) turning on dk-channel's `vectors` feature
//!   (fixed ephemeral keys) or dk-core's or dk-store's `testing` feature (test support)
//!   outside its dev-dependencies, dk-testkit (test support) a
//!   dev-dependency only and depending on no dk crate; dk-fleet on none
//!   but dk-channel and dk-files, and no crate but dk-fleet on async-nats;
//!   the Python SDK's bindings (`python/dk_device`, dk-device-python) on
//!   none but dk-device and dk-proto, and no crate but it on pyo3;
//! - dk-policy's admission contract and rule language share no module;
//! - no foreign type in a public signature of dk-proto, dk-policy, dk-store,
//!   dk-core, dk-channel, dk-fleet and dk-files: the
//!   text of every `pub fn` signature, `pub` field, `pub type`, `pub const`
//!   and `pub static`, `pub enum` body and `impl` header (outside tests;
//!   but a trait's impl for a type the file declares without `pub`, which
//!   nothing outside the crate reaches, like a `pub(crate)` item) names neither a path into one of the crate's private dependencies
//!   (`PURE_CRATES`: `nom::`, `yaml_serde::`, `jiff::`, `rusqlite::`,
//!   `sha2::`, `toml::`, `snow::`, ...) nor a name the file imports from one; a
//!   struct with named fields counts by its head and its `pub` fields.
//!   Private modules are held to it too: a `pub` item there is a
//!   `pub(crate)` one waiting to be exported.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::tidy::{non_test_part, repo_root};

/// A module of a crate: its file and its path (`crate`, `crate::a::b`).
struct Module {
    /// The file, from the repository root.
    file: String,
    /// Its path inside the crate, as segments after `crate`.
    path: Vec<String>,
    /// The non-test text, comments removed.
    code: String,
}

/// The modules of one crate, from its root file (`src/lib.rs` or
/// `src/main.rs`), one per file.
fn modules_of(src: &Path, root_file: &str) -> Vec<Module> {
    let mut modules = Vec::new();
    let root = repo_root();
    let mut files = Vec::new();
    collect_rs(src, &mut files);
    files.sort();
    for file in files {
        let relative = file
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let is_root = relative == root_file;
        let other_root = !is_root && matches!(relative.as_str(), "lib.rs" | "main.rs");
        let test = relative.ends_with("/tests.rs")
            || relative == "tests.rs"
            || relative.contains("tests/")
            || relative.starts_with("bin/");
        if other_root || test {
            continue;
        }
        let path = if is_root {
            Vec::new()
        } else {
            let stem = relative.trim_end_matches(".rs");
            let stem = stem.strip_suffix("/mod").unwrap_or(stem);
            stem.split('/').map(str::to_owned).collect()
        };
        let text = std::fs::read_to_string(&file).unwrap();
        modules.push(Module {
            file: file
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/"),
            path,
            code: strip_comments(non_test_part(&text)),
        });
    }
    modules
}

/// Adds the `.rs` files under a folder.
fn collect_rs(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_rs(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The text without `//` comments (doc comments included) and without the
/// contents of string literals, so paths in docs and messages do not count.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_string = false;
                    out.push('"');
                }
                '\n' => out.push('\n'),
                _ => {}
            }
            continue;
        }
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                in_string = true;
                out.push('"');
            }
            // A raw string: skipped to its end.
            'r' if chars.clone().take(2).collect::<String>() == "#\"" => {
                out.push_str("r#\"");
                chars.nth(1);
                while let Some(c) = chars.next() {
                    if c == '"' && chars.peek() == Some(&'#') {
                        chars.next();
                        break;
                    }
                    if c == '\n' {
                        out.push('\n');
                    }
                }
                out.push_str("\"#");
            }
            // A char literal (`'x'`, `'\''`, `'"'`) is skipped whole; a
            // lifetime is kept.
            '\'' => {
                out.push('\'');
                let ahead: Vec<char> = chars.clone().take(3).collect();
                match ahead.as_slice() {
                    ['\\', ..] => {
                        chars.nth(1);
                        for c in chars.by_ref() {
                            if c == '\'' {
                                break;
                            }
                        }
                        out.push('\'');
                    }
                    [_, '\'', ..] => {
                        chars.nth(1);
                        out.push('\'');
                    }
                    _ => {}
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// The `use` declarations of a text, each as the tree after `use` (`pub`,
/// `pub(crate)` and such dropped), without the `;`.
fn use_trees(code: &str) -> Vec<String> {
    let mut trees = Vec::new();
    let mut rest = code;
    while let Some(found) = find_word(rest, "use") {
        let after = rest.get(found + 3..).unwrap_or("");
        let Some(end) = after.find(';') else { break };
        let tree = after.get(..end).unwrap_or("");
        let before = rest.get(..found).unwrap_or("").trim_end();
        let starts_item = before.is_empty()
            || before.ends_with([';', '{', '}', ']', ')'])
            || find_word(
                before.get(before.len().saturating_sub(3)..).unwrap_or(""),
                "pub",
            )
            .is_some();
        if starts_item && after.starts_with(char::is_whitespace) {
            trees.push(tree.split_whitespace().collect::<Vec<_>>().join(" "));
        }
        rest = after.get(end..).unwrap_or("");
    }
    trees
}

/// The offset of `word` in `text` as a whole word.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text.get(from..).and_then(|rest| rest.find(word)) {
        let at = from + found;
        let before = text.get(..at).and_then(|b| b.chars().next_back());
        let after = text.get(at + word.len()..).and_then(|a| a.chars().next());
        let is_ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if !is_ident(before) && !is_ident(after) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// Expands a use tree (`a::{b, c::d as e}`) into its paths, each with the
/// name it binds (`None` for `*`).
fn expand(tree: &str) -> Vec<(Vec<String>, Option<String>)> {
    let mut out = Vec::new();
    expand_into(&[], tree.trim(), &mut out);
    out
}

fn expand_into(prefix: &[String], tree: &str, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let tree = tree.trim().trim_start_matches("::");
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree
            .get(..open)
            .unwrap_or("")
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let inner = tree
            .get(open + 1..tree.rfind('}').unwrap_or(tree.len()))
            .unwrap_or("");
        let mut prefix = prefix.to_vec();
        prefix.extend(head);
        for part in split_top(inner) {
            expand_into(&prefix, part, out);
        }
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((path, alias)) => (path, Some(alias.trim().to_owned())),
        None => (tree, None),
    };
    let mut segments = prefix.to_vec();
    segments.extend(path.split("::").map(|s| s.trim().to_owned()));
    if segments.last().is_some_and(|s| s == "self") {
        segments.pop();
    }
    let bound = if segments.last().is_some_and(|s| s == "*") {
        None
    } else {
        alias.or_else(|| segments.last().cloned())
    };
    out.push((segments, bound));
}

/// The comma-separated parts of a list, ignoring commas inside braces.
fn split_top(list: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (at, c) in list.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(list.get(start..at).unwrap_or(""));
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(list.get(start..).unwrap_or(""));
    parts
}

/// A crate's modules and what each imports, to resolve paths with.
struct Crate {
    modules: Vec<Module>,
    /// Per module (by path), the names its `use` declarations bind and the
    /// paths they stand for.
    imports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
}

impl Crate {
    fn new(modules: Vec<Module>) -> Crate {
        let imports = modules
            .iter()
            .map(|module| {
                let bound = use_trees(&module.code)
                    .iter()
                    .flat_map(|tree| expand(tree))
                    .filter_map(|(path, name)| Some((name?, path)))
                    .collect();
                (module.path.clone(), bound)
            })
            .collect();
        Crate { modules, imports }
    }

    fn is_module(&self, path: &[String]) -> bool {
        self.modules.iter().any(|m| m.path == path)
    }

    /// The module a path written in `from` leads to, following
    /// re-exports; `None` for a path into another crate.
    fn resolve(&self, from: &[String], segments: &[String], depth: usize) -> Option<Vec<String>> {
        if depth > 16 {
            return None;
        }
        let (first, rest) = segments.split_first()?;
        let mut at: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => from.to_vec(),
            "super" => from.get(..from.len().checked_sub(1)?)?.to_vec(),
            _ => {
                let mut child = from.to_vec();
                child.push(first.clone());
                if self.is_module(&child) {
                    child
                } else {
                    let target = self.imports.get(from)?.get(first)?;
                    if target.len() == 1 && target.first() == Some(first) {
                        return None;
                    }
                    let mut path = target.clone();
                    path.extend(rest.iter().cloned());
                    return self.resolve(from, &path, depth + 1);
                }
            }
        };
        let mut rest = rest;
        while let Some((next, after)) = rest.split_first() {
            match next.as_str() {
                "super" => {
                    at.pop()?;
                }
                "self" | "*" => {}
                _ => {
                    let mut child = at.clone();
                    child.push(next.clone());
                    if self.is_module(&child) {
                        at = child;
                    } else if let Some(target) = self.imports.get(&at).and_then(|i| i.get(next)) {
                        let mut path = target.clone();
                        path.extend(after.iter().cloned());
                        return self.resolve(&at, &path, depth + 1);
                    } else {
                        break;
                    }
                }
            }
            rest = after;
        }
        Some(at)
    }

    /// The modules each module uses, other than itself.
    fn edges(&self) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
        let mut edges = BTreeMap::new();
        for module in &self.modules {
            let mut targets = BTreeSet::new();
            let mut paths: Vec<Vec<String>> = use_trees(&module.code)
                .iter()
                .flat_map(|tree| expand(tree))
                .map(|(path, _)| path)
                .collect();
            paths.extend(inline_paths(&module.code));
            for path in paths {
                if let Some(target) = self.resolve(&module.path, &path, 0)
                    && target != module.path
                {
                    targets.insert(target);
                }
            }
            edges.insert(module.path.clone(), targets);
        }
        edges
    }
}

/// Paths outside `use` declarations that start with `crate::`, `super::`
/// or `self::`.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(start) {
            let before = code.get(..at).and_then(|b| b.chars().next_back());
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$') {
                continue;
            }
            let path: String = code
                .get(at..)
                .unwrap_or("")
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            // `crate::{a, b}` is a use tree, read with the declarations.
            if path.ends_with("::") {
                continue;
            }
            paths.push(
                path.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            );
        }
    }
    paths
}

/// The cycles of a graph: its strongly connected components of more than
/// one node, each sorted.
fn cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    // Two nodes are in one component when each reaches the other.
    let reach = |from: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(node) = stack.pop() {
            for next in edges.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> =
        edges.keys().map(|node| (node, reach(node))).collect();
    let mut done = BTreeSet::new();
    let mut found = Vec::new();
    for (node, reached) in &reaches {
        if done.contains(*node) || !reached.contains(*node) {
            continue;
        }
        let component: Vec<Vec<String>> = reached
            .iter()
            .filter(|other| reaches.get(other).is_some_and(|r| r.contains(*node)))
            .cloned()
            .collect();
        done.extend(component.iter().cloned());
        found.push(component);
    }
    found
}

fn module_name(path: &[String]) -> String {
    if path.is_empty() {
        "crate".to_owned()
    } else {
        format!("crate::{}", path.join("::"))
    }
}

/// The crates under `crates/` and `python/` (the Python SDK's bindings):
/// package name and folder. A folder under `crates/` is named as its
/// package.
pub(super) fn crate_dirs() -> Vec<(String, std::path::PathBuf)> {
    let mut dirs: Vec<_> = ["crates", "python"]
        .into_iter()
        .flat_map(|parent| {
            std::fs::read_dir(repo_root().join(parent))
                .into_iter()
                .flatten()
                .map(|entry| entry.unwrap().path())
        })
        .filter(|path| path.join("Cargo.toml").is_file())
        .map(|path| {
            let manifest = std::fs::read_to_string(path.join("Cargo.toml")).unwrap();
            (package_name(&manifest).unwrap(), path)
        })
        .collect();
    dirs.sort();
    dirs
}

/// The `name` of a manifest's `[package]`.
fn package_name(manifest: &str) -> Option<String> {
    let package = manifest.split("[package]").nth(1)?;
    package
        .lines()
        .take_while(|line| !line.trim_start().starts_with('['))
        .find_map(|line| {
            let value = line
                .trim()
                .strip_prefix("name")?
                .trim_start()
                .strip_prefix('=')?;
            Some(value.trim().trim_matches('"').to_owned())
        })
}

/// Crates whose modules are still in circles, each with a reason. A crate
/// listed here that has none fails the test, so the list only shrinks.
const CIRCLES_LEFT: [(&str, &str); 0] = [];

#[test]
fn no_module_circles() {
    let mut found = Vec::new();
    let mut checked = 0;
    for (name, dir) in crate_dirs()
        .into_iter()
        .chain([("xtask".to_owned(), repo_root().join("xtask"))])
    {
        for root_file in ["lib.rs", "main.rs"] {
            if !dir.join("src").join(root_file).is_file() {
                continue;
            }
            let krate = Crate::new(modules_of(&dir.join("src"), root_file));
            checked += krate.modules.len();
            let circles = cycles(&krate.edges());
            if CIRCLES_LEFT.iter().any(|(left, _)| *left == name) {
                if circles.is_empty() {
                    found.push(format!(
                        "  {name} ({root_file}) has no circle left: take it off CIRCLES_LEFT"
                    ));
                }
                continue;
            }
            for cycle in circles {
                let files: Vec<String> = cycle
                    .iter()
                    .map(|path| {
                        let file = krate
                            .modules
                            .iter()
                            .find(|m| &m.path == path)
                            .map_or("", |m| m.file.as_str());
                        format!("{} ({file})", module_name(path))
                    })
                    .collect();
                let edges = krate.edges();
                let inside: Vec<String> = cycle
                    .iter()
                    .flat_map(|from| {
                        edges
                            .get(from)
                            .into_iter()
                            .flatten()
                            .filter(|to| cycle.contains(to))
                            .map(move |to| format!("{} -> {}", module_name(from), module_name(to)))
                    })
                    .collect();
                found.push(format!(
                    "  {name} ({root_file}): {}\n    uses: {}",
                    files.join(", "),
                    inside.join("; ")
                ));
            }
        }
    }
    assert!(checked > 20, "only {checked} modules found");
    assert!(
        found.is_empty(),
        "modules use each other in circles; {} circle(s):\n{}",
        found.len(),
        found.join("\n")
    );
}

/// dk-policy's admission contract and its rule language share no module:
/// no module of one uses a module of the other (the crate root, which
/// re-exports both, aside).
#[test]
fn admission_shares_nothing_with_the_rules() {
    let src = repo_root().join("crates/dk-policy/src");
    let krate = Crate::new(modules_of(&src, "lib.rs"));
    let is_admission = |path: &Vec<String>| path.first().is_some_and(|p| p == "admission");
    let mut found = Vec::new();
    for (from, targets) in krate.edges() {
        if from.is_empty() {
            continue;
        }
        for to in targets {
            if is_admission(&from) != is_admission(&to) {
                found.push(format!("{} -> {}", module_name(&from), module_name(&to)));
            }
        }
    }
    assert!(
        krate
            .modules
            .iter()
            .filter(|m| is_admission(&m.path))
            .count()
            >= 5,
        "the admission modules were not found"
    );
    assert!(
        found.is_empty(),
        "admission and the rule language use each other:\n  {}",
        found.join("\n  ")
    );
}

/// The names in a manifest's `[dependencies]` and `[build-dependencies]`.
pub(super) fn dependencies(manifest: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_section = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = matches!(line, "[dependencies]" | "[build-dependencies]");
            continue;
        }
        if !in_section || line.starts_with('#') {
            continue;
        }
        let name: String = line
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        if !name.is_empty() {
            names.insert(name);
        }
    }
    names
}

/// The dependency directions one crate breaks, given its dependencies.
fn direction_violations(name: &str, deps: &BTreeSet<String>) -> Vec<String> {
    let allowed_dk: &[&str] = match name {
        "dk-proto" => &[],
        "dk-policy" => &["dk-proto"],
        "dk-device" => &[
            "dk-proto",
            "dk-policy",
            "dk-channel",
            "dk-device-core",
            "dk-files",
        ],
        "dk-device-core" => &["dk-proto", "dk-channel"],
        "dk-channel" => &[],
        "dk-bridge-mqtt" => &["dk-proto", "dk-device", "dk-files"],
        "dk-fleet" => &["dk-channel", "dk-files"],
        "dk-files" => &[],
        "dk-testkit" => &[],
        "dk-device-python" => &["dk-device", "dk-proto"],
        _ => &["*"],
    };
    // MQTT stays in the bridge: vessel authors and device makers never get it.
    if deps.contains("rumqttc") && !matches!(name, "dk-bridge-mqtt" | "dk" | "dk-tests") {
        found_mqtt(name)
    } else {
        Vec::new()
    }
    .into_iter()
    // NATS stays in the fleet transport: the rest of dk sees its messages only.
    .chain(
        (deps.contains("async-nats") && name != "dk-fleet")
            .then(|| format!("{name} depends on async-nats (NATS belongs to dk-fleet)")),
    )
    // Python stays in the SDK's bindings: no other crate links libpython.
    .chain(
        (deps.contains("pyo3") && name != "dk-device-python")
            .then(|| format!("{name} depends on pyo3 (Python belongs to dk-device-python)")),
    )
    .chain(direction_violations_of(name, deps, allowed_dk))
    .collect()
}

fn found_mqtt(name: &str) -> Vec<String> {
    vec![format!(
        "{name} depends on rumqttc (MQTT belongs to dk-bridge-mqtt)"
    )]
}

/// The dependency directions one crate breaks, given what it may use.
fn direction_violations_of(
    name: &str,
    deps: &BTreeSet<String>,
    allowed_dk: &[&str],
) -> Vec<String> {
    let dk = |d: &&String| d.as_str() == "dk" || d.starts_with("dk-");
    let mut found = Vec::new();
    for dep in deps.iter().filter(dk) {
        let allowed = allowed_dk.contains(&"*") || allowed_dk.contains(&dep.as_str());
        if !allowed {
            found.push(format!("{name} depends on {dep}"));
        }
        if dep == "dk" && name != "dk-tests" {
            found.push(format!("{name} depends on the command line (dk)"));
        }
        if dep == "dk-testkit" {
            found.push(format!(
                "{name} depends on dk-testkit outside its dev-dependencies"
            ));
        }
    }
    if name == "dk-core" {
        for transport in [
            "axum",
            "hyper",
            "hyper-util",
            "rusqlite",
            "rmcp",
            "tokio-tungstenite",
        ] {
            if deps.contains(transport) {
                found.push(format!("dk-core depends on {transport}"));
            }
        }
    }
    found
}

/// Features that exist for tests only: dk-channel's fixed ephemeral keys,
/// dk-core's test support, dk-store's store double.
const TEST_ONLY_FEATURES: [(&str, &str); 3] = [
    ("dk-channel", "vectors"),
    ("dk-core", "testing"),
    ("dk-store", "testing"),
];

/// The lines of a manifest's `[dependencies]`, `[build-dependencies]`
/// and `[workspace.dependencies]` that turn on a feature of
/// [`TEST_ONLY_FEATURES`] (for tests and fuzzing only).
fn vectors_outside_dev(manifest: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_section = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = matches!(
                line,
                "[dependencies]" | "[build-dependencies]" | "[workspace.dependencies]"
            );
            continue;
        }
        let test_only = TEST_ONLY_FEATURES.iter().any(|(krate, feature)| {
            line.strip_prefix(krate)
                .is_some_and(|rest| rest.starts_with([' ', '=', '.']))
                && line.contains(&format!("\"{feature}\""))
        });
        if in_section && test_only {
            found.push(line.to_owned());
        }
    }
    found
}

#[test]
fn crate_dependencies_flow_one_way() {
    let mut found = Vec::new();
    let crates = crate_dirs();
    assert!(crates.len() >= 5, "only {} crates found", crates.len());
    for (name, dir) in crates
        .iter()
        .cloned()
        .chain([("the workspace".to_owned(), repo_root())])
    {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        found.extend(
            vectors_outside_dev(&manifest)
                .into_iter()
                .map(|line| format!("{name} turns on a test-only feature: `{line}`")),
        );
    }
    for (name, dir) in crates {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        found.extend(direction_violations(&name, &dependencies(&manifest)));
    }
    assert!(
        found.is_empty(),
        "crate dependencies go the wrong way:\n  {}",
        found.join("\n  ")
    );
}

/// The crates whose public signatures may name only their own types, std's,
/// serde's and the dk crates' (and, for the vessel's core, tokio's channels
/// and futures'), with the dependencies that must stay private.
const PURE_CRATES: [(&str, &[&str]); 7] = [
    ("dk-files", &["rustix", "data_encoding", "rand"]),
    ("dk-proto", &["sha2", "unicode_general_category"]),
    (
        "dk-channel",
        &[
            "snow",
            "sha2",
            "ring",
            "chacha20poly1305",
            "curve25519_dalek",
            "subtle",
            "data_encoding",
            "zeroize",
        ],
    ),
    ("dk-policy", &["nom", "yaml_serde", "jiff"]),
    ("dk-store", &["rusqlite", "sha2", "rustix", "rand"]),
    (
        "dk-fleet",
        &["async_nats", "chacha20poly1305", "ring", "rand", "bytes"],
    ),
    (
        "dk-core",
        &[
            "sha2",
            "subtle",
            "rand",
            "uuid",
            "toml",
            "rustix",
            "serde_path_to_error",
        ],
    ),
];

/// The public signatures of a text: `pub fn` signatures, `pub` fields,
/// `pub type`/`const`/`static` items, `pub enum` bodies, tuple structs,
/// the heads of structs with named fields, and `impl` headers, each with
/// its line.
fn public_signatures(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut offset = 0;
    for line in code.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let rest = code.get(offset..).unwrap_or("");
        let lead = line.len() - trimmed.len();
        let item = rest.get(lead..).unwrap_or("");
        let sig = if trimmed.starts_with("pub fn ")
            || trimmed.starts_with("pub async fn ")
            || trimmed.starts_with("pub const fn ")
            || (trimmed.starts_with("impl") && !implements_for_private_type(code, item))
        {
            Some(up_to_body(item))
        } else if trimmed.starts_with("pub struct ")
            && item
                .find(['{', '(', ';'])
                .is_some_and(|at| item.get(at..).is_some_and(|r| r.starts_with('{')))
        {
            // A struct with named fields: its name and generics; its `pub`
            // fields are signatures of their own, its private ones are not.
            Some(up_to_body(item))
        } else if trimmed.starts_with("pub enum ") || trimmed.starts_with("pub struct ") {
            Some(braced(item))
        } else if trimmed.starts_with("pub type ")
            || trimmed.starts_with("pub const ")
            || trimmed.starts_with("pub static ")
            || (trimmed.starts_with("pub ") && is_field(trimmed))
        {
            Some(item.split([';', '\n']).next().unwrap_or(""))
        } else {
            None
        };
        if let Some(sig) = sig {
            let sig: String = sig
                .lines()
                .filter(|l| !l.trim_start().starts_with("#["))
                .collect::<Vec<_>>()
                .join(" ");
            found.push((line_of(code, offset), sig));
        }
        offset += line.len();
    }
    found
}

/// Whether an `impl` header implements a trait for a type the same file
/// declares without `pub` (private or `pub(crate)`): nothing outside the
/// crate reaches that impl, as nothing reaches a `pub(crate)` item.
fn implements_for_private_type(code: &str, item: &str) -> bool {
    let Some((_, self_type)) = up_to_body(item).split_once(" for ") else {
        return false;
    };
    let name: String = self_type
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    !name.is_empty()
        && code.lines().any(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("pub(crate) ").unwrap_or(line);
            ["struct ", "enum "].iter().any(|kind| {
                line.strip_prefix(kind)
                    .is_some_and(|rest| find_word(rest, &name) == Some(0))
            })
        })
}

/// `pub name: Type` (a named field).
fn is_field(line: &str) -> bool {
    let after = line.trim_start_matches("pub ");
    let name: String = after
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    !name.is_empty() && after.get(name.len()..).is_some_and(|r| r.starts_with(':'))
}

/// An item's text up to its body or `;`.
fn up_to_body(item: &str) -> &str {
    let end = item.find(['{', ';']).unwrap_or(item.len());
    item.get(..end).unwrap_or(item)
}

/// An item's text up to the brace closing its body (or its `;`).
fn braced(item: &str) -> &str {
    let mut depth = 0usize;
    for (at, c) in item.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return item.get(..=at).unwrap_or(item);
                }
            }
            ';' if depth == 0 => return item.get(..at).unwrap_or(item),
            _ => {}
        }
    }
    item
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).map_or(0, |b| b.matches('\n').count()) + 1
}

/// What a signature names from the private crates: `crate::` paths and
/// names imported from them.
fn foreign_in(sig: &str, private: &[&str], imported: &BTreeSet<String>) -> Vec<String> {
    let mut found: Vec<String> = private
        .iter()
        .map(|krate| format!("{krate}::"))
        .filter(|prefix| {
            sig.match_indices(prefix.as_str()).any(|(at, _)| {
                !sig.get(..at)
                    .and_then(|b| b.chars().next_back())
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            })
        })
        .collect();
    found.extend(
        imported
            .iter()
            .filter(|name| find_word(sig, name).is_some())
            .cloned(),
    );
    found
}

#[test]
fn no_foreign_type_in_public_signatures() {
    let mut found = Vec::new();
    let mut signatures = 0;
    for (name, private) in PURE_CRATES {
        let src = repo_root().join("crates").join(name).join("src");
        for module in modules_of(&src, "lib.rs") {
            let imported: BTreeSet<String> = use_trees(&module.code)
                .iter()
                .flat_map(|tree| expand(tree))
                .filter(|(path, _)| path.first().is_some_and(|p| private.contains(&p.as_str())))
                .filter_map(|(_, name)| name)
                .filter(|name| name.starts_with(char::is_uppercase))
                .collect();
            for (line, sig) in public_signatures(&module.code) {
                signatures += 1;
                for foreign in foreign_in(&sig, private, &imported) {
                    found.push(format!(
                        "  {} line {line}: `{foreign}` in `{}`",
                        module.file,
                        sig.split_whitespace().collect::<Vec<_>>().join(" ")
                    ));
                }
            }
        }
    }
    assert!(signatures > 100, "only {signatures} signatures found");
    assert!(
        found.is_empty(),
        "foreign types in public signatures:\n{}",
        found.join("\n")
    );
}

/// The scanners, on small texts.
#[test]
fn layering_scanners() {
    assert_eq!(
        expand("crate::{a::{self, B}, c::D as E, f::*}"),
        vec![
            (vec!["crate".into(), "a".into()], Some("a".into())),
            (
                vec!["crate".into(), "a".into(), "B".into()],
                Some("B".into())
            ),
            (
                vec!["crate".into(), "c".into(), "D".into()],
                Some("E".into())
            ),
            (vec!["crate".into(), "f".into(), "*".into()], None),
        ]
    );
    assert_eq!(
        use_trees("//! use crate::x;\npub(crate) use super::y;\nfn f() { let used = 1; }\n"),
        vec!["super::y".to_owned()]
    );
    assert_eq!(
        strip_comments("a // crate::b\n\"crate::c\" '\"' '\\'' d<'a> r#\"x\"y\"#"),
        "a \n\"\" '' '' d<'a> r#\"\"#"
    );

    let module = |path: &[&str], code: &str| Module {
        file: String::new(),
        path: path.iter().map(|s| (*s).to_owned()).collect(),
        code: code.to_owned(),
    };
    // A re-export at the root is followed to where the item lives.
    let krate = Crate::new(vec![
        module(&[], "mod a; mod b; pub use a::A; pub use b::B;"),
        module(&["a"], "use crate::B;"),
        module(&["b"], "pub struct B; fn f() -> crate::a::A { todo() }"),
    ]);
    let edges = krate.edges();
    let a = vec!["a".to_owned()];
    let b = vec!["b".to_owned()];
    assert_eq!(edges.get(&a), Some(&BTreeSet::from([b.clone()])));
    assert_eq!(edges.get(&b), Some(&BTreeSet::from([a.clone()])));
    assert_eq!(cycles(&edges), vec![vec![a, b]]);

    let none = BTreeSet::new();
    assert_eq!(
        direction_violations("dk-policy", &BTreeSet::from(["dk-proto".into()])),
        Vec::<String>::new()
    );
    assert_eq!(
        direction_violations("dk-proto", &BTreeSet::from(["dk-policy".into()])),
        vec!["dk-proto depends on dk-policy".to_owned()]
    );
    assert_eq!(
        direction_violations("dk-core", &BTreeSet::from(["rusqlite".into()])),
        vec!["dk-core depends on rusqlite".to_owned()]
    );
    assert_eq!(
        dependencies("[dependencies]\nserde.workspace = true\n[dev-dependencies]\nx = \"1\"\n"),
        BTreeSet::from(["serde".to_owned()])
    );
    let with_vectors = "dk-channel = { workspace = true, features = [\"vectors\"] }";
    assert_eq!(
        vectors_outside_dev(&format!(
            "[dependencies]\n{with_vectors}\n[dev-dependencies]\n{with_vectors}\n"
        )),
        vec![with_vectors.to_owned()]
    );
    assert_eq!(
        direction_violations("dk-channel", &BTreeSet::from(["dk-proto".into()])),
        vec!["dk-channel depends on dk-proto".to_owned()]
    );
    let testing = "dk-core = { workspace = true, features = [\"testing\"] }";
    assert_eq!(
        vectors_outside_dev(&format!(
            "[dependencies]\n{testing}\n[dev-dependencies]\n{testing}\n"
        )),
        vec![testing.to_owned()]
    );
    assert_eq!(
        direction_violations("dk-http", &BTreeSet::from(["dk-testkit".into()])),
        vec!["dk-http depends on dk-testkit outside its dev-dependencies".to_owned()]
    );
    assert_eq!(
        direction_violations("dk-testkit", &BTreeSet::from(["dk-proto".into()])),
        vec!["dk-testkit depends on dk-proto".to_owned()]
    );
    assert_eq!(
        direction_violations("dk-core", &BTreeSet::from(["async-nats".into()])),
        vec!["dk-core depends on async-nats (NATS belongs to dk-fleet)".to_owned()]
    );
    assert_eq!(
        direction_violations("dk-fleet", &BTreeSet::from(["dk-core".into()])),
        vec!["dk-fleet depends on dk-core".to_owned()]
    );

    let sigs = public_signatures(
        "pub fn f(x: jiff::Zoned) -> T {\n}\npub(crate) fn g(n: nom::X) {}\npub struct S {\n    pub z: Zone,\n    private: Zone,\n}\n",
    );
    // f, the head of S, and its pub field: not g, not the private field.
    assert_eq!(sigs.len(), 3, "{sigs:?}");
    assert!(foreign_in(&sigs[1].1, &["jiff"], &BTreeSet::from(["Zone".to_owned()])).is_empty());
    let imported = BTreeSet::from(["Zone".to_owned()]);
    assert_eq!(
        foreign_in(&sigs[0].1, &["jiff"], &none),
        vec!["jiff::".to_owned()]
    );
    assert_eq!(
        foreign_in(&sigs[2].1, &["jiff"], &imported),
        vec!["Zone".to_owned()]
    );
}

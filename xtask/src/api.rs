//! `cargo xtask api [--bless]`: the public surface of every library crate
//! under `crates/`, kept in `api/<crate>.txt` so a change to it shows as a
//! diff in review.
//!
//! The crates come from `cargo metadata` (every package under `crates/`
//! with a library target, `lib` or `rlib`), so a crate added or renamed is picked up without
//! editing this file. Each one's surface is what rustdoc lists in
//! `target/doc/<crate>/all.html` after `cargo doc --no-deps`: every public
//! item (structs, enums, traits, functions, constants, macros, type aliases,
//! modules' items) as `kind path`, one a line, sorted. Methods, fields and
//! signatures are not in that list and not in the snapshot; items hidden
//! with `#[doc(hidden)]` are left out, as rustdoc leaves them out.
//!
//! `all.html` does not list a re-export rustdoc shows as one rather than
//! inlining it (`pub use vessel::Vessel` at a crate's root when `vessel` is
//! public, `pub use dk_http as http`), so the module pages reachable from the
//! crate's root are read for their "Re-exports" sections too, each line
//! `reexport crate::path::Name = what it names`.
//!
//! Without `--bless` the task fails, printing the lines that differ, when a
//! snapshot is missing, stale or different; with it the snapshots are
//! rewritten (and those of crates that are gone removed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::run::{cargo, repo_root, status};
use crate::{TaskError, TaskResult};

/// Where the snapshots live, from the repository root.
const API_DIR: &str = "api";

/// A library crate of the workspace: its package name and the name of its
/// library target (the folder rustdoc writes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Library {
    package: String,
    target: String,
}

/// `cargo xtask api [--bless]`.
pub fn run(args: &[String]) -> TaskResult {
    let bless = match args {
        [] => false,
        [flag] if flag == "--bless" => true,
        [other, ..] => {
            return Err(TaskError(format!(
                "`api` takes only `--bless`, got `{other}`"
            )));
        }
    };
    check(bless)
}

/// Builds the docs of the library crates and compares (or, with `bless`,
/// rewrites) their snapshots.
pub fn check(bless: bool) -> TaskResult {
    let (libraries, target_dir) = libraries()?;
    if libraries.is_empty() {
        return Err(TaskError(
            "cargo metadata lists no library crate under crates/".into(),
        ));
    }
    let mut doc = cargo();
    doc.args(["doc", "--no-deps", "--locked"]);
    // Surfaces behind a feature are public too: the PostgreSQL store, and
    // the voice tests' sound in dk-testkit.
    doc.args(["--features", "dk-store/postgres,dk-testkit/audio"]);
    for library in &libraries {
        doc.args(["-p", &library.package]);
    }
    status("api docs", &mut doc)?;

    let dir = repo_root().join(API_DIR);
    let mut problems = Vec::new();
    let mut expected_files = Vec::new();
    for library in &libraries {
        let all = target_dir
            .join("doc")
            .join(&library.target)
            .join("all.html");
        let html = std::fs::read_to_string(&all)
            .map_err(|e| TaskError(format!("cannot read `{}`: {e}", all.display())))?;
        let mut items = surface(&library.target, &html);
        items.extend(reexports(&target_dir.join("doc"), &library.target)?);
        items.sort();
        if items.is_empty() {
            return Err(TaskError(format!(
                "no public item found in `{}`: has rustdoc's page changed?",
                all.display()
            )));
        }
        let text = items.join("\n") + "\n";
        let file = dir.join(format!("{}.txt", library.package));
        expected_files.push(file.clone());
        let old = std::fs::read_to_string(&file).ok();
        if old.as_deref() == Some(text.as_str()) {
            continue;
        }
        if bless {
            std::fs::create_dir_all(&dir)
                .map_err(|e| TaskError(format!("cannot make `{}`: {e}", dir.display())))?;
            std::fs::write(&file, &text)
                .map_err(|e| TaskError(format!("cannot write `{}`: {e}", file.display())))?;
            println!("api: wrote {}", shown(&file));
        } else {
            problems.push(match old {
                None => format!("{} is missing", shown(&file)),
                Some(old) => format!("{} changed:\n{}", shown(&file), diff(&old, &text)),
            });
        }
    }
    for stale in snapshot_files(&dir)? {
        if expected_files.contains(&stale) {
            continue;
        }
        if bless {
            std::fs::remove_file(&stale)
                .map_err(|e| TaskError(format!("cannot remove `{}`: {e}", stale.display())))?;
            println!("api: removed {}", shown(&stale));
        } else {
            problems.push(format!("{} names no library crate", shown(&stale)));
        }
    }
    if problems.is_empty() {
        println!("\n==> api: {} snapshots match", libraries.len());
        Ok(())
    } else {
        Err(TaskError(format!(
            "the public API differs from the snapshots (run `cargo xtask api --bless` if the change is meant):\n{}",
            problems.join("\n")
        )))
    }
}

/// A snapshot file's path from the repository root.
fn shown(file: &Path) -> String {
    file.strip_prefix(repo_root())
        .unwrap_or(file)
        .display()
        .to_string()
}

/// The `.txt` files in the snapshot folder.
fn snapshot_files(dir: &Path) -> Result<Vec<PathBuf>, TaskError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TaskError(format!("cannot read `{}`: {e}", dir.display()))),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    Ok(files)
}

/// The library crates under `crates/`, from `cargo metadata`, and the
/// target directory.
fn libraries() -> Result<(Vec<Library>, PathBuf), TaskError> {
    let output = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1", "--locked"])
        .output()
        .map_err(|e| TaskError(format!("cannot run cargo metadata: {e}")))?;
    if !output.status.success() {
        return Err(TaskError(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(|e| {
        TaskError(format!(
            "cargo metadata printed something that is not JSON: {e}"
        ))
    })?;
    let crates_dir = repo_root().join("crates");
    Ok((
        libraries_in(&metadata, &crates_dir),
        metadata
            .get("target_directory")
            .and_then(serde_json::Value::as_str)
            .map_or_else(|| repo_root().join("target"), PathBuf::from),
    ))
}

/// The packages of `cargo metadata` output whose manifest is under
/// `crates_dir` and that have a library target, sorted by package name.
fn libraries_in(metadata: &serde_json::Value, crates_dir: &Path) -> Vec<Library> {
    let packages = metadata
        .get("packages")
        .and_then(serde_json::Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let mut found: Vec<Library> = packages
        .iter()
        .filter(|package| {
            package
                .get("manifest_path")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|path| Path::new(path).starts_with(crates_dir))
        })
        .filter_map(|package| {
            let name = package.get("name")?.as_str()?;
            let target = package.get("targets")?.as_array()?.iter().find(|target| {
                target
                    .get("kind")
                    .and_then(serde_json::Value::as_array)
                    // `rlib`: a library that names its crate type (dk-device-c).
                    .is_some_and(|kinds| kinds.iter().any(|k| k == "lib" || k == "rlib"))
            })?;
            Some(Library {
                package: name.to_owned(),
                target: target.get("name")?.as_str()?.to_owned(),
            })
        })
        .collect();
    found.sort_by(|a, b| a.package.cmp(&b.package));
    found
}

/// The items rustdoc's `all.html` lists, as `kind crate::path`, sorted.
/// Each item is a link `href="dir/kind.Name.html"` in a list of class
/// `all-items`.
fn surface(crate_name: &str, html: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find("<ul class=\"all-items\">") {
        let list = rest.get(start..).unwrap_or("");
        let end = list.find("</ul>").unwrap_or(list.len());
        let (inside, after) = list.split_at(end);
        for link in inside.split("href=\"").skip(1) {
            let Some(href) = link.split('"').next() else {
                continue;
            };
            if let Some(item) = item_of(crate_name, href) {
                items.push(item);
            }
        }
        rest = after;
    }
    items.sort();
    items.dedup();
    items
}

/// The re-exports the module pages of `crate_name` show, from its root
/// page down through the links to its own modules (a page left over from an
/// older build is never reached), as `reexport crate::module::Name = target`.
fn reexports(doc_dir: &Path, crate_name: &str) -> Result<Vec<String>, TaskError> {
    let mut lines = Vec::new();
    let mut pending = vec![Vec::<String>::new()];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(modules) = pending.pop() {
        if !seen.insert(modules.clone()) {
            continue;
        }
        let mut page = doc_dir.join(crate_name);
        page.extend(&modules);
        page.push("index.html");
        let html = std::fs::read_to_string(&page)
            .map_err(|e| TaskError(format!("cannot read `{}`: {e}", page.display())))?;
        let mut path = vec![crate_name.to_owned()];
        path.extend(modules.iter().cloned());
        lines.extend(reexports_on_page(&path.join("::"), modules.len(), &html));
        for child in child_modules(&html) {
            let mut next = modules.clone();
            next.push(child);
            pending.push(next);
        }
    }
    Ok(lines)
}

/// The modules a module page links to that live under it: `href="name/index.html"`.
fn child_modules(html: &str) -> Vec<String> {
    html.split("<a class=\"mod\" href=\"")
        .skip(1)
        .filter_map(|link| link.split('"').next())
        .filter_map(|href| href.strip_suffix("/index.html"))
        .filter(|name| !name.is_empty() && !name.contains('/') && !name.starts_with('.'))
        .map(str::to_owned)
        .collect()
}

/// The entries of a module page's "Re-exports" list, named under `module`.
/// An entry names what it re-exports by its link's title (`struct
/// dk_core::vessel::Vessel`) when the link stays within the crate, else by
/// its path as written (a link to another crate comes and goes with the
/// order rustdoc documents them in).
fn reexports_on_page(module: &str, depth: usize, html: &str) -> Vec<String> {
    let Some(start) = html.find("<dl class=\"item-table reexports\">") else {
        return Vec::new();
    };
    let list = html.get(start..).unwrap_or("");
    let list = list
        .get(..list.find("</dl>").unwrap_or(list.len()))
        .unwrap_or("");
    let mut lines = Vec::new();
    for entry in list.split("<dt").skip(1) {
        let entry = entry.split_once('>').map_or("", |(_, rest)| rest);
        let code = entry.split("</dt>").next().unwrap_or("");
        let text = without_tags(code);
        let used = text
            .trim()
            .trim_start_matches("pub use ")
            .trim_end_matches(';')
            .trim();
        let (path, name) = match used.split_once(" as ") {
            Some((path, name)) => (path, name),
            None => (used, used.rsplit("::").next().unwrap_or(used)),
        };
        // A link into another crate's pages exists only when rustdoc wrote
        // that crate's pages first, so only a link within the crate is read:
        // one climbing no higher than the page's depth below the crate.
        let within_crate = code
            .split("href=\"")
            .nth(1)
            .is_some_and(|href| !href.starts_with("http") && href.matches("../").count() <= depth);
        let target = code
            .split("title=\"")
            .nth(1)
            .and_then(|title| title.split('"').next())
            .filter(|title| within_crate && !title.is_empty())
            .unwrap_or(path);
        lines.push(format!("reexport {module}::{name} = {target}"));
    }
    lines
}

/// `html` with its tags taken out.
fn without_tags(html: &str) -> String {
    let mut text = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text
}

/// `limits/constant.MAX.html` -> `constant dk_proto::limits::MAX`.
fn item_of(crate_name: &str, href: &str) -> Option<String> {
    let page = href.strip_suffix(".html")?;
    let (dirs, file) = match page.rsplit_once('/') {
        Some((dirs, file)) => (Some(dirs), file),
        None => (None, page),
    };
    let (kind, name) = file.split_once('.')?;
    let mut path = vec![crate_name];
    path.extend(dirs.into_iter().flat_map(|d| d.split('/')));
    path.push(name);
    Some(format!("{kind} {}", path.join("::")))
}

/// The lines only in `old` (`-`) and only in `new` (`+`); both are sorted
/// lists of items, so this is the whole change.
fn diff(old: &str, new: &str) -> String {
    let mut count: BTreeMap<&str, i32> = BTreeMap::new();
    for line in old.lines() {
        *count.entry(line).or_default() -= 1;
    }
    for line in new.lines() {
        *count.entry(line).or_default() += 1;
    }
    count
        .into_iter()
        .filter(|(_, n)| *n != 0)
        .map(|(line, n)| format!("  {}{line}", if n > 0 { '+' } else { '-' }))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_from_rustdoc_links() {
        let cases = [
            ("struct.Manifest.html", Some("struct dk_proto::Manifest")),
            (
                "limits/constant.MAX.html",
                Some("constant dk_proto::limits::MAX"),
            ),
            ("a/b/fn.f.html", Some("fn dk_proto::a::b::f")),
            ("index.html", None),
            ("#structs", None),
        ];
        for (href, expected) in cases {
            assert_eq!(item_of("dk_proto", href).as_deref(), expected, "{href}");
        }
    }

    #[test]
    fn the_surface_is_the_all_items_lists() {
        let html = concat!(
            "<nav><a href=\"index.html\">x</a></nav>",
            "<h3 id=\"structs\">Structs</h3><ul class=\"all-items\">",
            "<li><a href=\"struct.B.html\">B</a></li><li><a href=\"struct.A.html\">A</a></li></ul>",
            "<h3 id=\"functions\">Functions</h3><ul class=\"all-items\">",
            "<li><a href=\"m/fn.f.html\">m::f</a></li></ul>",
        );
        assert_eq!(
            surface("k", html),
            ["fn k::m::f", "struct k::A", "struct k::B"]
        );
    }

    #[test]
    fn reexports_are_read_from_a_module_page() {
        let html = concat!(
            "<h2 id=\"reexports\">Re-exports</h2><dl class=\"item-table reexports\">",
            "<dt id=\"reexport.Vessel\"><code>pub use vessel::<a class=\"struct\" ",
            "href=\"vessel/struct.Vessel.html\" title=\"struct k::vessel::Vessel\">Vessel</a>;</code></dt>",
            "<dt id=\"reexport.mcp\"><code>pub use dk_mcp as mcp;</code></dt>",
            "<dt id=\"reexport.http\"><code>pub use <a class=\"mod\" href=\"../dk_http/index.html\" ",
            "title=\"mod dk_http\">dk_http</a> as http;</code></dt></dl>",
            "<h2 id=\"modules\">Modules</h2><dl class=\"item-table\"><dt>",
            "<a class=\"mod\" href=\"vessel/index.html\" title=\"mod k::vessel\">vessel</a></dt></dl>",
        );
        assert_eq!(
            reexports_on_page("k", 0, html),
            [
                "reexport k::Vessel = struct k::vessel::Vessel",
                "reexport k::mcp = dk_mcp",
                "reexport k::http = dk_http",
            ]
        );
        assert_eq!(child_modules(html), ["vessel"]);
        assert!(reexports_on_page("k", 0, "<p>no list</p>").is_empty());
        let nested = concat!(
            "<dl class=\"item-table reexports\"><dt id=\"reexport.L\"><code>pub use crate::limits::",
            "<a class=\"struct\" href=\"../limits/struct.L.html\" title=\"struct k::limits::L\">L</a>;",
            "</code></dt></dl>",
        );
        assert_eq!(
            reexports_on_page("k::vessel", 1, nested),
            ["reexport k::vessel::L = struct k::limits::L"]
        );
    }

    #[test]
    fn libraries_come_from_metadata() {
        let metadata = serde_json::json!({"packages": [
            {"name": "dk", "manifest_path": "/r/crates/dk/Cargo.toml",
             "targets": [{"kind": ["bin"], "name": "dk"}]},
            {"name": "dk-proto", "manifest_path": "/r/crates/dk-proto/Cargo.toml",
             "targets": [{"kind": ["lib"], "name": "dk_proto"}, {"kind": ["bench"], "name": "proto"}]},
            {"name": "dk-tests", "manifest_path": "/r/tests/Cargo.toml",
             "targets": [{"kind": ["lib"], "name": "dk_tests"}]},
            {"name": "dk-core", "manifest_path": "/r/crates/dk-core/Cargo.toml",
             "targets": [{"kind": ["lib"], "name": "dk_core"}]},
        ]});
        let found = libraries_in(&metadata, Path::new("/r/crates"));
        let names: Vec<(&str, &str)> = found
            .iter()
            .map(|l| (l.package.as_str(), l.target.as_str()))
            .collect();
        assert_eq!(names, [("dk-core", "dk_core"), ("dk-proto", "dk_proto")]);
    }

    #[test]
    fn diffs_list_what_went_and_came() {
        assert_eq!(diff("a\nb\n", "a\nb\n"), "");
        assert_eq!(diff("a\nb\n", "a\nc\n"), "  -b\n  +c");
    }
}

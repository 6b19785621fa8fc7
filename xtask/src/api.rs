//! `cargo xtask api [--bless]`: the public surface of every library crate
//! under `crates/`, signatures included, kept in `api/<crate>.txt` so a
//! change to it shows as a diff in review.
//!
//! The crates come from `cargo metadata` (every package under `crates/`
//! with a library target, `lib` or `rlib`), so a crate added or renamed is
//! picked up without editing this file. Each one's surface is read from
//! rustdoc's JSON output (`target/doc/<crate>.json`) and rendered by the
//! `public-api` crate: one line a public item with its full signature, the
//! way it is written in Rust (`pub fn dk_core::config::load(&std::path::Path)
//! -> core::result::Result<...>`): functions and methods with their parameter
//! and return types, structs with their public fields, enums with their
//! variants, traits with their methods, constants with their types, trait
//! impls (derived ones too), re-exported items at the path they are reached
//! by. Parameter names are left out (renaming one changes no caller), and so
//! are blanket impls (`impl<T> From<T> for T`) and auto trait impls (`Send`,
//! `Sync`), which follow from the rest; items hidden with `#[doc(hidden)]`
//! are left out, as rustdoc leaves them out. The lines are in `public-api`'s
//! order, which sorts by path and keeps an item's members under it; the same
//! source gives the same file on every run.
//!
//! rustdoc's JSON is unstable on stable Rust, so rustdoc alone runs with
//! `RUSTC_BOOTSTRAP=1`: cargo is handed this program as its rustdoc
//! (`RUSTDOC`), and [`rustdoc_wrapper`] runs the real one with that variable.
//! Set on the whole cargo run instead, it would change the fingerprint of the
//! build scripts that read it (proc-macro2's, thiserror's) and rebuild every
//! dependency, there and in the next ordinary build. The JSON's format
//! version is checked against [`FORMAT_VERSION`], the one `public-api`
//! reads, so a new toolchain fails with a sentence rather than a parse error.
//!
//! On a 2-core machine whose dependencies are built, a run takes under a
//! minute (49 and 52 s, measured with other builds running), nearly all of
//! it rustdoc (42 s): cargo documents the 18 crates again on every run, as
//! it judges a crate's docs fresh by their HTML pages, which the JSON output
//! does not write. Reading, rendering and comparing take 7 s.
//!
//! Without `--bless` the task fails, printing the lines that differ, when a
//! snapshot is missing, stale or different; with it the snapshots are
//! rewritten (and those of crates that are gone removed).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::run::{cargo, repo_root, status};
use crate::{TaskError, TaskResult};

/// Where the snapshots live, from the repository root.
const API_DIR: &str = "api";

/// The rustdoc JSON format version this task reads: the one Rust 1.95's
/// rustdoc writes and `public-api` 0.52.1 (through `rustdoc-types` 0.57)
/// parses. A toolchain that writes another needs the `public-api` release
/// made for it.
const FORMAT_VERSION: u32 = 57;

/// Set by this task on its cargo run to the real rustdoc: when it is in the
/// environment, this program is being run by cargo as rustdoc.
const REAL_RUSTDOC: &str = "DK_XTASK_REAL_RUSTDOC";

/// The features whose surface is public too: the PostgreSQL store, the voice
/// tests' sound in dk-testkit, and dk-vessel's fleet member.
const FEATURES: &str = "dk-store/postgres,dk-testkit/audio,dk-vessel/fleet";

/// rustdoc's flags for its JSON output.
const JSON_FLAGS: &str = "-Z unstable-options --output-format json";

/// A library crate of the workspace: its package name and the name of its
/// library target (the file rustdoc writes).
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

/// When cargo runs this program as its rustdoc (see the module's doc), runs
/// the real rustdoc with `RUSTC_BOOTSTRAP=1` and the same arguments and
/// returns how it ended; `None` otherwise.
pub fn rustdoc_wrapper() -> Option<ExitCode> {
    let real = std::env::var_os(REAL_RUSTDOC)?;
    let outcome = Command::new(&real)
        .args(std::env::args_os().skip(1))
        .env("RUSTC_BOOTSTRAP", "1")
        .env_remove(REAL_RUSTDOC)
        .status();
    Some(match outcome {
        Ok(status) => ExitCode::from(
            status
                .code()
                .and_then(|code| u8::try_from(code).ok())
                .unwrap_or(1),
        ),
        Err(error) => {
            eprintln!(
                "xtask: cannot run rustdoc `{}`: {error}",
                Path::new(&real).display()
            );
            ExitCode::FAILURE
        }
    })
}

/// Writes the rustdoc JSON of the library crates and compares (or, with
/// `bless`, rewrites) their snapshots.
pub fn check(bless: bool) -> TaskResult {
    let (libraries, target_dir) = libraries()?;
    if libraries.is_empty() {
        return Err(TaskError(
            "cargo metadata lists no library crate under crates/".into(),
        ));
    }
    let this = std::env::current_exe()
        .map_err(|e| TaskError(format!("cannot find this program to run as rustdoc: {e}")))?;
    let real = std::env::var_os("RUSTDOC").unwrap_or_else(|| OsString::from("rustdoc"));
    let mut doc = json_docs(libraries.iter().map(|l| l.package.as_str()));
    doc.args(["--locked", "--features", FEATURES])
        .env("RUSTDOC", this)
        .env(REAL_RUSTDOC, real);
    status("api docs (rustdoc JSON)", &mut doc)?;

    let dir = repo_root().join(API_DIR);
    let mut problems = Vec::new();
    let mut expected_files = Vec::new();
    for library in &libraries {
        let json = target_dir
            .join("doc")
            .join(format!("{}.json", library.target));
        let text = surface(&json)?;
        let file = dir.join(format!("{}.txt", library.package));
        expected_files.push(file.clone());
        let old = std::fs::read_to_string(&file).ok();
        let Some(problem) = difference(old.as_deref(), &text) else {
            continue;
        };
        if bless {
            std::fs::create_dir_all(&dir)
                .map_err(|e| TaskError(format!("cannot make `{}`: {e}", dir.display())))?;
            std::fs::write(&file, &text)
                .map_err(|e| TaskError(format!("cannot write `{}`: {e}", file.display())))?;
            println!("api: wrote {}", shown(&file));
        } else {
            problems.push(format!("{} {problem}", shown(&file)));
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

/// `cargo doc --no-deps` of `packages` writing rustdoc's JSON rather than
/// its pages (`target/doc/<crate>.json`); the caller makes rustdoc accept
/// the unstable flag.
fn json_docs<'a>(packages: impl IntoIterator<Item = &'a str>) -> Command {
    let mut doc = cargo();
    doc.args(["doc", "--no-deps"])
        .env("RUSTDOCFLAGS", JSON_FLAGS)
        .env_remove("CARGO_ENCODED_RUSTDOCFLAGS");
    for package in packages {
        doc.args(["-p", package]);
    }
    doc
}

/// The snapshot text of the crate whose rustdoc JSON is `json`: one line a
/// public item with its signature, in `public-api`'s order.
fn surface(json: &Path) -> Result<String, TaskError> {
    let text = std::fs::read_to_string(json)
        .map_err(|e| TaskError(format!("cannot read `{}`: {e}", json.display())))?;
    match format_version(&text) {
        Some(FORMAT_VERSION) => {}
        found => {
            return Err(TaskError(format!(
                "`{}` is rustdoc JSON format {}, and this task reads format {FORMAT_VERSION} (Rust 1.95's): use the public-api release made for that format",
                json.display(),
                found.map_or_else(|| "unknown".to_owned(), |v| v.to_string()),
            )));
        }
    }
    let targets = reexport_targets(&text)
        .map_err(|e| TaskError(format!("cannot read `{}`: {e}", json.display())))?;
    drop(text);
    let api = public_api::Builder::from_rustdoc_json(json)
        .omit_blanket_impls(true)
        .omit_auto_trait_impls(true)
        .build()
        .map_err(|e| TaskError(format!("cannot read `{}`: {e}", json.display())))?;
    let lines: Vec<String> = api
        .items()
        .map(|item| match targets.get(&item.id().0) {
            Some(target) => format!("{item} = {target}"),
            None => item.to_string(),
        })
        .collect();
    if lines.is_empty() {
        return Err(TaskError(format!(
            "no public item found in `{}`",
            json.display()
        )));
    }
    Ok(lines.join("\n") + "\n")
}

/// What each re-export (`pub use`) of a rustdoc JSON document names, by the
/// re-export's id: `kind path` at the item's own place (`struct
/// dk_core::limits::Limits` for `pub use dk_core::Limits`), else the path as
/// written. rustdoc inlines an item of the crate itself that is re-exported
/// from a private module (public-api then shows it whole at its new path),
/// but not one of another crate: its signature is in its own crate's
/// snapshot, and this line says which item it is. A glob (`pub use m::*`) is
/// shown by public-api with its source already and is left out here.
fn reexport_targets(json: &str) -> Result<BTreeMap<u32, String>, serde_json::Error> {
    let doc: serde_json::Value = serde_json::from_str(json)?;
    let empty = serde_json::Map::new();
    let table = |key: &str| {
        doc.get(key)
            .and_then(serde_json::Value::as_object)
            .unwrap_or(&empty)
    };
    let (index, paths) = (table("index"), table("paths"));
    let mut targets = BTreeMap::new();
    for (id, item) in index {
        let Some(used) = item.get("inner").and_then(|inner| inner.get("use")) else {
            continue;
        };
        let (Ok(id), false) = (
            id.parse::<u32>(),
            used.get("is_glob")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false),
        ) else {
            continue;
        };
        let place = used
            .get("id")
            .and_then(serde_json::Value::as_u64)
            .and_then(|target| paths.get(&target.to_string()))
            .and_then(|summary| {
                let kind = summary.get("kind")?.as_str()?;
                let path: Vec<&str> = summary
                    .get("path")?
                    .as_array()?
                    .iter()
                    .filter_map(serde_json::Value::as_str)
                    .collect();
                Some(format!("{kind} {}", path.join("::")))
            });
        let written = used.get("source").and_then(serde_json::Value::as_str);
        if let Some(target) = place.or_else(|| written.map(str::to_owned)) {
            targets.insert(id, target);
        }
    }
    Ok(targets)
}

/// The `format_version` of a rustdoc JSON document: its last top-level
/// field, so the last occurrence of the key (one inside a doc comment is
/// escaped, `\"format_version\"`, and never matches).
fn format_version(json: &str) -> Option<u32> {
    let key = "\"format_version\":";
    let at = json.rfind(key)?;
    let rest = json.get(at + key.len()..)?.trim_start();
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest.get(..digits)?.parse().ok()
}

/// What is wrong with a snapshot holding `old` (`None`: there is none) when
/// the crate's surface is `new`, or `None` when they agree.
fn difference(old: Option<&str>, new: &str) -> Option<String> {
    match old {
        Some(old) if old == new => None,
        None => Some("is missing".to_owned()),
        Some(old) => Some(format!("changed:\n{}", diff(old, new))),
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

/// The lines only in `old` (`-`, in its order) and then those only in `new`
/// (`+`), each as often as it is there more than in the other: the order
/// of a snapshot's lines follows from its items, so this is the whole change.
fn diff(old: &str, new: &str) -> String {
    let mut count: BTreeMap<&str, i32> = BTreeMap::new();
    for line in old.lines() {
        *count.entry(line).or_default() -= 1;
    }
    for line in new.lines() {
        *count.entry(line).or_default() += 1;
    }
    let mut changes = Vec::new();
    for (lines, sign, gone) in [(old, '-', true), (new, '+', false)] {
        for line in lines.lines() {
            if let Some(n) = count.get_mut(line)
                && ((gone && *n < 0) || (!gone && *n > 0))
            {
                *n += if gone { 1 } else { -1 };
                changes.push(format!("  {sign}{line}"));
            }
        }
    }
    changes.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(diff("z\nb\n", "a\nz\n"), "  -b\n  +a");
        assert_eq!(diff("a\na\n", "a\n"), "  -a");
    }

    #[test]
    fn the_format_version_is_the_last_key() {
        assert_eq!(
            format_version(
                r#"{"index":{"0":{"docs":"\"format_version\": 3"}},"format_version":57}"#
            ),
            Some(57)
        );
        assert_eq!(format_version(r#"{"format_version": 60 }"#), Some(60));
        assert_eq!(format_version("{}"), None);
        assert_eq!(format_version(r#"{"format_version":"x"}"#), None);
    }

    /// A crate of its own, out of the workspace, in a fresh temporary
    /// folder: `lib.rs` is what the test writes.
    struct Fixture(PathBuf);

    impl Fixture {
        fn new() -> Fixture {
            let dir = std::env::temp_dir().join(format!("dk-xtask-api-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("src")).expect("make the fixture's folder");
            std::fs::write(
                dir.join("Cargo.toml"),
                "[package]\nname = \"fixture\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[workspace]\n",
            )
            .expect("write the fixture's manifest");
            Fixture(dir)
        }

        /// The snapshot text of the crate with `source` as its `lib.rs`,
        /// through the task's own cargo command and renderer.
        fn surface(&self, source: &str) -> String {
            std::fs::write(self.0.join("src/lib.rs"), source).expect("write lib.rs");
            let mut doc = json_docs(["fixture"]);
            doc.arg("--quiet")
                .arg("--manifest-path")
                .arg(self.0.join("Cargo.toml"))
                .env("CARGO_TARGET_DIR", self.0.join("target"))
                // No dependency to rebuild here: the whole run may take it.
                .env("RUSTC_BOOTSTRAP", "1");
            status("fixture docs", &mut doc).expect("rustdoc JSON of the fixture");
            surface(&self.0.join("target/doc/fixture.json")).expect("the fixture's surface")
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A library with one item of each kind the snapshot must show in full.
    const FIXTURE: &str = r#"//! A fixture.
mod inner {
    /// Reached through the re-export.
    pub struct Moved {
        /// A field.
        pub size: u32,
        hidden: u8,
    }
}
pub use inner::Moved;
/// A public module, re-exported from too.
pub mod shapes {
    /// Shown at its own place.
    pub struct Dot;
}
pub use shapes::Dot;
pub use core::num::NonZeroU8 as Count;
/// A function.
pub fn scale(by: u8, name: &str) -> Option<u16> {
    let _ = name;
    Some(by.into())
}
/// An enum.
#[derive(Debug, Clone)]
pub enum Shape {
    /// A variant.
    Round(f32),
    /// Another.
    Square { side: u16 },
}
/// A trait.
pub trait Draw {
    /// A method.
    fn draw(&self, on: &mut Vec<u8>) -> bool;
}
"#;

    #[test]
    fn a_changed_signature_fails_the_check() {
        let fixture = Fixture::new();
        let blessed = fixture.surface(FIXTURE);
        for line in [
            "pub fn fixture::scale(u8, &str) -> core::option::Option<u16>",
            "pub struct fixture::Moved",
            "pub fixture::Moved::size: u32",
            "pub enum fixture::Shape",
            "pub fixture::Shape::Round(f32)",
            "pub fixture::Shape::Square::side: u16",
            "impl core::clone::Clone for fixture::Shape",
            "pub trait fixture::Draw",
            "pub fn fixture::Draw::draw(&self, &mut alloc::vec::Vec<u8>) -> bool",
            "pub use fixture::Count = type_alias core::num::nonzero::NonZeroU8",
        ] {
            assert!(
                blessed.lines().any(|l| l == line),
                "`{line}` is not in the snapshot:\n{blessed}"
            );
        }
        assert!(!blessed.contains("hidden"), "{blessed}");
        assert_eq!(fixture.surface(FIXTURE), blessed, "two runs differ");
        assert_eq!(difference(Some(&blessed), &blessed), None);

        let changed = fixture.surface(&FIXTURE.replace("by: u8", "by: u16"));
        assert_eq!(
            difference(Some(&blessed), &changed).as_deref(),
            Some(concat!(
                "changed:\n",
                "  -pub fn fixture::scale(u8, &str) -> core::option::Option<u16>\n",
                "  +pub fn fixture::scale(u16, &str) -> core::option::Option<u16>",
            ))
        );
        let field = fixture.surface(&FIXTURE.replace("pub size: u32", "pub size: u64"));
        assert!(
            difference(Some(&blessed), &field)
                .is_some_and(|d| d.contains("+pub fixture::Moved::size: u64"))
        );
        let method = fixture.surface(&FIXTURE.replace("-> bool;", "-> u8;"));
        assert!(difference(Some(&blessed), &method).is_some());
    }
}

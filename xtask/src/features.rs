//! The tokio features the vessel's core is built with: dk-core takes tokio
//! for its channels, its timers and `select!` only (`sync`, `time`,
//! `macros`), so its build itself shows that it opens no socket and no file
//! and spawns no task of its own. `cargo tree` resolves dk-core alone (with
//! dk-store without its `sqlite` feature, as dk-core takes it) and this step
//! fails when any other tokio feature is turned on.
//!
//! And dk-channel as a device's firmware builds it: without its default
//! features (no ring, no std), its tests (the contract's vectors included)
//! run on RustCrypto's ChaCha20-Poly1305 and on handshakes given their
//! random bytes.

use crate::run::{announce, cargo, describe, status};
use crate::{TaskError, TaskResult};

/// The tokio features dk-core may build with (`tokio-macros` is what
/// `macros` turns on).
const CORE_TOKIO_FEATURES: [&str; 4] = ["macros", "sync", "time", "tokio-macros"];

/// Fails when dk-core's normal build turns on a tokio feature it may not.
pub fn check_core() -> TaskResult {
    let mut command = cargo();
    command.args([
        "tree",
        "--package",
        "dk-core",
        "--edges",
        "normal,features",
        "--invert",
        "tokio",
        "--prefix",
        "none",
        "--locked",
    ]);
    announce("dk-core's tokio features", &command);
    let output = command
        .output()
        .map_err(|e| TaskError(format!("cannot start `{}`: {e}", describe(&command))))?;
    if !output.status.success() {
        return Err(TaskError(format!(
            "`{}` failed: {}",
            describe(&command),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let features = tokio_features(&String::from_utf8_lossy(&output.stdout));
    if features.is_empty() {
        return Err(TaskError(
            "dk-core's build turns on no tokio feature: is tokio still its dependency?".to_owned(),
        ));
    }
    let extra: Vec<&str> = features
        .iter()
        .map(String::as_str)
        .filter(|f| !CORE_TOKIO_FEATURES.contains(f))
        .collect();
    if extra.is_empty() {
        println!("dk-core builds tokio with {}", features.join(", "));
        Ok(())
    } else {
        Err(TaskError(format!(
            "dk-core's build turns on tokio's {} (only {} are allowed: dk-core opens no socket \
             and no file and spawns no task)",
            extra.join(", "),
            CORE_TOKIO_FEATURES.join(", ")
        )))
    }
}

/// Runs dk-channel's tests without its default features, with `vectors`:
/// the portable cipher must give the contract's vectors byte for byte.
pub fn check_channel_without_ring() -> TaskResult {
    status(
        "dk-channel without ring",
        cargo().args([
            "test",
            "--package",
            "dk-channel",
            "--no-default-features",
            "--features",
            "vectors",
            "--locked",
        ]),
    )
}

/// The tokio features named in `cargo tree --prefix none` output, sorted,
/// each once: lines such as `tokio feature "sync"`.
fn tokio_features(tree: &str) -> Vec<String> {
    let mut features: Vec<String> = tree
        .lines()
        .filter_map(|line| line.trim().strip_prefix("tokio feature \""))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect();
    features.sort();
    features.dedup();
    features
}

#[cfg(test)]
mod tests {
    use super::tokio_features;

    #[test]
    fn features_are_read_from_the_tree() {
        let tree = "tokio v1.54.1\ntokio feature \"macros\"\ndk-core v0.1.0 (/x)\n\
                    tokio feature \"macros\" (*)\ntokio feature \"sync\"\n\
                    dk-store feature \"default\"\ntokio feature \"net\"\n";
        assert_eq!(tokio_features(tree), ["macros", "net", "sync"]);
        assert!(tokio_features("tokio v1.54.1\n").is_empty());
    }
}

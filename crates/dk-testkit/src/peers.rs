//! The real servers the tests drive (Debian's PostgreSQL, nats-server,
//! Prometheus, ...): a test that finds its peer missing says so on stderr,
//! in one line starting `SKIPPED`, and passes, unless `DK_REQUIRE_PEERS` is
//! set (as `cargo xtask ci` does after `cargo xtask peers` installed them),
//! when it fails; with `DK_SKIPPED_DIR` set, each skip also leaves a file
//! there for `cargo xtask ci` to count. And a free loopback port to start
//! one on.

use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// The variable naming the folder where each skip leaves a file.
pub const SKIPPED_DIR: &str = "DK_SKIPPED_DIR";

/// Whether the tests must have their peers: `DK_REQUIRE_PEERS` is set.
fn peers_required() -> bool {
    std::env::var_os("DK_REQUIRE_PEERS").is_some()
}

/// `found` (the peer `what`, looked for by the caller), or `None` after
/// printing that `test` is skipped; when peers are required, a missing one
/// fails the test instead.
pub fn peer_or_skip<T>(test: &str, what: &str, found: Option<T>) -> Option<T> {
    if found.is_some() {
        return found;
    }
    if peers_required() {
        fail(&format!(
            "{what} is missing and DK_REQUIRE_PEERS is set (cargo xtask peers)"
        ));
    }
    eprintln!(
        "SKIPPED {test}: {what} is not installed (cargo xtask peers installs it; \
         DK_REQUIRE_PEERS=1 makes this a failure)"
    );
    if let Some(dir) = std::env::var_os(SKIPPED_DIR) {
        record_skip(Path::new(&dir), test, what);
    }
    None
}

/// Leaves a file in `dir` saying `test` was skipped for want of `what`:
/// one file a skip, named after the test, this process and a count.
fn record_skip(dir: &Path, test: &str, what: &str) {
    static SKIPS: AtomicU32 = AtomicU32::new(0);
    let name: String = test
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let file = dir.join(format!(
        "{name}.{}.{}",
        std::process::id(),
        SKIPS.fetch_add(1, Ordering::Relaxed)
    ));
    if let Err(error) = std::fs::write(&file, format!("{test}: {what}\n")) {
        fail(&format!(
            "cannot record a skip in `{}`: {error}",
            file.display()
        ));
    }
}

/// A free port on loopback.
pub fn free_port() -> u16 {
    match TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()) {
        Ok(address) => address.port(),
        Err(error) => fail(&format!("no free port on loopback: {error}")),
    }
}

/// Runs `cargo xtask firmware` from the workspace's root (the C library,
/// its header and the C examples, each rebuilt only when out of date) and
/// returns what it printed: one `name: path` a line. A failed build fails
/// the test, with what the build said.
pub fn firmware_build() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["run", "--quiet", "-p", "xtask", "--", "firmware"])
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run cargo xtask firmware: {e}")));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        fail(&format!(
            "cargo xtask firmware failed: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    said
}

/// Fails the test with `message`.
#[expect(
    clippy::panic,
    reason = "test support: a failure here fails the test that asked"
)]
pub(crate) fn fail(message: &str) -> ! {
    panic!("{message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_skip_leaves_a_file_naming_the_test_and_the_peer() {
        let dir = tempfile::tempdir().unwrap();
        record_skip(dir.path(), "a::test", "nats-server");
        record_skip(dir.path(), "a::test", "nats-server");
        let mut texts: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
            .collect();
        texts.sort();
        assert_eq!(texts, ["a::test: nats-server\n", "a::test: nats-server\n"]);
    }
}

//! The real servers the tests drive (Debian's PostgreSQL, nats-server,
//! Prometheus, ...): a test that finds its peer missing says so and passes,
//! unless `DK_REQUIRE_PEERS` is set (as `cargo xtask ci` does after `cargo
//! xtask peers` installed them), when it fails; and a free loopback port to
//! start one on.

use std::net::TcpListener;

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
    eprintln!("{test}: skipped: {what} is not installed (cargo xtask peers)");
    None
}

/// A free port on loopback.
pub fn free_port() -> u16 {
    match TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()) {
        Ok(address) => address.port(),
        Err(error) => fail(&format!("no free port on loopback: {error}")),
    }
}

/// Fails the test with `message`.
#[expect(
    clippy::panic,
    reason = "test support: a failure here fails the test that asked"
)]
pub(crate) fn fail(message: &str) -> ! {
    panic!("{message}")
}

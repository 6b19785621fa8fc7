//! The fleet tests' server (dk-testkit's `nats-server`) and members on it.

use std::time::{Duration, Instant};

use dk_fleet::{Fleet, FleetOptions, MemberId};
pub use dk_testkit::nats::{Nats, nats_or_skip};

/// Options for `member` on `nats` with the shared key, beating fast so
/// that expiry tests are short.
pub fn options(nats: &Nats, member: &str) -> FleetOptions {
    FleetOptions::new(
        [nats.url()],
        MemberId::new(member).unwrap(),
        nats.key_file(),
    )
    .presence(Duration::from_millis(100), Duration::from_millis(600))
}

/// A member joined with [`options`].
pub async fn member(nats: &Nats, member: &str) -> Fleet {
    Fleet::connect(options(nats, member)).await.unwrap()
}

/// Waits until `check` holds, or fails after `patience`.
pub async fn eventually(patience: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + patience;
    while !check() {
        assert!(Instant::now() < until, "{what}: not within {patience:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

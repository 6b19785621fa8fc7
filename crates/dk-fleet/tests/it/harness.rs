//! The fleet tests' server (dk-testkit's `nats-server`) and members on it.

use std::time::Duration;

use dk_fleet::{Fleet, FleetOptions, MemberId};
pub use dk_testkit::eventually;
pub use dk_testkit::nats::{Nats, nats_or_skip};

/// Options for `member` on `nats` with the shared key, beating fast (so
/// that changes are heard soon) and expiring as a member does by default
/// (so that a loaded machine does not look like a dead member).
pub fn options(nats: &Nats, member: &str) -> FleetOptions {
    FleetOptions::new(
        [nats.url()],
        MemberId::new(member).unwrap(),
        nats.key_file(),
    )
    .presence(Duration::from_millis(100), Duration::from_secs(3))
}

/// A member joined with [`options`].
pub async fn member(nats: &Nats, member: &str) -> Fleet {
    Fleet::connect(options(nats, member)).await.unwrap()
}

/// Waits until every one of `members` sees every other present.
pub async fn all_present(members: &[&Fleet]) {
    for a in members {
        for b in members {
            if a.member() != b.member() {
                eventually(&format!("{} sees {}", a.member(), b.member()), || {
                    a.incarnation_of(b.member()) == Some(b.incarnation())
                })
                .await;
            }
        }
    }
}

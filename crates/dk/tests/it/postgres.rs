//! `dk vessel --store postgres://...` on a real PostgreSQL (dk-testkit's):
//! a device paired, called, and served again with its grants by a vessel
//! killed and started anew on the same database; `dk audit verify --store`
//! finds the chain intact; nothing of the store in the data directory, and
//! the URL's password in none of the vessel's output.
//!
//! Without PostgreSQL the test says so and passes, unless
//! `DK_REQUIRE_PEERS` is set.

use dk_testkit::postgres::PgServer;
use serde_json::json;

use crate::durable::{DeviceRun, approve, call, connected};
use crate::process::{Running, Scratch, succeeded};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vessel_on_postgres_pairs_a_device_and_serves_it_again_after_a_kill() {
    let Some(server) =
        PgServer::shared("a_vessel_on_postgres_pairs_a_device_and_serves_it_again_after_a_kill")
    else {
        return;
    };
    // The server trusts loopback, so any password does: this one must
    // never be shown.
    let url = server.database().replacen("dk@", "dk:s3cret-pw@", 1);
    let scratch = Scratch::new("postgres");
    let dir = scratch.data_dir();
    let token = scratch.device_token_file("lamp");
    let store = [("DK_STORE", url.as_str())];

    let vessel = Running::start_env(&scratch, &[], &store);
    let lamp = DeviceRun::spawn(dk_device::samples::lamp(), &vessel.url(), &token);
    approve(&dir, "desk-lamp", "read_light").await;
    connected(&dir, &["desk-lamp"]).await;
    let admin = vessel.admin(&scratch);
    let read = call(&admin, "device__desk_lamp__read_light", json!({})).await;
    assert_eq!(read["ok"], true, "{read}");
    assert!(
        vessel.said("").contains("kept in PostgreSQL"),
        "{}",
        vessel.said("")
    );
    vessel.kill();
    let _ = lamp.stop().await;

    let vessel = Running::start_env(&scratch, &[], &store);
    let lamp = DeviceRun::spawn(dk_device::samples::lamp(), &vessel.url(), &token);
    let list = connected(&dir, &["desk-lamp"]).await;
    assert_eq!(list[0]["grants"], json!(["read_light"]), "{list}");
    assert!(lamp.codes().is_empty(), "the lamp asked to pair again");
    let admin = vessel.admin(&scratch);
    let read = call(&admin, "device__desk_lamp__read_light", json!({})).await;
    assert_eq!(read["ok"], true, "{read}");
    let said = format!("{}{}", vessel.said(""), vessel.complained());
    let _ = lamp.stop().await;
    vessel.interrupt();

    assert!(!dir.join("dk.db").exists(), "an SQLite store was made too");
    let verified = succeeded(&scratch.run(&["audit", "verify", "--store", &url]));
    assert!(verified.contains("intact"), "{verified}");
    assert!(!said.contains("s3cret-pw"), "{said}");
    assert!(!verified.contains("s3cret-pw"), "{verified}");
}

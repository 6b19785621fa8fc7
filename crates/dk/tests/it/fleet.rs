//! The fleet benches' small versions. `benches/fleet.rs` holds 10,000
//! lamps: here 1,000 dk/2 lamps paired through the store, each a real
//! dk-device client, on a real `dk vessel` process; the vessel killed with
//! SIGKILL and started again. Every lamp comes back and answers a call, and
//! no attempt fails for a reason a restart at the connection caps does not
//! explain. `benches/fleet_scale.rs` holds three members of 10,000 lamps:
//! here of 100, every member present with the others' lamps, a 300 KiB
//! answer routed whole, a member killed and its lamps answering through
//! the others, every decision in the log once and the chain intact. The
//! times are printed, never asserted on.

#[path = "../../benches/fleet/mod.rs"]
mod lamps;

use std::path::Path;
use std::time::Duration;

use lamps::{Fleet, Home, Vessel};

const LAMPS: usize = 1_000;

/// Lamps per member of the small fleet at size.
const MEMBER_LAMPS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_fleet_at_size_holds_its_lamps_and_loses_no_decision() {
    if dk_testkit::postgres::programs_or_skip("a_small_fleet_at_size").is_none()
        || dk_testkit::nats::nats_or_skip("a_small_fleet_at_size").is_none()
    {
        return;
    }
    let dk = Path::new(env!("CARGO_BIN_EXE_dk"));
    let figures = lamps::scale::run(dk, MEMBER_LAMPS, 20).await.unwrap();
    println!("{figures}");
    assert!(figures.large_whole);
    assert!(figures.largest_presence <= lamps::scale::PRESENCE_BUDGET);
    assert_eq!(figures.moved.devices, MEMBER_LAMPS);
    let (asked, logged) = figures.decisions;
    assert_eq!(asked, logged, "decisions made and in the log");
    assert!(figures.verified.contains("intact"), "{}", figures.verified);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_lamps_come_back_after_the_vessel_is_killed() {
    let dk = Path::new(env!("CARGO_BIN_EXE_dk"));
    let home = Home::seed(LAMPS).unwrap();
    let port = lamps::free_port().unwrap();
    let (vessel, start) = Vessel::start(dk, &home, port).await.unwrap();
    let mut lamps = Fleet::start(&home, port).unwrap();
    let connecting = lamps.connected(&vessel).await.unwrap();
    println!(
        "{LAMPS} lamps: the vessel answered {:.0} ms after its spawn, all connected in {:.1} s",
        start.as_secs_f64() * 1e3,
        connecting.as_secs_f64()
    );
    assert_eq!(vessel.connected().await.unwrap(), LAMPS as u64);

    let (vessel, storm) = lamps
        .storm(vessel, dk, &home, port, Duration::ZERO)
        .await
        .unwrap();
    println!("{storm}");
    assert!(
        storm.unexplained().is_empty(),
        "attempts failed or calls were refused for other reasons: {:?}",
        storm.unexplained()
    );
    assert_eq!(vessel.connected().await.unwrap(), LAMPS as u64);
    lamps.stop().await.unwrap();
    vessel.interrupt().await.unwrap();
}

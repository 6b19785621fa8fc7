//! The fleet bench's small version (`benches/fleet.rs` holds 10,000 lamps):
//! 1,000 dk/2 lamps paired through the store, each a real dk-device client,
//! on a real `dk vessel` process; the vessel killed with SIGKILL and started
//! again. Every lamp comes back and answers a call, and no attempt fails
//! for a reason a restart at the connection caps does not explain. The
//! times are printed, never asserted on.

#[path = "../../benches/fleet/mod.rs"]
mod lamps;

use std::path::Path;
use std::time::Duration;

use lamps::{Fleet, Home, Vessel};

const LAMPS: usize = 1_000;

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

//! A fleet at size (`cargo xtask bench fleet-scale`): PostgreSQL,
//! `nats-server` and three `dk vessel` members on this machine, 10,000
//! dk/2 lamps connected to each (`DK_FLEET_SCALE_DEVICES` changes the
//! count), 30,000 in all, each lamp a real dk-device client in this
//! process given every member's address (`benches/fleet/scale.rs`).
//!
//! It prints, each with its budget and `within` or `OVER`: every member
//! present with its lamps and the largest presence message (1 MiB); a
//! routed call beside a local one, median of 1,000 each (what routing adds,
//! 0.5 ms); a routed answer of 300 KiB arriving whole; one member killed
//! and its lamps calling again through the others (30 s), every decision in
//! the log once and `dk audit verify --store` intact. Figures are
//! reported, never asserted on.

mod common;
#[path = "fleet/mod.rs"]
mod fleet;

use std::path::Path;

use common::BoxError;

/// Lamps per member when `DK_FLEET_SCALE_DEVICES` is not set.
const DEFAULT_DEVICES: usize = 10_000;
/// Timed calls each way.
const CALLS: usize = 1_000;

fn main() -> Result<(), BoxError> {
    if std::env::var_os("DK_FLEET_SKIP").is_some() {
        return Ok(());
    }
    let devices = match std::env::var("DK_FLEET_SCALE_DEVICES") {
        Ok(text) => text
            .parse::<usize>()
            .map_err(|e| format!("DK_FLEET_SCALE_DEVICES `{text}`: {e}"))?,
        Err(_) => DEFAULT_DEVICES,
    };
    common::main("fleet-scale", || async move {
        let figures =
            fleet::scale::run(Path::new(env!("CARGO_BIN_EXE_dk")), devices, CALLS).await?;
        println!("\n{figures}");
        Ok(())
    })
}

//! Benchmarks of dk/2's channel: the vessel's CPU time for one handshake
//! (and both sides' together), a 200-byte text frame sealed and opened, and
//! the pairing's commitment and code. Run with `cargo xtask bench` (or
//! `cargo bench -p dk-channel`).

use std::hint::black_box;

use dk_channel::{
    FrameKind, Initiator, RecordLimits, Responder, StaticKey, commitment, pairing_code,
};

fn main() {
    divan::main();
}

/// A frame of about 200 bytes, as a lamp answers `set_light`.
const RESULT_200: &str = r#"{"type":"device:result","callId":"5b0c7c2e-4f1d-4a63-9d55-8f0d2e1e9c11","ok":true,"result":{"on":true,"brightness":40,"colour":"warm white","note":"set by the agent at the person's request, 21:04"}}"#;

/// v1's limits.
const LIMITS: RecordLimits = RecordLimits {
    max_text: 1 << 20,
    max_binary: 1 << 20,
};

/// 32 bytes counting up from `first`, as the test vectors' keys do.
fn bytes_from(first: u8) -> [u8; 32] {
    std::array::from_fn(|i| first.wrapping_add(i as u8))
}

mod handshake {
    use super::*;

    /// The vessel's side alone: `Responder::new`, `read_first`,
    /// `second_message`, `read_third`. The device's messages are made once
    /// beforehand: with both ephemeral keys fixed (as in the test vectors)
    /// the handshake is the same every time. Fixing the vessel's ephemeral
    /// key costs what drawing one does, but the draw from the system's
    /// generator.
    #[divan::bench(sample_count = 100, sample_size = 10)]
    fn responder_side(bencher: divan::Bencher) {
        let (Ok(device), Ok(vessel)) = (
            StaticKey::from_secret(bytes_from(0x01)),
            StaticKey::from_secret(bytes_from(0x41)),
        ) else {
            return;
        };
        let device_ephemeral = bytes_from(0x21);
        let vessel_ephemeral = bytes_from(0x61);
        let Some((first, third)) = (|| {
            let mut initiator =
                Initiator::with_fixed_ephemeral_for_vectors(&device, &device_ephemeral).ok()?;
            let mut responder =
                Responder::with_fixed_ephemeral_for_vectors(&vessel, &vessel_ephemeral).ok()?;
            let first = initiator.first_message().ok()?;
            responder.read_first(&first).ok()?;
            initiator
                .read_second(&responder.second_message().ok()?)
                .ok()?;
            let (third, _) = initiator.third_message().ok()?;
            Some((first, third))
        })() else {
            return;
        };
        bencher.bench(|| {
            let finished = (|| {
                let mut responder =
                    Responder::with_fixed_ephemeral_for_vectors(&vessel, &vessel_ephemeral).ok()?;
                responder.read_first(black_box(&first)).ok()?;
                black_box(responder.second_message().ok()?);
                responder.read_third(black_box(&third)).ok()
            })();
            black_box(finished.is_some())
        });
    }

    /// Both sides with fresh ephemeral keys, the device driven alongside
    /// the vessel: all of one handshake's CPU time.
    #[divan::bench(sample_count = 100, sample_size = 10)]
    fn both_sides(bencher: divan::Bencher) {
        let (Ok(device), Ok(vessel)) = (StaticKey::generate(), StaticKey::generate()) else {
            return;
        };
        bencher.bench(|| {
            let finished = (|| {
                let mut initiator = Initiator::new(&device).ok()?;
                let mut responder = Responder::new(&vessel).ok()?;
                responder
                    .read_first(&initiator.first_message().ok()?)
                    .ok()?;
                initiator
                    .read_second(&responder.second_message().ok()?)
                    .ok()?;
                let (third, _) = initiator.third_message().ok()?;
                responder.read_third(&third).ok()
            })();
            black_box(finished.is_some())
        });
    }
}

/// A 200-byte text frame sealed by the device and opened by the vessel.
#[divan::bench(sample_count = 200, sample_size = 200)]
fn seal_open_text_200b(bencher: divan::Bencher) {
    let channel = (|| {
        let device = StaticKey::generate().ok()?;
        let vessel = StaticKey::generate().ok()?;
        let mut initiator = Initiator::new(&device).ok()?;
        let mut responder = Responder::new(&vessel).ok()?;
        responder
            .read_first(&initiator.first_message().ok()?)
            .ok()?;
        initiator
            .read_second(&responder.second_message().ok()?)
            .ok()?;
        let (third, device_side) = initiator.third_message().ok()?;
        let vessel_side = responder.read_third(&third).ok()?;
        Some((device_side.split(LIMITS).0, vessel_side.split(LIMITS).1))
    })();
    let Some((mut sealer, mut opener)) = channel else {
        return;
    };
    bencher.bench_local(|| {
        let Ok(records) = sealer.seal(FrameKind::Text, black_box(RESULT_200.as_bytes())) else {
            return false;
        };
        records
            .iter()
            .all(|record| matches!(opener.open(black_box(record)), Ok(Some(_))))
    });
}

/// The vessel's commitment and the code, as both sides compute them.
#[divan::bench(sample_count = 200, sample_size = 200)]
fn commitment_and_code(bencher: divan::Bencher) {
    let h = bytes_from(0xce);
    let nd = bytes_from(0xa1);
    let nv = bytes_from(0xc1);
    bencher.bench(|| {
        let committed = commitment(black_box(&nv), black_box(&h));
        let code = pairing_code(black_box(&h), black_box(&nd), black_box(&nv));
        black_box((committed, code))
    });
}

//! Tests of dk-channel: the contract's test vectors byte for byte, the
//! handshake's steps and failures, the record layer's frames, limits and
//! failures, the pairing math, and property tests against a model of the
//! record layer.

use std::{string::String, string::ToString, vec::Vec};

mod handshake;
mod pairing;
mod props;
mod records;
mod vectors;

use std::sync::{Arc, OnceLock};

use crate::{
    Established, FrameKind, Initiator, OpenError, OpenedFrame, Opener, RecordLimits, Responder,
    Sealer, StaticKey,
};

/// Limits large enough for every frame the tests send.
const ROOMY: RecordLimits = RecordLimits {
    max_text: 4 << 20,
    max_binary: 4 << 20,
};

/// 32 fresh random bytes: the system's (through ring) with the `ring`
/// feature; without it, distinct bytes for each call (the hash of a
/// counter), as a platform's CSPRNG would give.
fn fresh_bytes() -> [u8; 32] {
    #[cfg(feature = "ring")]
    {
        crate::random_nonce().unwrap()
    }
    #[cfg(not(feature = "ring"))]
    {
        use sha2::Digest;
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        sha2::Sha256::new()
            .chain_update(b"dk-channel tests")
            .chain_update(n.to_le_bytes())
            .finalize()
            .into()
    }
}

/// A fresh static key: [`StaticKey::generate`] with the `ring` feature,
/// else one of [`fresh_bytes`].
fn fresh_key() -> StaticKey {
    #[cfg(feature = "ring")]
    {
        StaticKey::generate().unwrap()
    }
    #[cfg(not(feature = "ring"))]
    {
        StaticKey::from_secret(fresh_bytes()).unwrap()
    }
}

/// A device's handshake: [`Initiator::new`] with the `ring` feature, else
/// [`Initiator::with_random`] on [`fresh_bytes`].
fn new_initiator(key: &StaticKey) -> Initiator {
    #[cfg(feature = "ring")]
    {
        Initiator::new(key).unwrap()
    }
    #[cfg(not(feature = "ring"))]
    {
        Initiator::with_random(key, fresh_bytes()).unwrap()
    }
}

/// A vessel's handshake, as [`new_initiator`].
fn new_responder(key: &StaticKey) -> Responder {
    #[cfg(feature = "ring")]
    {
        Responder::new(key).unwrap()
    }
    #[cfg(not(feature = "ring"))]
    {
        Responder::with_random(key, fresh_bytes()).unwrap()
    }
}

/// Both ends of one finished handshake between fresh keys: the device's,
/// then the vessel's.
fn handshake() -> (Established, Established) {
    let device = fresh_key();
    let vessel = fresh_key();
    handshake_between(&device, &vessel)
}

/// Both ends of one finished handshake between these keys.
fn handshake_between(device: &StaticKey, vessel: &StaticKey) -> (Established, Established) {
    let mut initiator = new_initiator(device);
    let mut responder = new_responder(vessel);
    responder
        .read_first(&initiator.first_message().unwrap())
        .unwrap();
    initiator
        .read_second(&responder.second_message().unwrap())
        .unwrap();
    let (third, device_side) = initiator.third_message().unwrap();
    (device_side, responder.read_third(&third).unwrap())
}

/// One direction of a fresh channel: the device's sealer and the vessel's
/// opener.
fn device_to_vessel(limits: RecordLimits) -> (Sealer, Opener) {
    let (device, vessel) = handshake();
    let (sealer, _) = device.split(limits);
    let (_, opener) = vessel.split(limits);
    (sealer, opener)
}

/// A fresh sealer and opener of one direction of a handshake made once
/// for all the tests that call this: each pair starts at nonce 0 again,
/// which only tests may do (a handshake costs tens of milliseconds in a
/// debug build, and property tests want hundreds of channels).
fn reused_device_to_vessel(limits: RecordLimits) -> (Sealer, Opener) {
    type Shared = Arc<snow::StatelessTransportState>;
    static SHARED: OnceLock<(Shared, Shared)> = OnceLock::new();
    let (device, vessel) = SHARED.get_or_init(|| {
        let (device, vessel) = handshake();
        (device.into_transport(), vessel.into_transport())
    });
    (
        Sealer::new(Arc::clone(device)),
        Opener::new(Arc::clone(vessel), limits),
    )
}

/// Opens records in order; every one but the last must leave the frame
/// incomplete, and the last must finish it.
#[track_caller]
fn open_all(opener: &mut Opener, records: &[Vec<u8>]) -> OpenedFrame {
    let (last, first) = records.split_last().unwrap();
    for (i, record) in first.iter().enumerate() {
        assert_eq!(opener.open(record).unwrap(), None, "record {i}");
        assert_eq!(opener.records_in_frame(), i + 1);
    }
    let frame = opener.open(last).unwrap().unwrap();
    assert_eq!(opener.records_in_frame(), 0);
    frame
}

/// The frame a kind and bytes make, as the opener gives it back.
fn opened(kind: FrameKind, bytes: &[u8]) -> OpenedFrame {
    match kind {
        FrameKind::Text => OpenedFrame::Text(String::from_utf8(bytes.to_vec()).unwrap()),
        FrameKind::Binary => OpenedFrame::Binary(bytes.to_vec()),
    }
}

/// Whether a result is the channel failure `expected` (compared by its
/// text, as `ChannelError` is not `PartialEq`).
#[track_caller]
fn assert_channel_failure<T: std::fmt::Debug>(result: Result<T, OpenError>, expected: &str) {
    match result {
        Err(OpenError::Channel(error)) => assert_eq!(error.to_string(), expected),
        other => panic!("expected the channel failure `{expected}`, got {other:?}"),
    }
}

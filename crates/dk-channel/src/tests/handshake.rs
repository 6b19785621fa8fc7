//! The handshake: its messages' lengths, the keys each side learns, and
//! every way it fails (a wrong length, a step out of turn, garbage, a
//! tampered or replayed message); keys, fingerprints and `Debug` output.

use std::{borrow::ToOwned, format, string::String, vec, vec::Vec};

use super::{fresh_key, handshake, handshake_between, new_initiator, new_responder};
use crate::{
    ChannelError, HANDSHAKE_LENGTHS, Initiator, LowOrderSlot, PublicKey, Responder, StaticKey,
    to_hex32,
};

/// The bytes given to `with_random` are the ephemeral secret, and the only
/// random bytes a handshake takes: the same ones give the same messages,
/// and message 1 is their public key.
#[test]
fn given_random_bytes_make_the_ephemeral_key() {
    let device = fresh_key();
    let vessel = fresh_key();
    let ephemeral = [0x21; 32];
    let public = *StaticKey::from_secret(ephemeral)
        .unwrap()
        .public()
        .as_bytes();
    let first = Initiator::with_random(&device, ephemeral)
        .unwrap()
        .first_message()
        .unwrap();
    assert_eq!(first, public);
    let run = || {
        let mut initiator = Initiator::with_random(&device, ephemeral).unwrap();
        let mut responder = Responder::with_random(&vessel, [0x61; 32]).unwrap();
        responder.read_first(&initiator.first_message()?)?;
        let second = responder.second_message()?;
        initiator.read_second(&second)?;
        let (third, established) = initiator.third_message()?;
        let vessel_side = responder.read_third(&third)?;
        assert_eq!(established.handshake_hash, vessel_side.handshake_hash);
        Ok::<_, ChannelError>((second, third, established.handshake_hash))
    };
    assert_eq!(run().unwrap(), run().unwrap());
}

#[test]
fn a_handshake_finishes_with_each_side_knowing_the_other() {
    let device = fresh_key();
    let vessel = fresh_key();
    let mut initiator = new_initiator(&device);
    let mut responder = new_responder(&vessel);
    let first = initiator.first_message().unwrap();
    responder.read_first(&first).unwrap();
    let second = responder.second_message().unwrap();
    // The device learns the vessel's key before it sends message 3.
    assert!(
        initiator
            .read_second(&second)
            .unwrap()
            .ct_eq(&vessel.public())
    );
    let (third, device_side) = initiator.third_message().unwrap();
    assert_eq!([first.len(), second.len(), third.len()], HANDSHAKE_LENGTHS);
    let vessel_side = responder.read_third(&third).unwrap();
    assert_eq!(device_side.remote, vessel.public());
    assert_eq!(vessel_side.remote, device.public());
    assert_eq!(device_side.handshake_hash, vessel_side.handshake_hash);

    // Another handshake between the same keys has another hash.
    let (again, _) = handshake_between(&device, &vessel);
    assert_ne!(again.handshake_hash, device_side.handshake_hash);
}

#[track_caller]
fn check_length(error: ChannelError, step: u8, got: usize) {
    let expected = HANDSHAKE_LENGTHS[usize::from(step) - 1];
    assert!(
        matches!(error, ChannelError::HandshakeLength { step: s, got: g, expected: e }
            if s == step && g == got && e == expected),
        "{error:?}"
    );
}

#[test]
fn each_message_must_have_exactly_its_length() {
    let key = fresh_key();
    for len in [0, 1, 31, 33, 64, 96, 65_535] {
        let mut responder = new_responder(&key);
        check_length(responder.read_first(&vec![9; len]).unwrap_err(), 1, len);
        // A failed side refuses the steps after.
        assert!(matches!(
            responder.second_message(),
            Err(ChannelError::HandshakeOrder)
        ));
    }
    for len in [0, 32, 95, 97, 112] {
        let mut initiator = new_initiator(&key);
        initiator.first_message().unwrap();
        check_length(initiator.read_second(&vec![9; len]).unwrap_err(), 2, len);
        assert!(matches!(
            initiator.third_message(),
            Err(ChannelError::HandshakeOrder)
        ));
    }
    for len in [0, 32, 63, 65, 96] {
        let vessel = fresh_key();
        let mut initiator = new_initiator(&key);
        let mut responder = new_responder(&vessel);
        responder
            .read_first(&initiator.first_message().unwrap())
            .unwrap();
        responder.second_message().unwrap();
        check_length(responder.read_third(&vec![9; len]).unwrap_err(), 3, len);
    }
}

/// A handshake message written by the Noise library itself with a payload
/// (valid Noise, but not dk/2) is refused by its length.
#[test]
fn a_message_with_a_payload_is_refused() {
    let device = fresh_key();
    let mut noise = crate::noise::builder(crate::noise::Randomness::once(super::fresh_bytes()))
        .unwrap()
        .prologue(crate::PROLOGUE)
        .unwrap()
        .local_private_key(device.secret())
        .unwrap()
        .build_initiator()
        .unwrap();
    let mut message = [0u8; 100];
    let len = noise.write_message(b"hello", &mut message).unwrap();
    assert_eq!(len, 37);
    let mut responder = new_responder(&fresh_key());
    check_length(responder.read_first(&message[..len]).unwrap_err(), 1, 37);
}

#[test]
fn steps_out_of_turn_are_refused() {
    let key = fresh_key();
    let order = |result: Result<(), ChannelError>| {
        assert!(
            matches!(result, Err(ChannelError::HandshakeOrder)),
            "{result:?}"
        );
    };

    let mut initiator = new_initiator(&key);
    order(initiator.read_second(&[0; 96]).map(drop));
    order(initiator.first_message().map(drop));

    let mut initiator = new_initiator(&key);
    initiator.first_message().unwrap();
    order(initiator.first_message().map(drop));

    let initiator = new_initiator(&key);
    order(initiator.third_message().map(drop));

    let mut responder = new_responder(&key);
    order(responder.second_message().map(drop));

    let mut responder = new_responder(&key);
    responder.read_first(&[7; 32]).unwrap();
    order(responder.read_first(&[7; 32]));

    let mut responder = new_responder(&key);
    responder.read_first(&[7; 32]).unwrap();
    order(responder.read_third(&[0; 64]).map(drop));
}

#[test]
fn garbage_fails_the_handshake_without_a_panic() {
    let key = fresh_key();
    // Any 32 bytes but a low-order point are an ephemeral key: the
    // responder goes on, and the garbage third message fails to decrypt.
    // All zeros is one of the low-order points, refused at once.
    assert!(matches!(
        new_responder(&key).read_first(&[0u8; 32]),
        Err(ChannelError::LowOrderKey(LowOrderSlot::Ephemeral))
    ));
    for first in [[0xff; 32], [7; 32]] {
        let mut responder = new_responder(&key);
        responder.read_first(&first).unwrap();
        assert_eq!(responder.second_message().unwrap().len(), 96);
        assert!(matches!(
            responder.read_third(&[0x5a; 64]),
            Err(ChannelError::Decrypt)
        ));
    }
    let mut initiator = new_initiator(&key);
    initiator.first_message().unwrap();
    assert!(matches!(
        initiator.read_second(&[0x5a; 96]),
        Err(ChannelError::Decrypt)
    ));
}

#[test]
fn a_tampered_message_fails_to_decrypt() {
    let device = fresh_key();
    let vessel = fresh_key();
    // Message 2: a flipped bit in the vessel's key or its tag.
    for at in [32, 60, 95] {
        let mut initiator = new_initiator(&device);
        let mut responder = new_responder(&vessel);
        responder
            .read_first(&initiator.first_message().unwrap())
            .unwrap();
        let mut second = responder.second_message().unwrap();
        second[at] ^= 1;
        assert!(matches!(
            initiator.read_second(&second),
            Err(ChannelError::Decrypt)
        ));
    }
    // Message 3: a flipped bit anywhere.
    for at in [0, 40, 63] {
        let mut initiator = new_initiator(&device);
        let mut responder = new_responder(&vessel);
        responder
            .read_first(&initiator.first_message().unwrap())
            .unwrap();
        initiator
            .read_second(&responder.second_message().unwrap())
            .unwrap();
        let (mut third, _) = initiator.third_message().unwrap();
        third[at] ^= 0x80;
        assert!(matches!(
            responder.read_third(&third),
            Err(ChannelError::Decrypt)
        ));
    }
}

/// A recorded handshake replayed to the vessel: the vessel's fresh
/// ephemeral key makes the old message 3 fail.
#[test]
fn a_replayed_handshake_is_refused() {
    let device = fresh_key();
    let vessel = fresh_key();
    let mut initiator = new_initiator(&device);
    let mut responder = new_responder(&vessel);
    let first = initiator.first_message().unwrap();
    responder.read_first(&first).unwrap();
    initiator
        .read_second(&responder.second_message().unwrap())
        .unwrap();
    let (third, _) = initiator.third_message().unwrap();
    responder.read_third(&third).unwrap();

    let mut replayed = new_responder(&vessel);
    replayed.read_first(&first).unwrap();
    replayed.second_message().unwrap();
    assert!(matches!(
        replayed.read_third(&third),
        Err(ChannelError::Decrypt)
    ));
}

#[test]
fn keys_derive_and_print_safely() {
    let key = fresh_key();
    let again = StaticKey::from_secret(*key.secret()).unwrap();
    assert_eq!(again.public(), key.public());
    assert_ne!(fresh_key().public(), key.public());

    let secret = to_hex32(key.secret());
    let debug = format!("{key:?}");
    assert!(!debug.contains(&secret), "{debug}");
    assert!(debug.contains(&key.public().to_hex()), "{debug}");
    let (device_side, vessel_side) = handshake();
    for debug in [format!("{device_side:?}"), format!("{vessel_side:?}")] {
        assert!(!debug.contains(&secret), "{debug}");
    }
    assert_eq!(
        format!("{:?}", PublicKey::from_bytes([0xab; 32])),
        format!("PublicKey({})", "ab".repeat(32))
    );
}

#[test]
fn public_keys_read_only_lower_case_hex() {
    let key = fresh_key().public();
    assert_eq!(PublicKey::from_hex(&key.to_hex()), Some(key));
    assert_eq!(PublicKey::from_bytes(*key.as_bytes()), key);
    for bad in [
        key.to_hex().to_uppercase(),
        key.to_hex()[1..].to_owned(),
        format!("{}0", key.to_hex()),
        format!(" {}", &key.to_hex()[1..]),
        "g".repeat(64),
        String::new(),
    ] {
        assert_eq!(PublicKey::from_hex(&bad), None, "{bad}");
    }
    let other = PublicKey::from_bytes([1; 32]);
    assert!(key.ct_eq(&key));
    assert!(!key.ct_eq(&other));
}

#[test]
fn fingerprints_are_grouped_base32() {
    let fingerprint = PublicKey::from_bytes([0; 32]).fingerprint();
    assert_eq!(fingerprint.len(), 26 + 6);
    let groups: Vec<&str> = fingerprint.split('-').collect();
    assert_eq!(groups.len(), 7);
    assert!(groups[..6].iter().all(|g| g.len() == 4));
    assert_eq!(groups[6].len(), 2);
    assert!(
        fingerprint
            .chars()
            .all(|c| c == '-' || c.is_ascii_uppercase() || ('2'..='7').contains(&c)),
        "{fingerprint}"
    );
}

/// The X25519 public keys of small order: 0, 1, the two points of order 8,
/// p - 1 (order 2), and the non-canonical p and p + 1; each also with the
/// top bit set, which X25519 ignores.
fn low_order_points() -> Vec<[u8; 32]> {
    let canonical = [
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0100000000000000000000000000000000000000000000000000000000000000",
        "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
        "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    ];
    let mut points = Vec::new();
    for hex in canonical {
        let point = crate::from_hex32(hex).unwrap();
        let mut high = point;
        high[31] |= 0x80;
        points.extend([point, high]);
    }
    points
}

#[test]
fn a_low_order_ephemeral_key_fails_the_handshake_on_both_sides() {
    let key = fresh_key();
    for point in low_order_points() {
        // The vessel reads the device's ephemeral key in message 1.
        let mut responder = new_responder(&key);
        let error = responder.read_first(&point).unwrap_err();
        assert!(
            matches!(error, ChannelError::LowOrderKey(LowOrderSlot::Ephemeral)),
            "{}: {error:?}",
            to_hex32(&point)
        );
        assert!(responder.second_message().is_err());
        // The device reads the vessel's in message 2.
        let mut initiator = new_initiator(&key);
        initiator.first_message().unwrap();
        let mut second = point.to_vec();
        second.resize(96, 7);
        let error = initiator.read_second(&second).unwrap_err();
        assert!(
            matches!(error, ChannelError::LowOrderKey(LowOrderSlot::Ephemeral)),
            "{error:?}"
        );
        assert!(initiator.third_message().is_err());
    }
}

#[cfg(feature = "ring")]
#[test]
fn a_peer_presenting_the_point_0_is_refused_by_each_side() {
    let device = fresh_key();
    let vessel = fresh_key();
    for zero in [LowOrderSlot::Static, LowOrderSlot::Ephemeral] {
        // A hostile device against the vessel.
        let mut initiator = Initiator::presenting_low_order_for_tests(&device, zero).unwrap();
        let mut responder = new_responder(&vessel);
        let first = initiator.first_message().unwrap();
        let refused = responder.read_first(&first).and_then(|()| {
            let second = responder.second_message()?;
            initiator.read_second(&second)?;
            let (third, _) = initiator.third_message()?;
            responder.read_third(&third)
        });
        assert!(
            matches!(refused, Err(ChannelError::LowOrderKey(slot)) if slot == zero),
            "{zero}: {refused:?}"
        );
        // A hostile vessel against the device: refused at message 2, before
        // the device says anything of itself.
        let mut initiator = new_initiator(&device);
        let mut responder = Responder::presenting_low_order_for_tests(&vessel, zero).unwrap();
        responder
            .read_first(&initiator.first_message().unwrap())
            .unwrap();
        let refused = initiator.read_second(&responder.second_message().unwrap());
        assert!(
            matches!(refused, Err(ChannelError::LowOrderKey(slot)) if slot == zero),
            "{zero}: {refused:?}"
        );
    }
}

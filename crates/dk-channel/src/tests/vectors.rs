//! The contract's test vectors (`fixtures/secure-channel-vectors.json`,
//! made by an independent implementation): keys, fingerprints, the three
//! handshake messages, the handshake hash, the commitment and its check,
//! the code, and every record's plaintext and ciphertext, byte for byte.

use std::{borrow::ToOwned, vec::Vec};

use data_encoding::HEXLOWER;
use serde_json::Value;

use crate::{
    FrameKind, Initiator, NOISE_PATTERN, OpenedFrame, PROLOGUE, RecordLimits, Responder, StaticKey,
    code_number, commitment, commitment_holds, from_hex32, pairing_code, to_hex32,
};

const VECTORS: &str = include_str!("../../../../fixtures/secure-channel-vectors.json");

fn text<'a>(vector: &'a Value, key: &str) -> &'a str {
    vector[key]
        .as_str()
        .unwrap_or_else(|| panic!("`{key}` is not a string"))
}

fn bytes32(vector: &Value, key: &str) -> [u8; 32] {
    from_hex32(text(vector, key)).unwrap_or_else(|| panic!("`{key}` is not 32 bytes of hex"))
}

fn bytes(hex: &str) -> Vec<u8> {
    HEXLOWER.decode(hex.as_bytes()).unwrap()
}

#[test]
fn all_four_vectors_are_reproduced() {
    let file: Value = serde_json::from_str(VECTORS).unwrap();
    let vectors = file["vectors"].as_array().unwrap();
    let names: Vec<&str> = vectors.iter().map(|v| text(v, "name")).collect();
    assert_eq!(
        names,
        ["basic", "leading-zeros", "high-bit", "wrong-reveal"]
    );
    for vector in vectors {
        check_vector(vector);
    }
}

#[track_caller]
fn check_vector(vector: &Value) {
    let name = text(vector, "name");
    assert_eq!(text(vector, "protocol"), NOISE_PATTERN, "{name}");
    assert_eq!(bytes(text(vector, "prologue")), PROLOGUE, "{name}");

    // Keys: each public key derived from its private one.
    let device = StaticKey::from_secret(bytes32(vector, "device_static_private")).unwrap();
    let vessel = StaticKey::from_secret(bytes32(vector, "vessel_static_private")).unwrap();
    let device_ephemeral = bytes32(vector, "device_ephemeral_private");
    let vessel_ephemeral = bytes32(vector, "vessel_ephemeral_private");
    for (key, public) in [
        (&device, "device_static_public"),
        (&vessel, "vessel_static_public"),
        (
            &StaticKey::from_secret(device_ephemeral).unwrap(),
            "device_ephemeral_public",
        ),
        (
            &StaticKey::from_secret(vessel_ephemeral).unwrap(),
            "vessel_ephemeral_public",
        ),
    ] {
        assert_eq!(
            key.public().to_hex(),
            text(vector, public),
            "{name}: {public}"
        );
    }
    assert_eq!(
        device.public().fingerprint(),
        text(vector, "device_fingerprint"),
        "{name}"
    );
    assert_eq!(
        vessel.public().fingerprint(),
        text(vector, "vessel_fingerprint"),
        "{name}"
    );

    // The handshake, with the vector's ephemeral keys.
    let messages: Vec<Vec<u8>> = vector["handshake_messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| bytes(m.as_str().unwrap()))
        .collect();
    let mut initiator =
        Initiator::with_fixed_ephemeral_for_vectors(&device, &device_ephemeral).unwrap();
    let mut responder =
        Responder::with_fixed_ephemeral_for_vectors(&vessel, &vessel_ephemeral).unwrap();
    let first = initiator.first_message().unwrap();
    assert_eq!(first, messages[0], "{name}: message 1");
    responder.read_first(&first).unwrap();
    let second = responder.second_message().unwrap();
    assert_eq!(second, messages[1], "{name}: message 2");
    assert_eq!(initiator.read_second(&second).unwrap(), vessel.public());
    let (third, device_side) = initiator.third_message().unwrap();
    assert_eq!(third, messages[2], "{name}: message 3");
    let vessel_side = responder.read_third(&third).unwrap();
    assert_eq!(device_side.remote, vessel.public());
    assert_eq!(vessel_side.remote, device.public());
    let h = bytes32(vector, "handshake_hash");
    assert_eq!(device_side.handshake_hash, h, "{name}: handshake hash");
    assert_eq!(vessel_side.handshake_hash, h, "{name}: handshake hash");

    // Pairing: the commitment, the device's check of the reveal, the code.
    let nd = bytes32(vector, "nd");
    let nv = bytes32(vector, "nv");
    let revealed = bytes32(vector, "revealed_nonce");
    let committed = commitment(&nv, &h);
    assert_eq!(to_hex32(&committed), text(vector, "commitment"), "{name}");
    let holds = vector["commitment_ok"].as_bool().unwrap();
    assert_eq!(commitment_holds(&committed, &revealed, &h), holds, "{name}");
    if holds {
        let number = vector["code_u32"].as_u64().unwrap();
        assert_eq!(u64::from(code_number(&h, &nd, &revealed)), number, "{name}");
        assert_eq!(
            pairing_code(&h, &nd, &revealed),
            text(vector, "code"),
            "{name}"
        );
    } else {
        assert!(
            vector["code"].is_null(),
            "{name}: a failed check shows no code"
        );
    }

    // Records, in order per direction; `n` is that direction's nonce.
    let limits = RecordLimits {
        max_text: 1 << 20,
        max_binary: 1 << 20,
    };
    let (mut device_sealer, mut device_opener) = device_side.split(limits);
    let (mut vessel_sealer, mut vessel_opener) = vessel_side.split(limits);
    let mut sent = [0u64; 2];
    for record in vector["records"].as_array().unwrap() {
        let from = text(record, "from");
        let (sealer, opener, count) = match from {
            "device" => (&mut device_sealer, &mut vessel_opener, &mut sent[0]),
            "vessel" => (&mut vessel_sealer, &mut device_opener, &mut sent[1]),
            other => panic!("{name}: a record from `{other}`"),
        };
        assert_eq!(
            record["n"].as_u64().unwrap(),
            *count,
            "{name}: records in order"
        );
        *count += 1;
        let frame = text(record, "frame");
        let plaintext = bytes(text(record, "plaintext"));
        let ciphertext = bytes(text(record, "ciphertext"));
        assert_eq!(plaintext[0], 0x00, "{name}: a last text piece");
        assert_eq!(&plaintext[1..], frame.as_bytes(), "{name}");
        let sealed = sealer.seal(FrameKind::Text, frame.as_bytes()).unwrap();
        assert_eq!(
            sealed,
            std::slice::from_ref(&ciphertext),
            "{name}: {from} record {count}"
        );
        assert_eq!(
            opener.open(&ciphertext).unwrap(),
            Some(OpenedFrame::Text(frame.to_owned())),
            "{name}"
        );
    }
    assert_eq!(sent, [2, 2], "{name}: two records each way");
}

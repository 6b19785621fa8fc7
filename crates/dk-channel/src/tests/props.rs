//! Property tests: random frames round-trip; random plaintexts behave as a
//! plain model of the record layer says; random bytes never make the
//! opener panic nor recover; hex and codes keep their shape.

use std::{string::String, vec::Vec};

use proptest::prelude::*;

use super::{ROOMY, open_all, opened, reused_device_to_vessel};
use crate::{
    ChannelError, FrameKind, MAX_PIECE, OpenError, OpenedFrame, RecordLimits, from_hex32,
    pairing_code, to_hex32,
};

/// A frame length: mostly small, sometimes around one or two pieces.
fn frame_len() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..300,
        1 => MAX_PIECE - 2..MAX_PIECE + 3,
        1 => 2 * MAX_PIECE - 1..2 * MAX_PIECE + 2,
    ]
}

fn kind() -> impl Strategy<Value = FrameKind> {
    prop_oneof![Just(FrameKind::Text), Just(FrameKind::Binary)]
}

/// What the model expects of one record.
#[derive(Debug, PartialEq)]
enum Outcome {
    Incomplete,
    Frame(OpenedFrame),
    TooLarge(FrameKind),
    Failed,
}

/// The record layer's rules, written as plainly as possible: the outcome
/// of each plaintext in order, the first failure ending the list.
fn model(plaintexts: &[Vec<u8>], limits: RecordLimits) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    let mut frame: Option<(FrameKind, Vec<u8>)> = None;
    for plaintext in plaintexts {
        let outcome = (|| {
            let Some((&header, piece)) = plaintext.split_first() else {
                return Outcome::Failed;
            };
            let (kind, more) = match header {
                0 => (FrameKind::Text, false),
                1 => (FrameKind::Text, true),
                2 => (FrameKind::Binary, false),
                3 => (FrameKind::Binary, true),
                _ => return Outcome::Failed,
            };
            if more && piece.is_empty() {
                return Outcome::Failed;
            }
            let (mut bytes, open_kind) = frame.take().map_or((Vec::new(), kind), |(k, b)| (b, k));
            if open_kind != kind {
                return Outcome::Failed;
            }
            bytes.extend_from_slice(piece);
            let max = match kind {
                FrameKind::Text => limits.max_text,
                FrameKind::Binary => limits.max_binary,
            };
            if bytes.len() > max {
                return Outcome::TooLarge(kind);
            }
            if more {
                frame = Some((kind, bytes));
                return Outcome::Incomplete;
            }
            match kind {
                FrameKind::Text => match String::from_utf8(bytes) {
                    Ok(text) => Outcome::Frame(OpenedFrame::Text(text)),
                    Err(_) => Outcome::Failed,
                },
                FrameKind::Binary => Outcome::Frame(OpenedFrame::Binary(bytes)),
            }
        })();
        let last = !matches!(outcome, Outcome::Incomplete | Outcome::Frame(_));
        outcomes.push(outcome);
        if last {
            break;
        }
    }
    outcomes
}

/// A plaintext: a header byte, mostly a valid one, and a short piece
/// (bytes from a small alphabet with one non-ASCII, so that UTF-8 breaks
/// now and then).
fn plaintext() -> impl Strategy<Value = Vec<u8>> {
    let header = prop_oneof![8 => 0u8..4, 1 => any::<u8>()];
    let byte = prop_oneof![8 => b'a'..=b'e', 1 => Just(0xc3u8), 1 => Just(0xa9u8)];
    prop_oneof![
        1 => Just(Vec::new()),
        20 => (header, prop::collection::vec(byte, 0..12)).prop_map(|(h, mut piece)| {
            piece.insert(0, h);
            piece
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_frames_round_trip(frames in prop::collection::vec((kind(), frame_len(), any::<u8>()), 1..6)) {
        let (mut sealer, mut opener) = reused_device_to_vessel(ROOMY);
        for (kind, len, seed) in frames {
            let frame: Vec<u8> = (0..len).map(|i| b'!' + ((i + usize::from(seed)) % 90) as u8).collect();
            let records = sealer.seal(kind, &frame).unwrap();
            prop_assert_eq!(records.len(), len.div_ceil(MAX_PIECE).max(1));
            prop_assert_eq!(open_all(&mut opener, &records), opened(kind, &frame));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_opener_follows_the_model(plaintexts in prop::collection::vec(plaintext(), 1..12)) {
        let limits = RecordLimits { max_text: 20, max_binary: 15 };
        let expected = model(&plaintexts, limits);
        let (mut sealer, mut opener) = reused_device_to_vessel(limits);
        let mut got = Vec::new();
        for plaintext in &plaintexts {
            let record = sealer.seal_plaintext_for_vectors(plaintext).unwrap();
            let outcome = match opener.open(&record) {
                Ok(None) => Outcome::Incomplete,
                Ok(Some(frame)) => Outcome::Frame(frame),
                Err(OpenError::TooLarge { kind, .. }) => Outcome::TooLarge(kind),
                Err(_) => Outcome::Failed,
            };
            let last = !matches!(outcome, Outcome::Incomplete | Outcome::Frame(_));
            got.push(outcome);
            if last {
                // Everything after a failure is refused.
                let next = sealer.seal(FrameKind::Text, b"{}").unwrap();
                prop_assert!(matches!(
                    opener.open(&next[0]),
                    Err(OpenError::Channel(ChannelError::Closed))
                ));
                break;
            }
        }
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn random_bytes_never_open(messages in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 1..8)) {
        let (_, mut opener) = reused_device_to_vessel(ROOMY);
        for message in &messages {
            prop_assert!(opener.open(message).is_err());
        }
    }

    #[test]
    fn hex_reads_back(bytes in any::<[u8; 32]>(), text in ".{0,70}") {
        prop_assert_eq!(from_hex32(&to_hex32(&bytes)), Some(bytes));
        if let Some(read) = from_hex32(&text) {
            prop_assert_eq!(to_hex32(&read), text);
        }
    }

    #[test]
    fn codes_are_six_digits(h in any::<[u8; 32]>(), nd in any::<[u8; 32]>(), nv in any::<[u8; 32]>()) {
        let code = pairing_code(&h, &nd, &nv);
        prop_assert_eq!(code.len(), 6);
        prop_assert!(code.bytes().all(|b| b.is_ascii_digit()));
    }
}

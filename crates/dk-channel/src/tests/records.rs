//! The record layer: frames of every size both ways, limits checked before
//! more than them is held, and every failure (too long, no header, an
//! unknown header, an empty piece with more to follow, a kind switch,
//! invalid UTF-8, a replayed, reordered, altered, truncated or reflected
//! record), after which the opener refuses everything.

use std::{borrow::ToOwned, format, string::String, vec, vec::Vec};

use super::{ROOMY, assert_channel_failure, device_to_vessel, handshake, open_all, opened};
use crate::{
    FrameKind, MAX_MESSAGE, MAX_PIECE, OpenError, OpenedFrame, Opener, RecordLimits, Sealer,
};

/// A frame of `len` bytes that is valid UTF-8 (ASCII).
fn frame_of(len: usize) -> Vec<u8> {
    (0..len).map(|i| b'a' + (i % 26) as u8).collect()
}

#[track_caller]
fn check_round_trip(sealer: &mut Sealer, opener: &mut Opener, kind: FrameKind, len: usize) {
    let frame = frame_of(len);
    let records = sealer.seal(kind, &frame).unwrap();
    assert_eq!(records.len(), len.div_ceil(MAX_PIECE).max(1), "{len} bytes");
    assert!(records.iter().all(|r| r.len() <= MAX_MESSAGE));
    assert_eq!(
        open_all(opener, &records),
        opened(kind, &frame),
        "{len} bytes"
    );
}

#[test]
fn frames_of_every_size_round_trip_both_ways() {
    let (device, vessel) = handshake();
    let (mut device_sealer, mut device_opener) = device.split(ROOMY);
    let (mut vessel_sealer, mut vessel_opener) = vessel.split(ROOMY);
    let sizes = [
        0,
        1,
        200,
        MAX_PIECE - 1,
        MAX_PIECE,
        MAX_PIECE + 1,
        2 * MAX_PIECE,
        2 * MAX_PIECE + 1,
    ];
    for kind in [FrameKind::Text, FrameKind::Binary] {
        for len in sizes {
            check_round_trip(&mut device_sealer, &mut vessel_opener, kind, len);
            check_round_trip(&mut vessel_sealer, &mut device_opener, kind, len);
        }
    }
}

#[test]
fn an_empty_frame_is_one_record_of_its_header() {
    let (mut sealer, mut opener) = device_to_vessel(ROOMY);
    for kind in [FrameKind::Text, FrameKind::Binary] {
        let records = sealer.seal(kind, &[]).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].len(), 1 + 16);
        assert_eq!(opener.open(&records[0]).unwrap(), Some(opened(kind, &[])));
    }
}

#[test]
fn a_mebibyte_text_frame_takes_seventeen_records() {
    let (mut sealer, mut opener) = device_to_vessel(RecordLimits {
        max_text: 1 << 20,
        max_binary: 0,
    });
    let frame = frame_of(1 << 20);
    let records = sealer.seal(FrameKind::Text, &frame).unwrap();
    assert_eq!(records.len(), 17);
    assert_eq!(
        open_all(&mut opener, &records),
        opened(FrameKind::Text, &frame)
    );
}

/// UTF-8 is decoded over the whole frame: a character may straddle pieces.
#[test]
fn text_is_decoded_over_the_whole_frame() {
    let (mut sealer, mut opener) = device_to_vessel(ROOMY);
    let mut frame = frame_of(MAX_PIECE - 1);
    frame.extend_from_slice("é and more".as_bytes());
    let records = sealer.seal(FrameKind::Text, &frame).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(
        open_all(&mut opener, &records),
        OpenedFrame::Text(String::from_utf8(frame).unwrap())
    );
}

#[track_caller]
fn assert_too_large<T: std::fmt::Debug>(result: Result<T, OpenError>, kind: FrameKind, max: usize) {
    match result {
        Err(OpenError::TooLarge { kind: k, max: m }) if k == kind && m == max => {}
        other => panic!("expected {kind} frame over {max}, got {other:?}"),
    }
}

#[test]
fn limits_refuse_the_piece_that_crosses_them() {
    let limits = RecordLimits {
        max_text: 100_000,
        max_binary: 10,
    };
    // A frame at its limit passes.
    let (mut sealer, mut opener) = device_to_vessel(limits);
    let records = sealer.seal(FrameKind::Text, &frame_of(100_000)).unwrap();
    open_all(&mut opener, &records);
    let records = sealer.seal(FrameKind::Binary, &frame_of(10)).unwrap();
    open_all(&mut opener, &records);

    // One byte more: the first piece is held, the second crosses.
    let (mut sealer, mut opener) = device_to_vessel(limits);
    let records = sealer.seal(FrameKind::Text, &frame_of(100_001)).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(opener.open(&records[0]).unwrap(), None);
    assert_too_large(opener.open(&records[1]), FrameKind::Text, 100_000);
    // Refused for good.
    let next = sealer.seal(FrameKind::Text, b"{}").unwrap();
    assert_channel_failure(
        opener.open(&next[0]),
        "the channel failed earlier and refuses everything after",
    );

    // A one-record frame over its limit.
    let (mut sealer, mut opener) = device_to_vessel(limits);
    let records = sealer.seal(FrameKind::Binary, &frame_of(11)).unwrap();
    assert_too_large(opener.open(&records[0]), FrameKind::Binary, 10);

    // Each kind has its own limit.
    let (mut sealer, mut opener) = device_to_vessel(limits);
    let records = sealer.seal(FrameKind::Text, &frame_of(11)).unwrap();
    open_all(&mut opener, &records);
}

#[test]
fn limits_can_be_raised() {
    let (mut sealer, mut opener) = device_to_vessel(RecordLimits {
        max_text: 1000,
        max_binary: 0,
    });
    opener.set_limits(RecordLimits {
        max_text: 1000,
        max_binary: 200_000,
    });
    check_round_trip(&mut sealer, &mut opener, FrameKind::Binary, 200_000);
}

/// Records only a peer that breaks the rules would send, each refused as a
/// channel failure; each case is the plaintexts sealed in order and the
/// failure the last one causes.
#[test]
fn malformed_records_fail_the_channel() {
    let cases: [(&[&[u8]], &str); 10] = [
        (&[b""], "a record has no header byte"),
        (&[&[0x04, b'x']], "unknown record header 0x04"),
        (&[&[0xff]], "unknown record header 0xff"),
        (&[&[0x01]], "a piece with more to follow is empty"),
        (&[&[0x03]], "a piece with more to follow is empty"),
        (
            &[&[0x01, b'a'], &[0x01]],
            "a piece with more to follow is empty",
        ),
        (
            &[&[0x01, b'a'], &[0x02, b'b']],
            "a frame's pieces changed kind before it ended",
        ),
        (
            &[&[0x03, 1], &[0x00]],
            "a frame's pieces changed kind before it ended",
        ),
        (&[&[0x00, 0xff]], "a text frame is not UTF-8"),
        (&[&[0x01, 0xc3], &[0x00, b'a']], "a text frame is not UTF-8"),
    ];
    for (plaintexts, expected) in cases {
        let (mut sealer, mut opener) = device_to_vessel(ROOMY);
        let (last, first) = plaintexts.split_last().unwrap();
        for plaintext in first {
            let record = sealer.seal_plaintext_for_vectors(plaintext).unwrap();
            assert_eq!(opener.open(&record).unwrap(), None, "{expected}");
        }
        let record = sealer.seal_plaintext_for_vectors(last).unwrap();
        assert_channel_failure(opener.open(&record), expected);
        // And nothing after.
        let next = sealer.seal(FrameKind::Text, b"{}").unwrap();
        assert_channel_failure(
            opener.open(&next[0]),
            "the channel failed earlier and refuses everything after",
        );
    }
}

/// An empty last piece ends a frame: only pieces with more to follow must
/// carry a byte.
#[test]
fn an_empty_last_piece_ends_a_frame() {
    let (mut sealer, mut opener) = device_to_vessel(ROOMY);
    let first = sealer.seal_plaintext_for_vectors(&[0x03, 1, 2]).unwrap();
    let last = sealer.seal_plaintext_for_vectors(&[0x02]).unwrap();
    assert_eq!(opener.open(&first).unwrap(), None);
    assert_eq!(
        opener.open(&last).unwrap(),
        Some(OpenedFrame::Binary(vec![1, 2]))
    );
}

/// Messages that never decrypt: each case changes a good record, and is fed
/// to a fresh channel after `before` good records.
#[test]
fn records_that_do_not_decrypt_fail_the_channel() {
    type Change = fn(&[Vec<u8>]) -> Vec<u8>;
    let cases: [(&str, usize, Change); 9] = [
        ("replayed", 1, |r| r[0].clone()),
        ("reordered", 0, |r| r[1].clone()),
        ("flipped bit in the header", 0, |r| flip(&r[0], 0)),
        ("flipped bit in the piece", 0, |r| flip(&r[0], 5)),
        ("flipped bit in the tag", 0, |r| flip(&r[0], r[0].len() - 1)),
        ("truncated by one", 0, |r| r[0][..r[0].len() - 1].to_vec()),
        ("shorter than a tag", 0, |r| r[0][..15].to_vec()),
        ("empty", 0, |_| Vec::new()),
        ("extended by one", 0, |r| {
            let mut longer = r[0].clone();
            longer.push(0);
            longer
        }),
    ];
    for (what, before, change) in cases {
        let (mut sealer, mut opener) = device_to_vessel(ROOMY);
        let records: Vec<Vec<u8>> = (0..2)
            .flat_map(|i| {
                sealer
                    .seal(FrameKind::Text, format!("{{\"n\":{i}}}").as_bytes())
                    .unwrap()
            })
            .collect();
        for record in &records[..before] {
            assert!(opener.open(record).unwrap().is_some(), "{what}");
        }
        assert_channel_failure(
            opener.open(&change(&records)),
            "a message failed to decrypt",
        );
        // The good next record is refused too.
        assert_channel_failure(
            opener.open(&records[before]),
            "the channel failed earlier and refuses everything after",
        );
    }
}

fn flip(record: &[u8], at: usize) -> Vec<u8> {
    let mut flipped = record.to_vec();
    flipped[at] ^= 0x01;
    flipped
}

#[test]
fn records_over_the_noise_maximum_fail_the_channel() {
    let (_, mut opener) = device_to_vessel(ROOMY);
    assert_channel_failure(
        opener.open(&vec![0; MAX_MESSAGE + 1]),
        "a message of 65536 bytes is over the 65535 a Noise message may have",
    );
    let (_, mut opener) = device_to_vessel(ROOMY);
    assert_channel_failure(
        opener.open(&vec![0; MAX_MESSAGE]),
        "a message failed to decrypt",
    );
}

/// A side's own records, sent back to it, and another channel's records do
/// not decrypt.
#[test]
fn reflected_and_foreign_records_fail() {
    let (device, _) = handshake();
    let (mut sealer, mut opener) = device.split(ROOMY);
    let record = sealer.seal(FrameKind::Text, b"{}").unwrap();
    assert_channel_failure(opener.open(&record[0]), "a message failed to decrypt");

    let (mut sealer, _) = device_to_vessel(ROOMY);
    let (_, mut other) = device_to_vessel(ROOMY);
    let record = sealer.seal(FrameKind::Text, b"{}").unwrap();
    assert_channel_failure(other.open(&record[0]), "a message failed to decrypt");
}

/// The two halves are owned apart: a writer and a reader thread need no
/// lock between them.
#[test]
fn sealer_and_opener_work_on_their_own_threads() {
    fn is_send<T: Send>(_: &T) {}
    let (device, vessel) = handshake();
    let (mut device_sealer, _) = device.split(ROOMY);
    let (_, mut vessel_opener) = vessel.split(ROOMY);
    is_send(&device_sealer);
    is_send(&vessel_opener);
    let (records_in, records_out) = std::sync::mpsc::channel::<Vec<u8>>();
    let writer = std::thread::spawn(move || {
        for i in 0..100 {
            let frame = format!("{{\"n\":{i}}}");
            for record in device_sealer
                .seal(FrameKind::Text, frame.as_bytes())
                .unwrap()
            {
                records_in.send(record).unwrap();
            }
        }
    });
    let reader = std::thread::spawn(move || {
        let mut frames = Vec::new();
        for record in records_out {
            frames.extend(vessel_opener.open(&record).unwrap());
        }
        frames
    });
    writer.join().unwrap();
    let frames = reader.join().unwrap();
    assert_eq!(frames.len(), 100);
    assert_eq!(frames[99], OpenedFrame::Text("{\"n\":99}".to_owned()));
}

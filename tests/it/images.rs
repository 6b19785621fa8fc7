//! An image result through the whole vessel: a dk-device device over dk/2
//! answers with a screenshot-sized PNG in base64, as large as one frame can
//! carry, and the caller gets it whole; one byte of frame more and the
//! device answers that it cannot be sent instead (the connection stays
//! up); the audit log never holds the image.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use dk_device::{ClientOptions, Device, HandlerError};
use dk_proto::MAX_FRAME_BYTES;
use dk_vessel::Limits;
use serde_json::{Value, json};

use crate::net::{DeviceRun, start, temp_dir};

const TOOL: &str = "device__camera__screenshot";

/// `len` bytes that start as a PNG does and do not compress, the same for
/// the same `len`.
fn png_like(len: usize) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// The result of a screenshot of `len` bytes, as `dk device desktop` sends it.
fn screenshot(len: usize) -> Value {
    json!({
        "width": 1280,
        "height": 800,
        "image": {"type": "image", "mimeType": "image/png", "data": STANDARD.encode(png_like(len))},
        "blacked_out": 0
    })
}

/// A device whose `screenshot` answers with as many bytes of image as the
/// call's `bytes` says.
fn camera() -> Device {
    let manifest = json!({
        "id": "camera", "name": "Camera", "kind": "camera", "version": "1",
        "capabilities": [{
            "name": "screenshot", "kind": "sensor", "description": "A picture.",
            "params": {"bytes": {"type": "number", "required": true, "description": "its size"}}
        }]
    });
    Device::define(&manifest)
        .handler("screenshot", |input| async move {
            let len = input
                .get("bytes")
                .and_then(Value::as_u64)
                .ok_or_else(|| HandlerError::new("bytes must be a count"))?;
            Ok(screenshot(usize::try_from(len).unwrap()))
        })
        .build()
        .unwrap()
}

/// The most image bytes whose result frame fits [`MAX_FRAME_BYTES`]: the
/// frame around the result is the same length for every call id the
/// vessel makes.
fn largest_image() -> usize {
    let frame_without_data = json!({
        "type": "device:result",
        "callId": "00000000-0000-0000-0000-000000000000",
        "ok": true,
        "result": {
            "width": 1280, "height": 800,
            "image": {"type": "image", "mimeType": "image/png", "data": ""},
            "blacked_out": 0
        }
    })
    .to_string()
    .len();
    (MAX_FRAME_BYTES - frame_without_data) / 4 * 3
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_as_large_as_a_frame_carries_crosses_dk2_whole_and_one_larger_is_refused_by_the_device()
 {
    let running = start(Limits::default()).await;
    let dir = temp_dir();
    let options = ClientOptions::new(&running.device_url)
        .key_file(dir.path().join("camera.key"))
        .backoff(Duration::from_millis(20), Duration::from_millis(100));
    let run = DeviceRun::spawn(camera(), options);
    let prompt = running.approve_next(&["screenshot"]).await;
    assert_eq!(prompt["request"]["channel"], "dk/2", "{prompt}");
    running.wait_connected("camera").await;

    // Vessel call ids are UUIDs (36 characters), as the estimate assumes;
    // the largest image is about 768 KiB.
    let largest = largest_image();
    assert!((786_000..786_432).contains(&largest), "{largest}");
    for len in [70, largest - 2, largest] {
        let outcome = running.call(TOOL, json!({"bytes": len}), 10_000).await;
        assert_eq!(outcome["ok"], true, "{len}: {}", outcome["reason"]);
        assert_eq!(outcome["result"], screenshot(len), "{len}");
    }

    // Past the frame limit the device itself refuses to send it (the
    // vessel would count the frame malformed), and says why.
    let outcome = running
        .call(TOOL, json!({"bytes": largest + 3}), 10_000)
        .await;
    assert_eq!(outcome["ok"], false, "{outcome}");
    let reason = outcome["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("device error: the result of \"screenshot\" cannot be sent: "),
        "{reason}"
    );
    assert!(reason.len() < 300, "{reason}");
    assert!(running.vessel.links().is_connected("camera"));
    let outcome = running.call(TOOL, json!({"bytes": 70}), 10_000).await;
    assert_eq!(outcome["ok"], true, "{outcome}");

    // The audit log records the calls, never their results.
    running.vessel.flush_audit().unwrap();
    let audit = running
        .vessel
        .registry()
        .store()
        .read_audit(0, 1000)
        .unwrap();
    assert_eq!(audit.iter().filter(|e| e.kind == "decision").count(), 5);
    for entry in &audit {
        let size = entry.entry.to_string().len();
        assert!(size < 4096, "{} entry of {size} bytes", entry.kind);
    }
    run.stop().await.unwrap();
    running.stop().await;
}

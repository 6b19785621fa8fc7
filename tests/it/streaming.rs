//! Streaming devices end to end: dk-device's voice satellite and desktop
//! bridge, with their stream queues, against a real vessel on loopback that
//! admits them from a configuration file's policy.

use std::time::Duration;

use dk_device::samples::{Desktop, VOICE_FRAME_BYTES, Voice};
use dk_device::{ClientOptions, stream_channel};
use dk_vessel::{Limits, config::VesselConfig};
use serde_json::json;

use crate::net::{DeviceRun, start};

const CONFIG: &str = "[streaming.voice]\nenabled = true\nrequireApproval = false\n\
                      sandbox = \"s\"\n[streaming.voice.limits]\nmaxChunkBytes = 4096\n\
                      [streaming.desktop-control]\nenabled = true\nrequireApproval = false\n\
                      sandbox = \"vm\"\n[streaming.desktop-control.limits]\n\
                      maxChunkBytes = 65536\n";

#[tokio::test]
async fn the_voice_satellite_pairs_streams_pcm_and_answers_calls() {
    let running = start(Limits::default()).await;
    running
        .vessel
        .set_streaming(VesselConfig::parse(CONFIG).unwrap().streaming);
    let mut audio = running.vessel.subscribe_stream("kitchen-voice");
    let voice = Voice::new();
    let (chunks, outbox) = stream_channel(8);
    let options = ClientOptions::new(running.device_url.clone()).streams(outbox);
    let device = DeviceRun::spawn(voice.device(), options);
    running
        .approve_next(&["microphone", "read_status", "set_volume"])
        .await;
    running.wait_connected("kitchen-voice").await;
    // Frames queued now go out once the vessel has admitted the session.
    for index in 0..3 {
        chunks.try_send("microphone", voice.frame(index)).unwrap();
    }
    for index in 0..3 {
        let event = audio.recv().await.unwrap();
        assert!(event.verdict().accepted());
        assert_eq!(event.seq(), index);
        assert_eq!(event.payload(), voice.frame(index).as_slice());
        assert_eq!(event.payload().len(), VOICE_FRAME_BYTES);
    }
    // Calls go through grants as for any device.
    let answer = running
        .call(
            "device__kitchen_voice__set_volume",
            json!({"volume": 20}),
            5000,
        )
        .await;
    assert_eq!(answer, json!({"ok": true, "result": {"volume": 20}}));
    assert_eq!(voice.state().volume, 20.0);
    let refused = running
        .call("device__kitchen_voice__speak", json!({"text": "hi"}), 5000)
        .await;
    assert_eq!(
        refused["reason"],
        json!("[8dk-deny] capability \"speak\" on \"kitchen-voice\" is not granted")
    );
    assert_eq!(running.vessel.stream_sessions("kitchen-voice"), 1);
    device.stop().await.unwrap();
    running.stop().await;
}

#[tokio::test]
async fn the_desktop_bridge_streams_screenshots_and_its_clicks_ask_the_person() {
    let running = start(Limits::default()).await;
    running
        .vessel
        .set_streaming(VesselConfig::parse(CONFIG).unwrap().streaming);
    let mut screen = running.vessel.subscribe_stream("office-desktop");
    // 128 x 96 RGBA: 49,152 bytes, under the 64 KiB cap.
    let desktop = Desktop::new(128, 96);
    let (chunks, outbox) = stream_channel(4);
    let options = ClientOptions::new(running.device_url.clone()).streams(outbox);
    let device = DeviceRun::spawn(desktop.device(), options);
    running.approve_next(&["screen", "click"]).await;
    running.wait_connected("office-desktop").await;
    chunks.try_send("screen", desktop.screenshot(0)).unwrap();
    let event = screen.recv().await.unwrap();
    assert_eq!(event.payload().len(), 128 * 96 * 4);

    // click is confirm: the person is asked, and a no stops it.
    let admin = &running.admin;
    let call = running.call("device__office_desktop__click", json!({}), 5000);
    let answer = async {
        let prompt = running.next_approval().await;
        let id = prompt["id"].as_u64().unwrap();
        let answered = admin
            .post(
                &format!("/v1/pending/{id}/approval"),
                &json!({"approved": false}),
            )
            .await
            .unwrap();
        assert_eq!(answered.status, 204);
    };
    let (outcome, ()) = tokio::join!(call, answer);
    assert_eq!(
        outcome["reason"],
        json!("[policy] the person said no: \"click\" on Office desktop bridge asks every time")
    );
    assert_eq!(desktop.state().clicks, 0);
    device.stop().await.unwrap();
    running.stop().await;
}

#[tokio::test]
async fn a_streaming_device_the_vessel_does_not_admit_stops_with_the_reason() {
    // No configuration: voice is disabled by default.
    let running = start(Limits::default()).await;
    let voice = Voice::new();
    let options = ClientOptions::new(running.device_url.clone())
        .backoff(Duration::from_millis(10), Duration::from_millis(20));
    let device = DeviceRun::spawn(voice.device(), options);
    let ended = tokio::time::timeout(Duration::from_secs(30), device.ended())
        .await
        .unwrap();
    let error = ended.unwrap_err().to_string();
    assert_eq!(
        error,
        "the vessel refused the streaming session: ERR_PRISM_DEVICE_DISABLED: voice device is disabled by default"
    );
    assert!(running.vessel.person().pending().is_empty());
    running.stop().await;
}

#[tokio::test]
async fn the_admin_api_watches_a_stream_by_its_metadata() {
    let running = start(Limits::default()).await;
    running
        .vessel
        .set_streaming(VesselConfig::parse(CONFIG).unwrap().streaming);
    let voice = Voice::new();
    let (chunks, outbox) = stream_channel(8);
    let options = ClientOptions::new(running.device_url.clone()).streams(outbox);
    let device = DeviceRun::spawn(voice.device(), options);
    running.approve_next(&["microphone"]).await;
    running.wait_connected("kitchen-voice").await;
    let mut watch = Box::pin(
        running
            .admin
            .get("/v1/streams/kitchen-voice?max=2&waitMs=60000"),
    );
    // Frames until the watch has seen two (it may subscribe after the first).
    let mut index = 0;
    let answer = loop {
        tokio::select! {
            answer = &mut watch => break answer.unwrap(),
            // Paces the frames: one every 20 ms, as a microphone gives them.
            () = tokio::time::sleep(Duration::from_millis(20)) => {
                let _ = chunks.try_send("microphone", voice.frame(index));
                index += 1;
            }
        }
    };
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body["deviceId"], json!("kitchen-voice"));
    let seen = answer.body["chunks"].as_array().unwrap();
    assert_eq!(seen.len(), 2);
    for chunk in seen {
        assert_eq!(chunk["stream"], json!("microphone"));
        assert_eq!(chunk["accepted"], json!(true));
        assert_eq!(chunk["bytes"], json!(VOICE_FRAME_BYTES));
        assert!(chunk.get("payload").is_none());
    }
    drop(watch);
    device.stop().await.unwrap();
    running.stop().await;
}

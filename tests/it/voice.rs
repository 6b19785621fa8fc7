//! The voice device (dk-voice) against a real vessel on loopback and a
//! PulseAudio server of the test's own: an agent's `listen` asks the
//! person in the console (headless Chromium), which names the agent and
//! for how long; while the microphone is open every page shows it, the
//! status lists it and agents hear it; the person's Stop ends the capture
//! within 100 ms, measured on the sound the agent gets (the microphone
//! hears another tone from the moment of the click). `listen_stream`
//! delivers its chunks in order and without gaps under the voice
//! admission caps, a chunk over the cap is dropped with the marker, and a
//! second session is refused while one runs.

use std::time::Duration;

use base64::Engine as _;
use dk_device::{ClientOptions, ServeOptions, stream_channel};
use dk_testkit::pulse::{Feed, MIC_SOURCE, Pulse, SPEAKER_SINK, pulse_or_skip, tone_hz};
use dk_vessel::{Limits, config::VesselConfig};
use dk_voice::audio::{self, RATE};
use dk_voice::{Endpoints, Voice, VoiceConfig};
use fantoccini::Locator;
use serde_json::{Value, json};

use crate::browser::{self, Browser};
use crate::net::{DeviceRun, Running, start, temp_dir};

/// The voice kind admitted, with chunks of at most 4 KiB (100 ms of sound
/// is 3,200 bytes; 200 ms, 6,400, is over the cap and under twice it).
const CONFIG: &str = "[streaming.voice]\nenabled = true\nrequireApproval = false\n\
                      sandbox = \"s\"\n[streaming.voice.limits]\nmaxChunkBytes = 4096\n";

const ALL: [&str; 5] = ["listen", "listen_stream", "say", "play", "stop"];
const LISTEN: &str = "device__voice__listen";
const STREAM: &str = "device__voice__listen_stream";

/// The tone the microphone hears until the stop, and the one after it.
const BEFORE: f64 = 440.0;
const AFTER: f64 = 880.0;

/// A voice device served to `running` by dk-device's client, paired with
/// every capability and connected.
struct Served {
    voice: Voice,
    /// The device's stream queue, for the chunks it dropped.
    chunks: dk_device::StreamSender,
    run: DeviceRun,
    _dir: tempfile::TempDir,
}

async fn serve(running: &Running, pulse: &Pulse) -> Served {
    running
        .vessel
        .set_streaming(VesselConfig::parse(CONFIG).unwrap().streaming);
    let voice = Voice::new(VoiceConfig {
        endpoints: Endpoints {
            server: Some(pulse.server()),
            source: Some(MIC_SOURCE.to_owned()),
            sink: Some(SPEAKER_SINK.to_owned()),
        },
        ..VoiceConfig::default()
    })
    .unwrap();
    let device = voice.device().clone();
    let (events, receiver) = device.events(16);
    voice.set_events(events);
    let (chunks, outbox) = stream_channel(64);
    voice.set_stream(chunks.clone());
    let dir = temp_dir();
    let options = ClientOptions::new(running.device_url.clone())
        .key_file(dir.path().join("voice.key"))
        .serve(ServeOptions::new().events(receiver))
        .streams(outbox);
    let run = DeviceRun::spawn(device, options);
    running.approve_next(&ALL).await;
    running.wait_connected("voice").await;
    Served {
        voice,
        chunks,
        run,
        _dir: dir,
    }
}

/// The open approval's id once one waits, through the admin API.
async fn approve_next(running: &Running) -> Value {
    let prompt = running.next_approval().await;
    let id = prompt["id"].as_u64().unwrap();
    let answer = running
        .admin
        .post(
            &format!("/v1/pending/{id}/approval"),
            &json!({"approved": true}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 204, "{}", answer.body);
    prompt
}

fn samples_of(result: &Value) -> Vec<i16> {
    let data = result["audio"]["data"].as_str().unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    audio::read_wav(&bytes, 60).unwrap()
}

/// The rising zero crossings of `samples`, placed between samples.
fn crossings(samples: &[i16]) -> Vec<f64> {
    samples
        .windows(2)
        .enumerate()
        .filter_map(|(i, pair)| {
            let (a, b) = (f64::from(pair[0]), f64::from(pair[1]));
            (a < 0.0 && b >= 0.0).then(|| i as f64 + (-a) / (b - a))
        })
        .collect()
}

/// How much of the end of `samples` comes after the last cycle of
/// `BEFORE`: the sound heard after the switch to `AFTER`, counted from the
/// end of the last cycle of the first tone (silence after it counts too).
fn after_the_switch(samples: &[i16]) -> Duration {
    let period = f64::from(RATE) / BEFORE;
    let found = crossings(samples);
    let last_before = found
        .windows(2)
        .rev()
        .find(|pair| ((pair[1] - pair[0]) - period).abs() <= period * 0.1)
        .map_or(0.0, |pair| pair[1]);
    let samples_after = (samples.len() as f64 - last_before).max(0.0);
    Duration::from_secs_f64(samples_after / f64::from(RATE))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_persons_stop_in_the_console_ends_listen_within_100_ms_of_sound() {
    const TEST: &str = "the_persons_stop_in_the_console_ends_listen_within_100_ms_of_sound";
    let Some(binary) = pulse_or_skip(TEST) else {
        return;
    };
    if dk_testkit::peer_or_skip(
        TEST,
        "chromium and chromium-driver",
        browser::installed().then_some(()),
    )
    .is_none()
    {
        return;
    }
    let pulse = Pulse::start(&binary);
    let running = start(Limits::default()).await;
    let served = serve(&running, &pulse).await;
    let mut events = running.vessel.subscribe_events();
    // The microphone hears the first tone, from a feed that keeps 20 ms in
    // the server, so a switch is heard within it.
    let feed = Feed::start(&pulse, Duration::from_millis(20));
    feed.tone(BEFORE, 12_000);

    let browser = Browser::start(390, 844).await;
    let c = &browser.client;
    c.goto(&running.console.login_link().unwrap())
        .await
        .unwrap();
    browser.wait_text("h1", "Waiting for you").await;

    // The agent asks to listen: the card names it and for how long.
    let call = running.agent_call(LISTEN, json!({"max_seconds": 20}), Duration::from_secs(40));
    let card = browser.wait_text(".prompt.approval", "kitchen").await;
    let text = card.text().await.unwrap();
    assert!(
        text.contains("Agent kitchen asks to use voice: listen"),
        "{text}"
    );
    assert!(
        text.contains("opens the microphone for at most 20 s"),
        "{text}"
    );
    assert!(
        text.contains("remembered only where one of your rules allows the call explicitly"),
        "{text}"
    );
    card.find(Locator::Css("button[value=\"once\"]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();

    // Live: the banner on the page, the status, and the event agents read.
    let banner = browser
        .wait_text("#microphones .mic", "Microphone live on voice")
        .await;
    let shown = banner.text().await.unwrap();
    assert!(shown.contains("(listen, at most 20 s, since"), "{shown}");
    browser.screenshot("phone-microphone-live").await;
    let status = running.admin.get("/v1/status").await.unwrap().body;
    assert_eq!(status["microphones"][0]["deviceId"], json!("voice"));
    assert_eq!(status["microphones"][0]["maxSeconds"], json!(20));
    // Some of the first tone is recorded before the stop: 600 ms of sound
    // the device took from the microphone (on a loaded machine the banner,
    // shown once the call holds the microphone, can come well before).
    dk_testkit::eventually("the microphone open", || {
        served.voice.live().borrow().is_some()
    })
    .await;
    dk_testkit::eventually("600 ms of the first tone recorded", || {
        served.voice.recorded_ms() >= 600
    })
    .await;

    // The person presses Stop, and at that moment the microphone starts
    // to hear the second tone.
    let stop = c
        .find(Locator::Css("#microphones button.stop"))
        .await
        .unwrap();
    feed.tone(AFTER, 12_000);
    let feed_latency = feed.latency();
    stop.click().await.unwrap();
    let outcome = call.await.unwrap();
    assert_eq!(outcome["ok"], json!(true), "{outcome}");
    let result = &outcome["result"];
    assert_eq!(result["ended"], json!("stopped"), "{result}");
    let sound = samples_of(result);
    assert_eq!(
        result["duration_ms"],
        json!(audio::duration_ms(sound.len()))
    );
    let first = tone_hz(&sound[..sound.len() / 2], RATE, 1000).unwrap();
    assert!((first - BEFORE).abs() <= BEFORE * 0.02, "{first} Hz");
    // What reached the agent ends at most 100 ms after the click, on the
    // microphone's own time: the second tone it holds, plus what the feed
    // held in the server when it switched.
    let after = after_the_switch(&sound);
    assert!(
        after + feed_latency <= Duration::from_millis(100),
        "{} ms of the second tone reached the agent, the feed {} ms behind",
        after.as_millis(),
        feed_latency.as_millis()
    );
    eprintln!(
        "stop: {} ms of sound after the click reached the agent (the feed {} ms behind)",
        after.as_millis(),
        feed_latency.as_millis()
    );

    // The banner goes, the status empties, and agents heard it open and
    // close.
    browser.wait_gone("#microphones .mic").await;
    dk_testkit::eventually_async("no microphone in the status", || async {
        running.admin.get("/v1/status").await.unwrap().body["microphones"]
            .is_null()
            .then_some(())
    })
    .await;
    let mut said = Vec::new();
    while let Ok(event) = events.try_recv() {
        if event.device_id == "voice" {
            let data: Value = serde_json::from_str(event.data.unwrap().get()).unwrap();
            said.push((
                event.capability,
                data["microphone"].clone(),
                data["ended"].clone(),
            ));
        }
    }
    assert_eq!(
        said,
        [
            ("listen".to_owned(), json!("live"), Value::Null),
            ("listen".to_owned(), json!("off"), json!("stopped")),
        ]
    );
    browser.quit().await;
    drop(feed);
    served.run.stop().await.unwrap();
    running.stop().await;
}

/// The next chunk the vessel forwards (or drops), within the patience.
async fn next_chunk(
    chunks: &mut dk_core::stream::StreamSubscription,
) -> dk_core::stream::StreamEvent {
    tokio::time::timeout(dk_testkit::PATIENCE, chunks.recv())
        .await
        .expect("no chunk within the patience")
        .expect("the stream's subscription ended")
}

/// The frequency of the tone in `pcm`, from the median length of its
/// cycles (a stretch of silence, as when the feed ran dry, does not move
/// it).
fn median_hz(pcm: &[i16]) -> f64 {
    let found = crossings(pcm);
    let mut cycles: Vec<f64> = found.windows(2).map(|pair| pair[1] - pair[0]).collect();
    cycles.sort_by(f64::total_cmp);
    f64::from(RATE) / cycles[cycles.len() / 2]
}

/// Where the cycles of a tone of `hz` in `pcm` jump without a pause: a
/// cycle much longer or shorter than the tone's with no silence inside it
/// (silence is the feed running dry on a busy machine, heard as such; a
/// chunk lost or doubled on the way is a jump in the middle of sound).
fn jumps(pcm: &[i16], hz: f64) -> Vec<usize> {
    let period = f64::from(RATE) / hz;
    let found = crossings(pcm);
    found
        .windows(2)
        .filter(|pair| ((pair[1] - pair[0]) - period).abs() > period * 0.1)
        .map(|pair| pair[0] as usize)
        .filter(|&at| {
            let end = (at + (2.0 * period) as usize).min(pcm.len());
            let quiet = pcm[at..end]
                .windows(16)
                .any(|run| run.iter().all(|s| s.unsigned_abs() < 200));
            !quiet
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_stream_delivers_every_chunk_in_order_under_the_caps() {
    let Some(binary) = pulse_or_skip("listen_stream_delivers_every_chunk_in_order_under_the_caps")
    else {
        return;
    };
    let pulse = Pulse::start(&binary);
    let running = start(Limits::default()).await;
    let served = serve(&running, &pulse).await;
    let mut chunks = running.vessel.subscribe_stream("voice");
    // 437 Hz: a lost 100 ms chunk would jump its phase by 0.7 of a cycle.
    let hz = 437.0;
    let feed = Feed::start(&pulse, Duration::from_millis(200));
    feed.tone(hz, 12_000);

    let call = running.agent_call(
        STREAM,
        json!({"max_seconds": 2, "chunk_ms": 100}),
        Duration::from_secs(20),
    );
    let asked = approve_next(&running).await;
    assert_eq!(asked["request"]["microphone"], json!({"maxSeconds": 2}));
    let outcome = call.await.unwrap();
    assert_eq!(
        outcome["result"],
        json!({"stream": "listen_stream", "format": "pcm_s16le", "rate": 16000,
               "channels": 1, "chunk_ms": 100, "max_seconds": 2}),
        "{outcome}"
    );
    // A second session while this one runs is refused by the device.
    let second = running.agent_call(STREAM, json!({"max_seconds": 2}), Duration::from_secs(20));
    approve_next(&running).await;
    let second = second.await.unwrap();
    assert_eq!(second["ok"], json!(false), "{second}");
    assert!(
        second["reason"]
            .as_str()
            .unwrap()
            .ends_with("the microphone is already open (listen_stream): one recording at a time"),
        "{second}"
    );

    // Two seconds in chunks of 100 ms: 20 chunks, numbered in order, each
    // whole, the tone running through them without a jump.
    let mut pcm = Vec::new();
    let mut seqs = Vec::new();
    for _ in 0..20 {
        let chunk = next_chunk(&mut chunks).await;
        assert!(chunk.verdict().accepted(), "{:?}", chunk.verdict());
        assert_eq!(chunk.stream(), "listen_stream");
        assert_eq!(chunk.payload().len(), 3200);
        assert_eq!(chunk.lost_before(), 0);
        seqs.push(chunk.seq());
        pcm.extend(audio::samples(chunk.payload()));
    }
    let first = seqs[0];
    assert_eq!(seqs, (first..first + 20).collect::<Vec<_>>());
    let heard = median_hz(&pcm);
    assert!((heard - hz).abs() <= hz * 0.02, "{heard} Hz");
    let loud_from = pcm.iter().position(|s| s.unsigned_abs() > 4000).unwrap();
    let jumped = jumps(&pcm[loud_from..], hz);
    assert!(jumped.is_empty(), "the tone jumps at samples {jumped:?}");
    dk_testkit::eventually("the session over", || {
        served.voice.live().borrow().is_none()
    })
    .await;
    assert_eq!(served.chunks.dropped(), 0);

    // Chunks of 200 ms (6,400 bytes) are over the cap the vessel admitted
    // the device with: the device drops each before sending it (and counts
    // it), nothing is forwarded, and the device stays connected.
    let call = running.agent_call(
        STREAM,
        json!({"max_seconds": 1, "chunk_ms": 200}),
        Duration::from_secs(20),
    );
    approve_next(&running).await;
    assert_eq!(call.await.unwrap()["ok"], json!(true));
    dk_testkit::eventually("five chunks dropped", || served.chunks.dropped() == 5).await;
    dk_testkit::eventually("the session over", || {
        served.voice.live().borrow().is_none()
    })
    .await;
    assert!(running.vessel.links().is_connected("voice"));

    // A session that ends at silence: the tone, then quiet for the
    // hangover. The last chunk holds what was heard up to the end.
    feed.silence();
    let call = running.agent_call(
        STREAM,
        json!({"max_seconds": 10, "chunk_ms": 100, "end_at_silence": true}),
        Duration::from_secs(20),
    );
    let mut events = running.vessel.subscribe_events();
    approve_next(&running).await;
    assert_eq!(call.await.unwrap()["ok"], json!(true));
    dk_testkit::eventually("the microphone open", || {
        served.voice.live().borrow().is_some()
    })
    .await;
    dk_testkit::eventually("the device recording from the microphone", || {
        served.voice.recorded_ms() > 0
    })
    .await;
    feed.play(&dk_testkit::pulse::tone(hz, 600, RATE, 12_000));
    let ended = loop {
        let event = tokio::time::timeout(dk_testkit::PATIENCE, events.recv())
            .await
            .unwrap()
            .unwrap();
        let data: Value = serde_json::from_str(event.data.unwrap().get()).unwrap();
        if data["microphone"] == json!("off") {
            break data;
        }
    };
    assert_eq!(ended["ended"], json!("silence"), "{ended}");
    let mut heard = Vec::new();
    while let Ok(Some(chunk)) = tokio::time::timeout(Duration::from_millis(10), chunks.recv()).await
    {
        heard.extend(audio::samples(chunk.payload()));
    }
    assert_eq!(ended["duration_ms"], json!(audio::duration_ms(heard.len())));
    let quiet_tail = heard
        .iter()
        .rev()
        .take_while(|s| s.unsigned_abs() < 1000)
        .count();
    let hangover = dk_voice::vad::DEFAULT_HANGOVER;
    let tail = Duration::from_millis(audio::duration_ms(quiet_tail));
    assert!(
        tail >= hangover && tail <= hangover + Duration::from_millis(40),
        "{} ms of quiet at the end",
        tail.as_millis()
    );

    // The agent's stop ends a session at once.
    feed.tone(hz, 12_000);
    let call = running.agent_call(STREAM, json!({"max_seconds": 60}), Duration::from_secs(20));
    approve_next(&running).await;
    assert_eq!(call.await.unwrap()["ok"], json!(true));
    next_chunk(&mut chunks).await;
    let stopped = running.call("device__voice__stop", json!({}), 5000).await;
    assert_eq!(
        stopped,
        json!({"ok": true, "result": {"microphone": true, "speaker": false}})
    );
    dk_testkit::eventually("the session stopped", || {
        served.voice.live().borrow().is_none()
    })
    .await;
    drop(feed);
    served.run.stop().await.unwrap();
    running.stop().await;
}

/// A chunk over the cap that reaches the vessel on the voice device's
/// stream (from a device that does not hold it back: a raw v1 socket with
/// the same manifest but its id) is dropped with the marker, the device
/// told; one at the cap is forwarded.
#[tokio::test]
async fn a_listen_stream_chunk_over_the_cap_is_dropped_with_the_marker() {
    let running = start(Limits::default()).await;
    running
        .vessel
        .set_streaming(VesselConfig::parse(CONFIG).unwrap().streaming);
    let voice = Voice::new(VoiceConfig {
        id: "raw-voice".to_owned(),
        ..VoiceConfig::default()
    })
    .unwrap();
    let manifest: Value = serde_json::from_str(&voice.device().manifest().to_json()).unwrap();
    let mut chunks = running.vessel.subscribe_stream("raw-voice");
    let mut socket = crate::net::pair_raw(&running, manifest, &["listen_stream"]).await;
    let admitted = crate::net::next(&mut socket).await.unwrap().unwrap();
    assert_eq!(admitted["type"], json!("device:streaming"), "{admitted}");
    let chunk = |seq: u64, len: usize| {
        tokio_tungstenite::tungstenite::Message::binary(
            dk_proto::StreamChunk {
                stream: "listen_stream",
                seq,
                payload: &vec![7u8; len],
            }
            .encode()
            .unwrap(),
        )
    };
    use futures::SinkExt as _;
    socket.send(chunk(0, 4097)).await.unwrap();
    let told = crate::net::next(&mut socket).await.unwrap().unwrap();
    assert_eq!(
        told,
        json!({"stream": "listen_stream", "seq": 0, "accepted": false, "bytes": 4097,
               "marker": "dropped_oversize", "type": "device:stream-dropped"})
    );
    let dropped = next_chunk(&mut chunks).await;
    assert_eq!(dropped.verdict().marker(), Some("dropped_oversize"));
    assert!(dropped.payload().is_empty());
    socket.send(chunk(1, 4096)).await.unwrap();
    let forwarded = next_chunk(&mut chunks).await;
    assert!(forwarded.verdict().accepted());
    assert_eq!((forwarded.seq(), forwarded.payload().len()), (1, 4096));
    running.stop().await;
}

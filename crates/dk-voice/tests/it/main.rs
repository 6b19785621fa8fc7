//! The voice device against a real PulseAudio server of the test's own
//! (dk-testkit's `pulse`): a tone played into the microphone's sink is
//! what `listen` returns, speech and played sound reach the speaker's
//! monitor, a stop ends a recording, bad input and a source that goes
//! away are refused clearly and the device goes on.

// Test code throughout: the lint wall's test allowances apply to all of it.
#![cfg(test)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine as _;
use dk_testkit::pulse::{
    MIC_SINK, MIC_SOURCE, Pulse, SPEAKER_MONITOR, SPEAKER_SINK, pulse_or_skip, tone, tone_hz,
};
use dk_voice::audio::{self, RATE};
use dk_voice::vad::DEFAULT_HANGOVER;
use dk_voice::{Endpoints, Voice, VoiceConfig};
use libpulse_binding::sample::{Format, Spec};
use libpulse_binding::stream::Direction;
use libpulse_simple_binding::Simple;
use serde_json::{Map, Value, json};

fn spec() -> Spec {
    Spec {
        format: Format::S16le,
        channels: 1,
        rate: RATE,
    }
}

fn voice(pulse: &Pulse) -> Voice {
    let config = VoiceConfig {
        endpoints: Endpoints {
            server: Some(pulse.server()),
            source: Some(MIC_SOURCE.to_owned()),
            sink: Some(SPEAKER_SINK.to_owned()),
        },
        ..VoiceConfig::default()
    };
    Voice::new(config).unwrap()
}

fn input(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// Plays `sound` into the microphone's sink on a thread, then silence
/// until `done` is set.
fn feed(pulse: &Pulse, sound: Vec<i16>, done: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let server = pulse.server();
    std::thread::spawn(move || {
        let out = Simple::new(
            Some(&server),
            "test",
            Direction::Playback,
            Some(MIC_SINK),
            "feed",
            &spec(),
            None,
            None,
        )
        .unwrap();
        for piece in sound.chunks(320) {
            out.write(&audio::pcm(piece)).unwrap();
        }
        let quiet = vec![0u8; 640];
        while !done.load(Ordering::Relaxed) {
            if out.write(&quiet).is_err() {
                break;
            }
        }
    })
}

/// Records the speaker's monitor on a thread until `done` is set.
fn record(pulse: &Pulse, done: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<i16>> {
    let server = pulse.server();
    std::thread::spawn(move || {
        let input = Simple::new(
            Some(&server),
            "test",
            Direction::Record,
            Some(SPEAKER_MONITOR),
            "record",
            &spec(),
            None,
            None,
        )
        .unwrap();
        let mut got = Vec::new();
        let mut bytes = vec![0u8; 640];
        while !done.load(Ordering::Relaxed) {
            if input.read(&mut bytes).is_err() {
                break;
            }
            got.extend(audio::samples(&bytes));
        }
        got
    })
}

fn wav_of(result: &Value) -> Vec<i16> {
    let data = result["audio"]["data"].as_str().unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    audio::read_wav(&bytes, 60).unwrap()
}

fn loud(samples: &[i16]) -> Vec<i16> {
    samples
        .iter()
        .copied()
        .skip_while(|s| s.unsigned_abs() < 1000)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tone_is_heard_and_silence_ends_listen() {
    let Some(binary) = pulse_or_skip("a_tone_is_heard_and_silence_ends_listen") else {
        return;
    };
    let pulse = Pulse::start(&binary);
    let voice = voice(&pulse);
    let done = Arc::new(AtomicBool::new(false));
    let feeder = feed(&pulse, tone(440.0, 1500, RATE, 12_000), Arc::clone(&done));
    let result = voice
        .device()
        .invoke("listen", input(json!({"max_seconds": 10})))
        .await
        .unwrap();
    done.store(true, Ordering::Relaxed);
    feeder.join().unwrap();
    assert_eq!(result["audio"]["type"], "audio");
    assert_eq!(result["audio"]["mimeType"], "audio/wav");
    assert_eq!(result["ended"], "silence", "{result}");
    let sound = wav_of(&result);
    let heard = loud(&sound);
    let hz = tone_hz(&heard, RATE, 1000).unwrap();
    assert!((hz - 440.0).abs() <= 440.0 * 0.02, "{hz} Hz");
    // The recording ends the hangover after the tone, to the frame.
    let quiet_tail = sound
        .iter()
        .rev()
        .take_while(|s| s.unsigned_abs() < 1000)
        .count();
    let tail_ms = audio::duration_ms(quiet_tail);
    let hangover = DEFAULT_HANGOVER.as_millis() as u64;
    assert!(
        (hangover..=hangover + 2 * u64::from(audio::FRAME_MS)).contains(&tail_ms),
        "{tail_ms} ms of quiet at the end"
    );
    assert_eq!(
        result["duration_ms"],
        json!(audio::duration_ms(sound.len()))
    );
    assert!(result["level_dbfs"].as_f64().unwrap() > -30.0, "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn say_and_play_reach_the_speaker() {
    let Some(binary) = pulse_or_skip("say_and_play_reach_the_speaker") else {
        return;
    };
    let pulse = Pulse::start(&binary);
    let voice = voice(&pulse);
    let done = Arc::new(AtomicBool::new(false));
    let recorder = record(&pulse, Arc::clone(&done));
    let said = voice
        .device()
        .invoke("say", input(json!({"text": "hello"})))
        .await
        .unwrap();
    done.store(true, Ordering::Relaxed);
    let heard = recorder.join().unwrap();
    assert!(said["spoken_ms"].as_u64().unwrap() > 200, "{said}");
    // Speech: a tenth of a second at least well above silence.
    let loudest = heard
        .chunks(1600)
        .map(audio::level_dbfs)
        .fold(audio::FLOOR_DBFS, f64::max);
    assert!(loudest > -30.0, "loudest 100 ms at {loudest} dBFS");

    // A tone sent as a WAV at another rate, in stereo, comes back whole.
    let sound = tone(523.0, 1000, 44_100, 10_000);
    let stereo: Vec<i16> = sound.iter().flat_map(|&s| [s, s]).collect();
    let mut file = audio::wav(&[]);
    file.truncate(audio::WAV_HEADER);
    let data_len = (stereo.len() * 2) as u32;
    file[4..8].copy_from_slice(&(data_len + 36).to_le_bytes());
    file[22..24].copy_from_slice(&2u16.to_le_bytes());
    file[24..28].copy_from_slice(&44_100u32.to_le_bytes());
    file[28..32].copy_from_slice(&(44_100u32 * 4).to_le_bytes());
    file[32..34].copy_from_slice(&4u16.to_le_bytes());
    file[40..44].copy_from_slice(&data_len.to_le_bytes());
    file.extend(audio::pcm(&stereo));
    let done = Arc::new(AtomicBool::new(false));
    let recorder = record(&pulse, Arc::clone(&done));
    let played = voice
        .device()
        .invoke(
            "play",
            input(json!({"audio": base64::engine::general_purpose::STANDARD.encode(&file)})),
        )
        .await
        .unwrap();
    done.store(true, Ordering::Relaxed);
    let heard = loud(&recorder.join().unwrap());
    assert_eq!(played["of_ms"], 1000, "{played}");
    let hz = tone_hz(&heard, RATE, 1000).unwrap();
    assert!((hz - 523.0).abs() <= 523.0 * 0.02, "{hz} Hz");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_listen_and_bad_input_is_refused() {
    let Some(binary) = pulse_or_skip("a_stop_ends_listen_and_bad_input_is_refused") else {
        return;
    };
    let pulse = Pulse::start(&binary);
    let voice = voice(&pulse);
    let device = voice.device().clone();
    let refused = |result: Result<Value, dk_device::CallError>| match result {
        Err(e) => e.to_string(),
        Ok(v) => format!("answered, ended {}", v["ended"]),
    };
    for (max, shown) in [(json!(0), "0"), (json!(31), "31"), (json!(2.5), "2.5")] {
        assert_eq!(
            refused(
                device
                    .invoke("listen", input(json!({"max_seconds": max})))
                    .await
            ),
            format!("max_seconds must be a whole number from 1 to 30, not {shown}")
        );
    }
    let long = "a".repeat(1001);
    assert_eq!(
        refused(device.invoke("say", input(json!({"text": long}))).await),
        "the text is 1001 characters; at most 1000 are spoken at once"
    );
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let mut truncated = audio::wav(&tone(440.0, 100, RATE, 8000));
    truncated.truncate(100);
    let mut huge = audio::wav(&tone(440.0, 100, RATE, 8000));
    huge[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
    for (bytes, why) in [
        (
            b"not a sound".to_vec(),
            "the audio is not WAV (RIFF WAVE) or Opus (Ogg)",
        ),
        (
            b"OggS\0\x02rest".to_vec(),
            "Opus audio is not played by this device: send 16-bit PCM WAV",
        ),
        (
            truncated,
            "the WAV is cut short: its data chunk says 3200 bytes and 56 follow",
        ),
        (
            huge,
            "the WAV is cut short: its data chunk says 4294967295 bytes and 3200 follow",
        ),
    ] {
        assert_eq!(
            refused(
                device
                    .invoke("play", input(json!({"audio": b64(&bytes)})))
                    .await
            ),
            why
        );
    }

    // A stop ends a recording of a sound that does not end.
    let done = Arc::new(AtomicBool::new(false));
    let feeder = feed(&pulse, tone(440.0, 20_000, RATE, 12_000), Arc::clone(&done));
    let mut live = voice.live();
    let listening = tokio::spawn({
        let device = device.clone();
        async move {
            device
                .invoke("listen", input(json!({"max_seconds": 15})))
                .await
        }
    });
    let opened = live.wait_for(|l| l.is_some()).await.map(|l| l.clone());
    assert_eq!(opened.ok().flatten().map(|l| l.max_seconds), Some(15));
    // A second recording is refused while the first runs.
    assert_eq!(
        refused(device.invoke("listen", input(json!({}))).await),
        "the microphone is already open (listen): one recording at a time"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = voice.stop();
    assert!(stopped.microphone);
    let result = listening.await.unwrap().unwrap();
    assert_eq!(result["ended"], "stopped", "{result}");
    assert!(voice.live().borrow().is_none());

    // The source goes away in the middle of a recording (with no other
    // for the server to move the recording to): a clear error, and the
    // device records again once it is back.
    let listening = tokio::spawn({
        let device = device.clone();
        async move {
            device
                .invoke("listen", input(json!({"max_seconds": 15})))
                .await
        }
    });
    let _ = live.wait_for(|l| l.is_some()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(pulse.remove_sink(SPEAKER_SINK));
    assert!(pulse.remove_sink(MIC_SINK));
    let failed = refused(listening.await.unwrap());
    assert!(
        failed.starts_with("recording from source \"dk_mic.monitor\" failed"),
        "{failed}"
    );
    done.store(true, Ordering::Relaxed);
    let _ = feeder.join();
    assert!(pulse.add_sink(MIC_SINK));
    assert!(pulse.add_sink(SPEAKER_SINK));
    let done = Arc::new(AtomicBool::new(false));
    let feeder = feed(&pulse, tone(440.0, 600, RATE, 12_000), Arc::clone(&done));
    let again = device
        .invoke("listen", input(json!({"max_seconds": 5})))
        .await
        .unwrap();
    done.store(true, Ordering::Relaxed);
    feeder.join().unwrap();
    assert_eq!(again["ended"], "silence", "{again}");
    // A sink that is not there: a clear error.
    assert!(pulse.remove_sink(SPEAKER_SINK));
    let failed = refused(device.invoke("say", input(json!({"text": "hi"}))).await);
    assert!(
        failed.starts_with("cannot play to sink \"dk_speaker\""),
        "{failed}"
    );
}

//! The voice device against a real PulseAudio server of the test's own
//! (dk-testkit's `pulse`): a tone played into the microphone's sink is
//! what `listen` returns, speech and played sound reach the speaker's
//! monitor, a stop ends a recording, bad input and a source that goes
//! away are refused clearly and the device goes on.

// Test code throughout: the lint wall's test allowances apply to all of it.
#![cfg(test)]

use std::time::Duration;

use base64::Engine as _;
use dk_testkit::pulse::{
    Feed, MIC_SINK, MIC_SOURCE, Pulse, Recording, SPEAKER_SINK, pulse_or_skip, tone, tone_hz,
};
use dk_voice::audio::{self, RATE};
use dk_voice::vad::DEFAULT_HANGOVER;
use dk_voice::{Endpoints, MAX_LISTEN_SECONDS, Voice, VoiceConfig};
use serde_json::{Map, Value, json};

/// What the feed keeps waiting in the server.
const FEED_BUFFER: Duration = Duration::from_millis(50);

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

/// Records the speaker while `call` runs; what it played.
async fn recorded<F: Future>(pulse: &Pulse, call: F) -> (F::Output, Vec<i16>) {
    let recording = Recording::start(pulse);
    let out = call.await;
    (out, recording.finish())
}

/// A WAV file of `samples` in `channels` channels at `rate`, each channel
/// the same.
fn wav_at(samples: &[i16], rate: u32, channels: u16) -> Vec<u8> {
    let interleaved: Vec<i16> = samples
        .iter()
        .flat_map(|&s| std::iter::repeat_n(s, usize::from(channels)))
        .collect();
    let mut file = audio::wav(&[]);
    file.truncate(audio::WAV_HEADER);
    let data_len = (interleaved.len() * 2) as u32;
    let frame = 2 * channels;
    file[4..8].copy_from_slice(&(data_len + 36).to_le_bytes());
    file[22..24].copy_from_slice(&channels.to_le_bytes());
    file[24..28].copy_from_slice(&rate.to_le_bytes());
    file[28..32].copy_from_slice(&(rate * u32::from(frame)).to_le_bytes());
    file[32..34].copy_from_slice(&frame.to_le_bytes());
    file[40..44].copy_from_slice(&data_len.to_le_bytes());
    file.extend(audio::pcm(&interleaved));
    file
}

/// Whether a stream plays on `sink` now.
fn playing_on(pulse: &Pulse, sink: &str) -> bool {
    let sinks = pulse.pactl(&["list", "short", "sinks"]).unwrap_or_default();
    let Some(index) = sinks.lines().find_map(|line| {
        let mut fields = line.split('\t');
        let index = fields.next()?;
        (fields.next()? == sink).then(|| index.to_owned())
    }) else {
        return false;
    };
    let inputs = pulse
        .pactl(&["list", "short", "sink-inputs"])
        .unwrap_or_default();
    inputs
        .lines()
        .any(|line| line.split('\t').nth(1) == Some(index.as_str()))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tone_is_heard_and_silence_ends_listen() {
    let Some(binary) = pulse_or_skip("a_tone_is_heard_and_silence_ends_listen") else {
        return;
    };
    let pulse = Pulse::start(&binary);
    let voice = voice(&pulse);
    let feed = Feed::start(&pulse, FEED_BUFFER);
    let mut live = voice.live();
    let listening = tokio::spawn({
        let device = voice.device().clone();
        async move {
            device
                .invoke("listen", input(json!({"max_seconds": 10})))
                .await
        }
    });
    live.wait_for(Option::is_some).await.unwrap();
    feed.play(&tone(440.0, 1500, RATE, 12_000));
    let result = listening.await.unwrap().unwrap();
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
    let (said, heard) = recorded(
        &pulse,
        voice
            .device()
            .invoke("say", input(json!({"text": "hello"}))),
    )
    .await;
    let said = said.unwrap();
    assert!(said["spoken_ms"].as_u64().unwrap() > 200, "{said}");
    // Speech: a tenth of a second at least well above silence.
    let loudest = heard
        .chunks(1600)
        .map(audio::level_dbfs)
        .fold(audio::FLOOR_DBFS, f64::max);
    assert!(loudest > -30.0, "loudest 100 ms at {loudest} dBFS");

    // A tone sent as a WAV at another rate, in stereo, comes back whole.
    let file = wav_at(&tone(523.0, 1000, 44_100, 10_000), 44_100, 2);
    let (played, heard) = recorded(
        &pulse,
        voice
            .device()
            .invoke("play", input(json!({"audio": b64(&file)}))),
    )
    .await;
    let played = played.unwrap();
    assert_eq!(played["of_ms"], 1000, "{played}");
    let hz = tone_hz(&loud(&heard), RATE, 1000).unwrap();
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
    let over = MAX_LISTEN_SECONDS + 1;
    for (max, shown) in [
        (json!(0), "0".to_owned()),
        (json!(over), over.to_string()),
        (json!(2.5), "2.5".to_owned()),
        (json!("ten"), "not a number".to_owned()),
    ] {
        assert_eq!(
            refused(
                device
                    .invoke("listen", input(json!({"max_seconds": max})))
                    .await
            ),
            format!(
                "max_seconds must be a whole number from 1 to {MAX_LISTEN_SECONDS}, not {shown}"
            )
        );
    }
    assert_eq!(
        refused(device.invoke("listen", input(json!({}))).await),
        format!(
            "max_seconds is required: the longest the microphone stays open, 1 to {MAX_LISTEN_SECONDS}"
        )
    );
    let long = "a".repeat(1001);
    assert_eq!(
        refused(device.invoke("say", input(json!({"text": long}))).await),
        "the text is 1001 characters; at most 1000 are spoken at once"
    );
    let mut truncated = audio::wav(&tone(440.0, 100, RATE, 8000));
    truncated.truncate(100);
    let mut huge = audio::wav(&tone(440.0, 100, RATE, 8000));
    huge[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut short_header = audio::wav(&[]);
    short_header.truncate(20);
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
        (
            short_header,
            "the WAV is cut short: its fmt chunk says 16 bytes and 0 follow",
        ),
        (
            wav_at(&tone(440.0, 16_000, 16_000, 8000), 16_000, 1),
            "the audio lasts 16.0 s; at most 15 s is played at once",
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
    let feed = Feed::start(&pulse, FEED_BUFFER);
    feed.tone(440.0, 12_000);
    let mut live = voice.live();
    let listening = tokio::spawn({
        let device = device.clone();
        async move {
            device
                .invoke("listen", input(json!({"max_seconds": 15})))
                .await
        }
    });
    let opened = live.wait_for(Option::is_some).await.map(|l| l.clone());
    assert_eq!(opened.ok().flatten().map(|l| l.max_seconds), Some(15));
    // A second recording is refused while the first runs.
    assert_eq!(
        refused(
            device
                .invoke("listen", input(json!({"max_seconds": 5})))
                .await
        ),
        "the microphone is already open (listen): one recording at a time"
    );
    // Records 300 ms before the stop: audio is in time, not events.
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
    live.wait_for(Option::is_some).await.unwrap();
    // Records 200 ms before the source goes away mid-recording.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(pulse.remove_sink(SPEAKER_SINK));
    assert!(pulse.remove_sink(MIC_SINK));
    let failed = refused(listening.await.unwrap());
    assert!(
        failed.starts_with("recording from source \"dk_mic.monitor\" failed"),
        "{failed}"
    );
    drop(feed);
    assert!(pulse.add_sink(MIC_SINK));
    assert!(pulse.add_sink(SPEAKER_SINK));
    let feed = Feed::start(&pulse, FEED_BUFFER);
    let listening = tokio::spawn({
        let device = device.clone();
        async move {
            device
                .invoke("listen", input(json!({"max_seconds": 5})))
                .await
        }
    });
    live.wait_for(Option::is_some).await.unwrap();
    feed.play(&tone(440.0, 600, RATE, 12_000));
    let again = listening.await.unwrap().unwrap();
    assert_eq!(again["ended"], "silence", "{again}");

    // The sink goes away while a sound plays (with no other for the
    // server to move it to): a clear error, and the device plays again
    // once it is back.
    let long = wav_at(&tone(440.0, 10_000, RATE, 8000), RATE, 1);
    let playing = tokio::spawn({
        let device = device.clone();
        let long = b64(&long);
        async move { device.invoke("play", input(json!({"audio": long}))).await }
    });
    dk_testkit::eventually("the sound playing", || playing_on(&pulse, SPEAKER_SINK)).await;
    drop(feed);
    assert!(pulse.remove_sink(SPEAKER_SINK));
    assert!(pulse.remove_sink(MIC_SINK));
    let failed = refused(playing.await.unwrap());
    assert!(
        failed.starts_with("playing to sink \"dk_speaker\" failed"),
        "{failed}"
    );
    // A sink that is not there: a clear error.
    let failed = refused(device.invoke("say", input(json!({"text": "hi"}))).await);
    assert!(
        failed.starts_with("cannot play to sink \"dk_speaker\""),
        "{failed}"
    );
    assert!(pulse.add_sink(MIC_SINK));
    assert!(pulse.add_sink(SPEAKER_SINK));
    let (said, heard) =
        recorded(&pulse, device.invoke("say", input(json!({"text": "back"})))).await;
    assert!(said.is_ok(), "{said:?}");
    assert!(heard.chunks(1600).map(audio::level_dbfs).any(|l| l > -30.0));
}

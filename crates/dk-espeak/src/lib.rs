//! espeak-ng's speech synthesis, safe to call: text in, 16-bit mono PCM
//! out, handed to the caller in pieces as espeak-ng makes them, so speech
//! can start playing before the whole text is synthesized.
//!
//! This is the one crate of dk-voice's that holds unsafe code: the calls
//! into Debian's `libespeak-ng` (its C API, `speak_lib.h`), each in a block
//! with its SAFETY comment. espeak-ng keeps global state and is not safe to
//! call from two threads at once, so every call here holds one lock for the
//! whole synthesis; it is set up once (synchronous output, so the samples
//! come back through the callback on the calling thread, and
//! `espeakINITIALIZE_DONT_EXIT`, so missing voice data is an error instead
//! of the process exiting).
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::sync::atomic::AtomicBool;
//!
//! let (out, pieces) = std::sync::mpsc::sync_channel(8);
//! let stop = Arc::new(AtomicBool::new(false));
//! let rate = dk_espeak::speak("hello", &dk_espeak::Voice::default(), out, &stop)?;
//! let samples: Vec<i16> = pieces.into_iter().flatten().collect();
//! # let _ = (rate, samples);
//! # Ok::<(), dk_espeak::EspeakError>(())
//! ```

#![allow(
    unsafe_code,
    reason = "the calls into libespeak-ng: each in a block with its SAFETY comment"
)]

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int, c_short, c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, PoisonError};

/// Longest text one call speaks, in bytes of UTF-8.
pub const MAX_TEXT_BYTES: usize = 16 * 1024;
/// Slowest speaking rate, in words per minute (espeak-ng's minimum).
pub const MIN_RATE: u32 = 80;
/// Fastest speaking rate, in words per minute (espeak-ng's maximum).
pub const MAX_RATE: u32 = 450;
/// The speaking rate when none is given (espeak-ng's normal).
pub const DEFAULT_RATE: u32 = 175;
/// Longest voice name, in bytes.
pub const MAX_VOICE_NAME: usize = 40;

/// Why speech could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EspeakError {
    /// espeak-ng could not start (its data is missing, for one).
    #[error("espeak-ng could not start (is espeak-ng-data installed?): error {0}")]
    Init(i32),
    /// The text holds a NUL character.
    #[error("the text holds a NUL character")]
    Nul,
    /// The text is longer than [`MAX_TEXT_BYTES`].
    #[error("the text is {0} bytes; at most {MAX_TEXT_BYTES} are spoken at once")]
    TooLong(usize),
    /// The voice is not one espeak-ng has, or its name is not a plain name.
    #[error("espeak-ng has no voice {0:?}")]
    Voice(String),
    /// The rate is out of espeak-ng's range.
    #[error("the rate {0} is outside {MIN_RATE} to {MAX_RATE} words per minute")]
    Rate(u32),
    /// espeak-ng refused the text.
    #[error("espeak-ng could not speak the text: error {0}")]
    Synth(i32),
}

/// How to speak: a voice of espeak-ng (`en`, `en-us`, `de`, ...) and a
/// rate in words per minute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Voice {
    /// espeak-ng's voice name: letters, digits, `-` and `_`, at most
    /// [`MAX_VOICE_NAME`] bytes.
    pub name: String,
    /// Words per minute, [`MIN_RATE`] to [`MAX_RATE`].
    pub rate: u32,
}

impl Default for Voice {
    fn default() -> Self {
        Voice {
            name: "en".to_owned(),
            rate: DEFAULT_RATE,
        }
    }
}

/// espeak-ng's `AUDIO_OUTPUT_SYNCHRONOUS`: samples come back through the
/// callback, on the thread that called `espeak_Synth`, before it returns.
const AUDIO_OUTPUT_SYNCHRONOUS: c_int = 2;
/// `espeakINITIALIZE_DONT_EXIT`: an error instead of `exit()`.
const INITIALIZE_DONT_EXIT: c_int = 0x8000;
/// `espeakCHARS_UTF8`.
const CHARS_UTF8: c_uint = 1;
/// `POS_CHARACTER`.
const POS_CHARACTER: c_int = 1;
/// `espeakRATE`.
const PARAMETER_RATE: c_int = 1;
/// `EE_OK`.
const EE_OK: c_int = 0;
/// Milliseconds of audio espeak-ng hands the callback at a time.
const BUFFER_MS: c_int = 50;

/// The callback's signature, `t_espeak_callback`.
type SynthCallback = extern "C" fn(*mut c_short, c_int, *mut c_void) -> c_int;

unsafe extern "C" {
    fn espeak_Initialize(
        output: c_int,
        buflength: c_int,
        path: *const c_char,
        options: c_int,
    ) -> c_int;
    fn espeak_SetSynthCallback(callback: SynthCallback);
    fn espeak_SetVoiceByName(name: *const c_char) -> c_int;
    fn espeak_SetParameter(parameter: c_int, value: c_int, relative: c_int) -> c_int;
    fn espeak_Synth(
        text: *const c_void,
        size: usize,
        position: c_uint,
        position_type: c_int,
        end_position: c_uint,
        flags: c_uint,
        unique_identifier: *mut c_uint,
        user_data: *mut c_void,
    ) -> c_int;
}

/// The engine: its sample rate once set up. Held for a whole synthesis.
static ENGINE: Mutex<Option<u32>> = Mutex::new(None);

/// Where the callback puts the samples of the synthesis running on this
/// thread, and the flag that stops it.
struct Sink {
    out: SyncSender<Vec<i16>>,
    stop: Arc<AtomicBool>,
}

thread_local! {
    static SINK: RefCell<Option<Sink>> = const { RefCell::new(None) };
}

/// Called by espeak-ng, on the thread of `espeak_Synth`, with each piece of
/// samples (and a null `wav` at the end). Returns 1 to stop synthesis.
extern "C" fn on_samples(wav: *mut c_short, count: c_int, _events: *mut c_void) -> c_int {
    let piece: Vec<i16> = match usize::try_from(count) {
        Ok(count) if !wav.is_null() && count > 0 => {
            // SAFETY: espeak-ng hands a buffer of `count` samples at `wav`
            // (checked non-null and positive above), valid for the length
            // of this call; it is copied out before returning.
            unsafe { std::slice::from_raw_parts(wav, count) }.to_vec()
        }
        _ => Vec::new(),
    };
    SINK.with(|sink| {
        let sink = sink.borrow();
        let Some(sink) = sink.as_ref() else {
            return 1;
        };
        if sink.stop.load(Ordering::Relaxed) {
            return 1;
        }
        if piece.is_empty() {
            return 0;
        }
        match sink.out.send(piece) {
            Ok(()) => 0,
            Err(_) => 1,
        }
    })
}

/// Sets the engine up once; its sample rate.
fn engine_rate(engine: &mut Option<u32>) -> Result<u32, EspeakError> {
    if let Some(rate) = *engine {
        return Ok(rate);
    }
    // SAFETY: a null path asks for espeak-ng's installed data; the engine
    // lock is held, so no other thread is inside espeak-ng.
    let rate = unsafe {
        espeak_Initialize(
            AUDIO_OUTPUT_SYNCHRONOUS,
            BUFFER_MS,
            std::ptr::null(),
            INITIALIZE_DONT_EXIT,
        )
    };
    let Ok(rate) = u32::try_from(rate) else {
        return Err(EspeakError::Init(rate));
    };
    if rate == 0 {
        return Err(EspeakError::Init(0));
    }
    // SAFETY: `on_samples` has the callback's signature and lives for the
    // whole program; the engine lock is held.
    unsafe { espeak_SetSynthCallback(on_samples) };
    *engine = Some(rate);
    Ok(rate)
}

/// The rate of the samples [`speak`] makes (22,050 Hz with Debian's
/// espeak-ng), setting the engine up if it is not yet.
pub fn sample_rate() -> Result<u32, EspeakError> {
    let mut engine = ENGINE.lock().unwrap_or_else(PoisonError::into_inner);
    engine_rate(&mut engine)
}

fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_VOICE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Checks `text` and `voice` as [`speak`] does, without speaking.
pub fn check(text: &str, voice: &Voice) -> Result<(), EspeakError> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(EspeakError::TooLong(text.len()));
    }
    if text.contains('\0') {
        return Err(EspeakError::Nul);
    }
    if !plain_name(&voice.name) {
        return Err(EspeakError::Voice(voice.name.chars().take(40).collect()));
    }
    if !(MIN_RATE..=MAX_RATE).contains(&voice.rate) {
        return Err(EspeakError::Rate(voice.rate));
    }
    Ok(())
}

/// Speaks `text` with `voice`: sends the samples (16-bit mono at the
/// returned rate, 22,050 Hz with Debian's espeak-ng) to `out` piece by
/// piece as they are made, waiting when `out` is full, and returns once
/// the text is done, `stop` is set, or `out`'s receiver is gone. Blocks the
/// calling thread, and any other thread's call until then.
pub fn speak(
    text: &str,
    voice: &Voice,
    out: SyncSender<Vec<i16>>,
    stop: &Arc<AtomicBool>,
) -> Result<u32, EspeakError> {
    check(text, voice)?;
    let text = CString::new(text).map_err(|_| EspeakError::Nul)?;
    let name = CString::new(voice.name.as_str()).map_err(|_| EspeakError::Nul)?;
    let rate_wpm = c_int::try_from(voice.rate).map_err(|_| EspeakError::Rate(voice.rate))?;
    let mut engine = ENGINE.lock().unwrap_or_else(PoisonError::into_inner);
    let rate = engine_rate(&mut engine)?;
    // SAFETY: `name` is a NUL-terminated string alive for the call; the
    // engine lock is held.
    let set = unsafe { espeak_SetVoiceByName(name.as_ptr()) };
    if set != EE_OK {
        return Err(EspeakError::Voice(voice.name.clone()));
    }
    // SAFETY: a plain parameter call; the engine lock is held.
    let set = unsafe { espeak_SetParameter(PARAMETER_RATE, rate_wpm, 0) };
    if set != EE_OK {
        return Err(EspeakError::Rate(voice.rate));
    }
    SINK.with(|sink| {
        *sink.borrow_mut() = Some(Sink {
            out,
            stop: Arc::clone(stop),
        });
    });
    let bytes = text.as_bytes_with_nul();
    // SAFETY: `text` is NUL-terminated UTF-8 of `bytes.len()` bytes, alive
    // for the call; synchronous output calls `on_samples` on this thread
    // only, before returning, and the sink it reads is set above; the
    // engine lock is held.
    let said = unsafe {
        espeak_Synth(
            bytes.as_ptr().cast(),
            bytes.len(),
            0,
            POS_CHARACTER,
            0,
            CHARS_UTF8,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    // Drops the sender, so the receiver sees the end.
    SINK.with(|sink| sink.borrow_mut().take());
    drop(engine);
    // Stopped by the callback reads as an error from some versions; a
    // stop asked for is not one.
    if said != EE_OK && !stop.load(Ordering::Relaxed) {
        return Err(EspeakError::Synth(said));
    }
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn energy(samples: &[i16]) -> f64 {
        let sum: f64 = samples.iter().map(|&s| f64::from(s) * f64::from(s)).sum();
        (sum / samples.len().max(1) as f64).sqrt()
    }

    #[test]
    fn hello_is_speech() {
        let (out, pieces) = std::sync::mpsc::sync_channel::<Vec<i16>>(4);
        let stop = Arc::new(AtomicBool::new(false));
        let reader =
            std::thread::spawn(move || -> Vec<i16> { pieces.into_iter().flatten().collect() });
        let rate = speak("hello", &Voice::default(), out, &stop);
        let samples = reader.join().unwrap_or_default();
        assert_eq!(rate, Ok(22_050));
        // A quarter of a second at least, and loud.
        assert!(samples.len() > 5_000, "{}", samples.len());
        assert!(energy(&samples) > 500.0, "{}", energy(&samples));
    }

    #[test]
    fn a_stop_ends_it_early() {
        let long = "a very long sentence that goes on and on ".repeat(20);
        let (out, pieces) = std::sync::mpsc::sync_channel::<Vec<i16>>(1);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let reader = std::thread::spawn(move || {
            let mut got = 0;
            for piece in pieces {
                got += piece.len();
                flag.store(true, Ordering::Relaxed);
            }
            got
        });
        assert!(speak(&long, &Voice::default(), out, &stop).is_ok());
        let got = reader.join().unwrap_or(usize::MAX);
        // At most the piece that set the flag and one already made.
        assert!(got < 22_050, "{got}");
    }

    #[test]
    fn bad_input_is_refused() {
        let stop = Arc::new(AtomicBool::new(false));
        let (out, _pieces) = std::sync::mpsc::sync_channel::<Vec<i16>>(1);
        let voice = Voice::default();
        assert_eq!(
            speak("a\0b", &voice, out.clone(), &stop),
            Err(EspeakError::Nul)
        );
        let long = "a".repeat(MAX_TEXT_BYTES + 1);
        assert_eq!(
            speak(&long, &voice, out.clone(), &stop),
            Err(EspeakError::TooLong(MAX_TEXT_BYTES + 1))
        );
        let odd = Voice {
            name: "../etc".to_owned(),
            rate: DEFAULT_RATE,
        };
        assert!(matches!(
            speak("hi", &odd, out.clone(), &stop),
            Err(EspeakError::Voice(_))
        ));
        let unknown = Voice {
            name: "no-such-voice".to_owned(),
            rate: DEFAULT_RATE,
        };
        assert!(matches!(
            speak("hi", &unknown, out.clone(), &stop),
            Err(EspeakError::Voice(_))
        ));
        let fast = Voice {
            name: "en".to_owned(),
            rate: 9_000,
        };
        assert_eq!(
            speak("hi", &fast, out, &stop),
            Err(EspeakError::Rate(9_000))
        );
    }
}

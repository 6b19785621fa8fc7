//! A microphone and a speaker as a dk device (`dk device voice`): an agent
//! listens (`listen`, a recording that ends at silence, returned as WAV;
//! `listen_stream`, live chunks of PCM over dk's stream frames) and speaks
//! (`say`, through espeak-ng; `play`, a WAV the agent sends), only while
//! the person lets it: `listen` and `listen_stream` ask every time, the
//! microphone is announced live and off as it opens and closes, and a stop
//! (the `stop` capability, or the person's) ends everything at once.
//!
//! Sound goes through PulseAudio's API (libpulse's simple API; PipeWire's
//! PulseAudio server serves it too), nothing shelled out. Inside the
//! device sound is 16 kHz mono 16-bit PCM. Speech is made by espeak-ng's
//! library through `dk-espeak`, the one crate of this device that holds
//! unsafe code. Captured sound is handed to the call that asked for it and
//! kept nowhere else; the device logs durations and levels, never sound.
//!
//! Every call's input is checked before anything reaches the sound server;
//! no input from an agent or a vessel can make this crate panic. A server,
//! source or sink that is missing or goes away fails the call saying so,
//! and the device stays up.

#![forbid(unsafe_code)]

pub mod audio;
mod device;
mod pulse;
pub mod vad;

pub use device::{
    DEFAULT_CHUNK_MS, KIND, LiveMic, MAX_CHUNK_MS, MAX_LISTEN_SECONDS, MAX_PLAY_SECONDS,
    MAX_SAY_TEXT, MAX_STREAM_SECONDS, STREAM, StartError, Stopped, Voice, VoiceConfig,
};
pub use pulse::Endpoints;

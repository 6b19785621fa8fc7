//! The device's side of one connection after another, as a state machine:
//! on dk/2 the handshake (the vessel's key checked against the pin before
//! the device says anything about itself), then `device:hello` and the
//! commit/nonce/reveal pairing, or `device:auth` by key; on v1 `device:hello`
//! or `device:auth` with a token. Then calls, events and stream chunks
//! until the connection ends, and what its end means.
//!
//! Nothing here does IO or reads a clock: the driver feeds received
//! WebSocket messages, the time and timer expiries in, and takes messages
//! to send, codes to show, credentials to keep and calls to run out
//! ([`DeviceCore::poll`]).

use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::{String, ToString as _};
use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;

use dk_channel::{
    FrameKind, Initiator, MAX_MESSAGE, OpenedFrame, Opener, PublicKey, RecordLimits, Sealer,
};
use dk_proto::{
    Channel, CloseCode, CloseFrame, CloseWhy, DeviceFrame, FrameLimits, MAX_FRAME_BYTES, Manifest,
    StreamChunk, StreamDroppedFrame, StreamingFrame, VesselFrame, VesselRead,
};
use serde_json::value::RawValue;

use crate::calls::{
    Accepted, Calls, EventRefusal, Input, Invocation, SetAside, event_frame, range_in,
};
use crate::credentials::Credentials;
use crate::entropy::{Entropy, EntropyFailed, random32};
use crate::time::Instant;
use crate::{DEFAULT_MAX_IN_FLIGHT, DEFAULT_REMEMBERED_CALLS};

/// How long the dk/2 handshake may take, from [`DeviceCore::connect`], by
/// default.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long to wait for the vessel's close once the device closed, by
/// default.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest v1 token kept from `device:paired`.
pub const MAX_TOKEN_BYTES: usize = 1024;

/// How a [`DeviceCore`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The channel: dk/2 (the default) or plain v1.
    pub channel: Channel,
    /// How many calls may run at once (at least one).
    pub max_in_flight: usize,
    /// How many call ids are remembered, so a repeat never runs.
    pub remember_calls: usize,
    /// The largest frame taken from the vessel, in bytes (at most
    /// [`MAX_FRAME_BYTES`]): a frame over it breaks the channel. A
    /// device short of memory sets it to what its calls need.
    pub max_frame_bytes: usize,
    /// How long the dk/2 handshake may take.
    pub handshake_timeout: Duration,
    /// How long to wait for the vessel's close after the device's.
    pub close_timeout: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            channel: Channel::Dk2,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            remember_calls: DEFAULT_REMEMBERED_CALLS,
            max_frame_bytes: MAX_FRAME_BYTES,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            close_timeout: CLOSE_TIMEOUT,
        }
    }
}

/// A WebSocket message for the driver to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A text message (v1's frames).
    Text(String),
    /// A binary message (dk/2's handshake messages and records, stream
    /// chunks).
    Binary(Vec<u8>),
    /// A close, with its code and reason or none. Nothing is sent after it.
    Close(Option<CloseFrame>),
}

/// A WebSocket message (or the lack of one) the driver received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received<'a> {
    /// A text message.
    Text(&'a str),
    /// A binary message.
    Binary(&'a [u8]),
    /// The vessel's close, with its code and reason when it gave them. The
    /// WebSocket library answers it; the core only reads it.
    Close(Option<(u16, &'a str)>),
    /// The connection dropped (or could not be written to) without a close.
    Lost,
}

/// What the core asks of the driver, in the order it must happen.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Send this message.
    Send(Message),
    /// The connection is open: on dk/2 the handshake is done and the
    /// vessel's key checked; on v1 at once.
    Connected,
    /// Show the person this 6-digit pairing code, to compare with the
    /// vessel's prompt.
    ShowCode(String),
    /// dk/2: keep these credentials (a new key, a new pin, paired or not
    /// any more), replacing what was kept. Until kept, the device cannot
    /// reconnect by key.
    Store(Credentials),
    /// dk/2: the vessel's key was pinned (the person said yes).
    Pinned(PublicKey),
    /// v1: keep this device token for reconnecting (a secret).
    StoreToken(String),
    /// v1: forget this token (the vessel refused it or unpaired the
    /// device), unless what is kept is another one.
    ForgetToken(String),
    /// Run this call's handler and give the outcome to
    /// [`DeviceCore::answer`].
    Invoke(Invocation),
    /// Something to log; nothing to do.
    Notice(Notice),
    /// The connection ended; see [`End`]. The driver drops the socket, and
    /// [`DeviceCore::connect`] starts another when `End` says so.
    Ended(End),
}

/// Something that happened and needs no answer: for the device's log.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Notice {
    /// A frame the calls' rules set aside.
    SetAside(SetAside),
    /// A frame that came before the pairing ended and was ignored.
    Ignored(&'static str),
    /// A pairing code that is not 6 digits, not shown (printable).
    InvalidCode(String),
    /// The vessel admitted this session as a streaming one.
    StreamingAdmitted {
        /// The device kind.
        kind: String,
        /// The largest chunk payload the vessel takes.
        max_chunk_bytes: u64,
    },
    /// The vessel dropped a stream chunk.
    StreamChunkDropped {
        /// The stream.
        stream: String,
        /// The chunk's sequence number.
        seq: u64,
        /// Its size.
        bytes: u64,
        /// The vessel's marker.
        marker: String,
    },
    /// A stream chunk over the vessel's cap, dropped before sending.
    ChunkOverCap {
        /// The chunk's sequence number.
        seq: u64,
    },
    /// dk/2: a close the vessel did not announce inside the channel, which
    /// anyone on the path can forge: the device connects again.
    UnannouncedClose(u16),
    /// A binary message the device has no use for.
    IgnoredBinary,
}

/// How a connection ended, and whether to connect again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Connecting again makes sense (after a backoff).
    Retry(Retry),
    /// The device must not connect again on its own: the person must act.
    Stop(Stop),
    /// [`DeviceCore::shutdown`] asked for it; the close was sent (none
    /// during the handshake, which is simply dropped).
    Shutdown,
}

/// An end the device can outlast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retry {
    /// The vessel closed with this code and reason (printable); on dk/2 a
    /// close not announced inside the channel is one of these whatever its
    /// code.
    Closed {
        /// The close code (1005 when none was given).
        code: u16,
        /// The reason.
        reason: String,
    },
    /// The connection dropped, or the channel failed (the device closed
    /// 4012).
    Lost,
    /// The dk/2 handshake did not finish: why.
    Handshake(String),
}

/// An end that needs the person.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// The person refused the pairing (4001): the vessel's reason.
    PairingRefused(String),
    /// The vessel refused the credential (4002); a dk/2 key is marked
    /// unpaired, a v1 token forgotten.
    AuthFailed,
    /// The manifest changed since the person approved it (4003); a dk/2
    /// key is marked unpaired, so the next run asks to pair.
    ManifestChanged,
    /// The person unpaired the device.
    Unpaired,
    /// The vessel refused the streaming session for good (4011): why.
    AdmissionRefused(String),
    /// The pairing exchange broke (a frame out of order, a reveal that
    /// does not match its commitment): the device closed 4001.
    PairingBroken(String),
    /// The vessel presented another key than the pinned one: nothing about
    /// the device was sent. Fingerprints of both.
    VesselKeyChanged {
        /// The pinned key's fingerprint.
        pinned: String,
        /// The presented key's fingerprint.
        presented: String,
    },
    /// v1: `device:paired` carried a token that is not printable ASCII of
    /// at most [`MAX_TOKEN_BYTES`] bytes.
    BadToken,
    /// The driver could not keep the credentials or token
    /// ([`DeviceCore::storage_failed`]).
    Storage,
    /// The platform gave no random bytes.
    Entropy,
    /// The stored credentials hold no usable key.
    Credentials,
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stop::PairingRefused(why) => write!(f, "pairing refused: {why}"),
            Stop::AuthFailed => {
                f.write_str("the vessel refused the device's credential: pair again")
            }
            Stop::ManifestChanged => f.write_str(
                "the device's manifest changed since the person approved it: pair again",
            ),
            Stop::Unpaired => {
                f.write_str("the person unpaired the device: pair again to reconnect")
            }
            Stop::AdmissionRefused(why) => {
                write!(f, "the vessel refused the streaming session: {why}")
            }
            Stop::PairingBroken(why) => write!(f, "pairing broken: {why}"),
            Stop::VesselKeyChanged { pinned, presented } => write!(
                f,
                "the vessel's key changed (pinned {pinned}, presented {presented}): it may be an impostor"
            ),
            Stop::BadToken => f.write_str(
                "device:paired carried a token that is not printable ASCII of at most 1024 bytes",
            ),
            Stop::Storage => f.write_str("the device's credentials could not be kept"),
            Stop::Entropy => f.write_str("the platform gave no random bytes"),
            Stop::Credentials => f.write_str("the stored credentials hold no usable key"),
        }
    }
}

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No connection: [`DeviceCore::connect`] starts one.
    Idle,
    /// dk/2: the handshake runs.
    Handshaking,
    /// `device:hello` was sent: the pairing runs.
    Pairing,
    /// Paired or authenticated: calls are served.
    Serving,
    /// The device closed and waits for the vessel's close.
    Closing,
    /// The connection ended ([`Output::Ended`] was given).
    Ended,
}

/// Why a stream chunk was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkRefusal {
    /// No connection is serving.
    NotConnected,
    /// The vessel has not admitted a streaming session (yet): keep it.
    NotAdmitted,
    /// Over the vessel's cap: dropped.
    OverCap,
    /// The chunk cannot be encoded (a stream name too long): dropped.
    Malformed,
}

impl fmt::Display for ChunkRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChunkRefusal::NotConnected => "no connection to the vessel",
            ChunkRefusal::NotAdmitted => "the vessel has not admitted a streaming session",
            ChunkRefusal::OverCap => "the chunk is over the vessel's cap",
            ChunkRefusal::Malformed => "the chunk cannot be encoded",
        })
    }
}

/// A dk/2 connection's channel and pairing state.
struct Secure {
    sealer: Sealer,
    opener: Opener,
    handshake_hash: [u8; 32],
    /// The vessel's static key, as this handshake presented it.
    vessel: PublicKey,
    /// The vessel's commitment, once `device:pair-commit` came.
    commitment: Option<[u8; 32]>,
    /// The device's nonce, once sent.
    nonce: Option<[u8; 32]>,
    /// Whether the reveal matched and the code was shown.
    code_shown: bool,
    /// The close the vessel announced inside the channel
    /// (`device:closing`): the only kind of close a dk/2 device acts on.
    closing: Option<(u16, String)>,
}

enum Phase {
    Idle,
    Handshake {
        initiator: Box<Initiator>,
        deadline: Instant,
    },
    Pairing,
    Serving,
    Closing {
        deadline: Instant,
        then: End,
    },
    Ended,
}

/// Why the frame loop ends the connection.
enum Break {
    /// The channel failed: close 4012 and connect again.
    Channel,
    /// The pairing broke: close 4001 and stop.
    Pairing(String),
    /// v1: a token that cannot be kept: close 1011 and stop.
    Token,
}

/// The device side of dk, without IO: one device's state across its
/// connections (its credentials, the call ids it has seen) and the
/// connection now open.
///
/// The driver calls [`connect`](DeviceCore::connect) once its WebSocket
/// is open (on dk/2, asking for the `dk.2` subprotocol), feeds every
/// message it receives to [`receive`](DeviceCore::receive), calls
/// [`handle_timeout`](DeviceCore::handle_timeout) when the instant from
/// [`poll_timeout`](DeviceCore::poll_timeout) passes, and after each of
/// these drains [`poll`](DeviceCore::poll), doing what each [`Output`]
/// says in order. Handlers' outcomes come back through
/// [`answer`](DeviceCore::answer); events through
/// [`emit`](DeviceCore::emit).
///
/// No input can make it panic, and what it holds is bounded: one frame
/// being reassembled (at most [`Config::max_frame_bytes`]), the running
/// calls (at most [`Config::max_in_flight`]), the remembered call ids (at
/// most [`Config::remember_calls`] hashes), and the outputs not yet
/// polled.
pub struct DeviceCore {
    manifest_json: Box<RawValue>,
    device_id: String,
    config: Config,
    entropy: Box<dyn Entropy + Send>,
    credentials: Option<Credentials>,
    token: Option<String>,
    calls: Calls,
    phase: Phase,
    secure: Option<Secure>,
    stream_cap: u64,
    outputs: VecDeque<Output>,
}

impl fmt::Debug for DeviceCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceCore")
            .field("device_id", &self.device_id)
            .field("channel", &self.config.channel)
            .field("state", &self.state())
            .field("credentials", &self.credentials)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("calls", &self.calls)
            .finish_non_exhaustive()
    }
}

impl DeviceCore {
    /// The device of `manifest` (already validated), run as `config` says,
    /// drawing random bytes from `entropy`. On dk/2 `credentials` are what
    /// the device kept (none on its first run: a key is made at the first
    /// connection and given out to keep); on v1 `token` is the kept token.
    pub fn new(
        manifest: &Manifest,
        config: Config,
        mut entropy: Box<dyn Entropy + Send>,
        credentials: Option<Credentials>,
        token: Option<String>,
    ) -> Result<DeviceCore, EntropyFailed> {
        let mut key = [0u8; 16];
        entropy.fill(&mut key)?;
        // The canonical JSON of a validated manifest with dk's extensions
        // (a param's `maxLength` and `multiline`, `noScreen`) is JSON; the
        // vessel reads them, and its digest leaves them out as 8DK's does.
        let manifest_json =
            RawValue::from_string(manifest.to_stored_json()).map_err(|_| EntropyFailed)?;
        let calls = Calls::new(manifest, config.max_in_flight, config.remember_calls, key);
        let mut config = config;
        config.max_frame_bytes = config.max_frame_bytes.clamp(1024, MAX_FRAME_BYTES);
        Ok(DeviceCore {
            manifest_json,
            device_id: manifest.id().to_string(),
            config,
            entropy,
            credentials,
            // A token the vessel could not take is no token: the device
            // asks to pair instead of sending a `device:auth` refused.
            token: token.filter(|token| is_token(token)),
            calls,
            phase: Phase::Idle,
            secure: None,
            stream_cap: 0,
            outputs: VecDeque::new(),
        })
    }

    /// Replaces the credentials (dk/2) and the token (v1) with what the
    /// platform keeps, read again before a connection (another program may
    /// have changed them). Ignored while a connection is open.
    pub fn reload(&mut self, credentials: Option<Credentials>, token: Option<String>) {
        if matches!(self.phase, Phase::Idle | Phase::Ended) {
            self.credentials = credentials;
            self.token = token.filter(|token| is_token(token));
        }
    }

    /// Where the connection stands.
    pub fn state(&self) -> State {
        match self.phase {
            Phase::Idle => State::Idle,
            Phase::Handshake { .. } => State::Handshaking,
            Phase::Pairing => State::Pairing,
            Phase::Serving => State::Serving,
            Phase::Closing { .. } => State::Closing,
            Phase::Ended => State::Ended,
        }
    }

    /// The channel this device speaks.
    pub fn channel(&self) -> Channel {
        self.config.channel
    }

    /// The credentials held now (dk/2).
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// Whether the device reconnects without the person: a dk/2 key the
    /// vessel paired, or a v1 token.
    pub fn is_paired(&self) -> bool {
        match self.config.channel {
            Channel::Dk2 => self
                .credentials
                .as_ref()
                .is_some_and(Credentials::is_paired),
            Channel::V1 => self.token.is_some(),
        }
    }

    /// The largest stream chunk payload the vessel admitted on this
    /// connection; 0 until it admits a streaming session.
    pub fn stream_cap(&self) -> u64 {
        self.stream_cap
    }

    /// How many calls run now.
    pub fn running_calls(&self) -> usize {
        self.calls.running()
    }

    /// The next thing for the driver to do, in order; `None` once all is
    /// done.
    pub fn poll(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// When [`handle_timeout`](DeviceCore::handle_timeout) is due: the
    /// handshake's deadline, or the wait for the vessel's close.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Handshake { deadline, .. } | Phase::Closing { deadline, .. } => Some(*deadline),
            _ => None,
        }
    }

    /// Starts a connection on a WebSocket the driver just opened: the
    /// first handshake message on dk/2 (a key is made first if none is
    /// kept), `device:hello` or `device:auth` on v1. A connection still
    /// open is forgotten (its calls abandoned).
    pub fn connect(&mut self, now: Instant) {
        self.reset();
        match self.config.channel {
            Channel::V1 => {
                self.outputs.push_back(Output::Connected);
                let (frame, pairing) = match &self.token {
                    Some(token) => (
                        DeviceFrame::Auth {
                            device_id: Cow::Borrowed(&self.device_id),
                            token: Cow::Borrowed(token),
                            manifest: Some(Cow::Borrowed(&self.manifest_json)),
                        }
                        .to_json(),
                        false,
                    ),
                    None => (self.hello(), true),
                };
                self.send(Message::Text(frame));
                self.phase = if pairing {
                    Phase::Pairing
                } else {
                    Phase::Serving
                };
            }
            Channel::Dk2 => {
                if self.credentials.is_none() {
                    match Credentials::generate(self.entropy.as_mut()) {
                        Ok(made) => {
                            self.outputs.push_back(Output::Store(made.clone()));
                            self.credentials = Some(made);
                        }
                        Err(EntropyFailed) => return self.end(End::Stop(Stop::Entropy)),
                    }
                }
                let Some(key) = self.credentials.as_ref().and_then(Credentials::key) else {
                    return self.end(End::Stop(Stop::Credentials));
                };
                let Ok(ephemeral) = random32(self.entropy.as_mut()) else {
                    return self.end(End::Stop(Stop::Entropy));
                };
                let started = Initiator::with_random(&key, ephemeral)
                    .and_then(|mut initiator| Ok((initiator.first_message()?, initiator)));
                match started {
                    Ok((first, initiator)) => {
                        self.send(Message::Binary(first));
                        self.phase = Phase::Handshake {
                            initiator: Box::new(initiator),
                            deadline: now.saturating_add(self.config.handshake_timeout),
                        };
                    }
                    Err(error) => self.end(End::Retry(Retry::Handshake(error.to_string()))),
                }
            }
        }
    }

    /// Reads one message the driver received (or its lack: the connection
    /// dropped).
    pub fn receive(&mut self, now: Instant, message: Received<'_>) {
        match (&mut self.phase, message) {
            (Phase::Idle | Phase::Ended, _) => {}
            (Phase::Closing { .. }, Received::Close(_) | Received::Lost) => self.finish_closing(),
            (Phase::Closing { .. }, Received::Binary(bytes)) => {
                // A refusal the vessel announces while the device closes.
                if let Some(text) = self.open_record(bytes).ok().flatten()
                    && let Some(secure) = self.secure.as_mut()
                    && let Ok(VesselFrame::Closing { code, reason }) =
                        VesselFrame::parse_on(text.as_bytes(), FrameLimits::default(), Channel::Dk2)
                {
                    secure.closing = Some((code, printable(&reason)));
                }
            }
            (Phase::Closing { .. }, Received::Text(_)) => {}
            (Phase::Handshake { .. }, message) => self.handshake(now, message),
            (Phase::Pairing | Phase::Serving, Received::Lost) => {
                self.end(End::Retry(Retry::Lost));
            }
            (Phase::Pairing | Phase::Serving, Received::Close(frame)) => {
                let (code, reason) = match frame {
                    Some((code, reason)) => (code, printable(reason)),
                    None => (CloseCode::NoStatus.code(), String::new()),
                };
                let end = self.closed_with(code, reason);
                self.end(end);
            }
            (Phase::Pairing | Phase::Serving, Received::Text(text)) => {
                if self.secure.is_some() {
                    return self.broken(now, Break::Channel);
                }
                if let Err(why) = self.frame(Cow::Borrowed(text)) {
                    self.broken(now, why);
                }
            }
            (Phase::Pairing | Phase::Serving, Received::Binary(bytes)) => {
                if self.secure.is_none() {
                    self.outputs
                        .push_back(Output::Notice(Notice::IgnoredBinary));
                    return;
                }
                match self.open_record(bytes) {
                    Err(()) => self.broken(now, Break::Channel),
                    Ok(None) => {}
                    Ok(Some(text)) => {
                        if let Err(why) = self.frame(Cow::Owned(text)) {
                            self.broken(now, why);
                        }
                    }
                }
            }
        }
    }

    /// Handles the timer from [`poll_timeout`](DeviceCore::poll_timeout)
    /// once `now` is past it; earlier, nothing happens.
    pub fn handle_timeout(&mut self, now: Instant) {
        match &self.phase {
            Phase::Handshake { deadline, .. } if now >= *deadline => {
                let timeout = self.config.handshake_timeout;
                let within = if timeout.subsec_millis() == 0 {
                    format!("{} s", timeout.as_secs())
                } else {
                    format!("{} ms", timeout.as_millis())
                };
                self.end(End::Retry(Retry::Handshake(format!(
                    "no dk/2 handshake within {within}"
                ))));
            }
            Phase::Closing { deadline, .. } if now >= *deadline => self.finish_closing(),
            _ => {}
        }
    }

    /// Ends the connection on the device's side: a close 1000 (the vessel's
    /// answer is waited for), or at once during the handshake.
    pub fn shutdown(&mut self, now: Instant) {
        match self.phase {
            Phase::Idle | Phase::Ended | Phase::Closing { .. } => {}
            Phase::Handshake { .. } => self.end(End::Shutdown),
            Phase::Pairing | Phase::Serving => self.close(
                now,
                CloseFrame::new(CloseCode::Normal, "device shutting down"),
                End::Shutdown,
            ),
        }
    }

    /// The driver could not keep what [`Output::Store`] or
    /// [`Output::StoreToken`] gave: the connection is closed 1011 and the
    /// device stops, rather than run with credentials it would lose.
    pub fn storage_failed(&mut self, now: Instant) {
        let what = match self.config.channel {
            Channel::Dk2 => "cannot keep the device key",
            Channel::V1 => "cannot keep the device token",
        };
        match self.phase {
            Phase::Pairing | Phase::Serving => {
                self.close(now, unexpected_condition(what), End::Stop(Stop::Storage))
            }
            Phase::Closing { .. } => {
                if let Phase::Closing { then, .. } = &mut self.phase {
                    *then = End::Stop(Stop::Storage);
                }
            }
            _ => self.end(End::Stop(Stop::Storage)),
        }
    }

    /// Answers a running call with its handler's outcome: a result as JSON
    /// text, or an error's text. `false` when no such call runs (it was
    /// answered, or its connection ended: the vessel failed it already).
    pub fn answer(&mut self, call_id: &str, outcome: Result<&str, &str>) -> bool {
        if !matches!(self.phase, Phase::Serving) {
            return false;
        }
        let Some(frame) = self.calls.answer(call_id, outcome) else {
            return false;
        };
        self.send_frame(frame);
        true
    }

    /// Sends `device:event {capability, data}` (data as JSON text) for a
    /// declared capability, when a connection is serving.
    pub fn emit(&mut self, capability: &str, data: &str) -> Result<(), EventRefusal> {
        if !self.calls.declares(capability) {
            return Err(EventRefusal::UnknownCapability(capability.to_string()));
        }
        let frame = event_frame(capability, data)?;
        self.send_device_frame(frame)
    }

    /// Sends a device frame already written and checked (an event queued
    /// while disconnected, say), when a connection is serving.
    pub fn send_device_frame(&mut self, frame: String) -> Result<(), EventRefusal> {
        if !matches!(self.phase, Phase::Serving) {
            return Err(EventRefusal::NotConnected);
        }
        self.send_frame(frame);
        Ok(())
    }

    /// Sends a stream chunk, once the vessel admitted a streaming session
    /// and within its cap.
    pub fn send_chunk(&mut self, chunk: &StreamChunk<'_>) -> Result<(), ChunkRefusal> {
        if !matches!(self.phase, Phase::Serving) {
            return Err(ChunkRefusal::NotConnected);
        }
        if self.stream_cap == 0 {
            return Err(ChunkRefusal::NotAdmitted);
        }
        if chunk.payload.len() as u64 > self.stream_cap {
            self.outputs
                .push_back(Output::Notice(Notice::ChunkOverCap { seq: chunk.seq }));
            return Err(ChunkRefusal::OverCap);
        }
        let Some(bytes) = chunk.encode() else {
            return Err(ChunkRefusal::Malformed);
        };
        match self.secure.as_mut() {
            None => self.send(Message::Binary(bytes)),
            Some(secure) => match secure.sealer.seal(FrameKind::Binary, &bytes) {
                Ok(records) => {
                    for record in records {
                        self.outputs
                            .push_back(Output::Send(Message::Binary(record)));
                    }
                }
                Err(_) => return Err(ChunkRefusal::Malformed),
            },
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.calls.abandon();
        self.secure = None;
        self.stream_cap = 0;
        self.phase = Phase::Idle;
    }

    fn hello(&self) -> String {
        DeviceFrame::Hello {
            manifest: Cow::Borrowed(&self.manifest_json),
        }
        .to_json()
    }

    fn send(&mut self, message: Message) {
        self.outputs.push_back(Output::Send(message));
    }

    /// Sends a device frame: as a text message on v1, sealed into records
    /// on dk/2.
    fn send_frame(&mut self, frame: String) {
        let Some(secure) = self.secure.as_mut() else {
            return self.send(Message::Text(frame));
        };
        // Only a frame over the record layer's limit fails, and every frame
        // sent was checked against the vessel's: then nothing goes.
        if let Ok(records) = secure.sealer.seal(FrameKind::Text, frame.as_bytes()) {
            for record in records {
                self.outputs
                    .push_back(Output::Send(Message::Binary(record)));
            }
        }
    }

    /// Gives the end out once, and forgets the connection.
    fn end(&mut self, end: End) {
        self.calls.abandon();
        self.secure = None;
        self.stream_cap = 0;
        self.phase = Phase::Ended;
        self.outputs.push_back(Output::Ended(end));
    }

    /// Sends a close and waits for the vessel's (or the timer) to end with
    /// `then`.
    fn close(&mut self, now: Instant, frame: CloseFrame, then: End) {
        self.calls.abandon();
        self.send(Message::Close(Some(frame)));
        self.phase = Phase::Closing {
            deadline: now.saturating_add(self.config.close_timeout),
            then,
        };
    }

    fn finish_closing(&mut self) {
        let phase = core::mem::replace(&mut self.phase, Phase::Ended);
        if let Phase::Closing { then, .. } = phase {
            self.end(then);
        }
    }

    fn broken(&mut self, now: Instant, why: Break) {
        match why {
            // One code whatever failed, as the vessel does.
            Break::Channel => self.close(
                now,
                CloseFrame::new(CloseCode::SecureChannel, "secure channel failed"),
                End::Retry(Retry::Lost),
            ),
            Break::Pairing(why) => {
                let reason = CloseWhy::PairingDidNotHappen(why.clone()).to_string();
                self.close(
                    now,
                    CloseFrame::new(CloseCode::PairingRefused, reason),
                    End::Stop(Stop::PairingBroken(why)),
                );
            }
            Break::Token => self.close(
                now,
                unexpected_condition("cannot keep the device token"),
                End::Stop(Stop::BadToken),
            ),
        }
    }

    /// One step of the handshake.
    fn handshake(&mut self, now: Instant, message: Received<'_>) {
        let failed =
            |why: &dyn fmt::Display| End::Retry(Retry::Handshake(format!("dk/2 handshake: {why}")));
        let second = match message {
            Received::Binary(bytes) => bytes,
            Received::Text(_) => return self.end(failed(&"the vessel sent text")),
            Received::Close(frame) => {
                let said = frame.map_or_else(String::new, |(code, _)| format!(" ({code})"));
                return self.end(failed(&format!("the vessel closed the connection{said}")));
            }
            Received::Lost => return self.end(failed(&"the vessel hung up")),
        };
        let Phase::Handshake { initiator, .. } = core::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return;
        };
        let mut initiator = *initiator;
        let vessel = match initiator.read_second(second) {
            Ok(vessel) => vessel,
            Err(error) => {
                // A message 2 that does not hold (a low-order key among
                // them): the device closes 4012 as the vessel would.
                self.send(Message::Close(Some(CloseFrame::canonical(
                    CloseCode::SecureChannel,
                ))));
                return self.end(failed(&error));
            }
        };
        let pinned = self.credentials.as_ref().and_then(|c| c.pinned().copied());
        if let Some(pinned) = pinned
            && !pinned.ct_eq(&vessel)
        {
            // Closed before message 3: nothing about the device was sent.
            self.send(Message::Close(None));
            return self.end(End::Stop(Stop::VesselKeyChanged {
                pinned: pinned.fingerprint(),
                presented: vessel.fingerprint(),
            }));
        }
        let (third, established) = match initiator.third_message() {
            Ok(done) => done,
            Err(error) => return self.end(failed(&error)),
        };
        self.send(Message::Binary(third));
        let handshake_hash = established.handshake_hash;
        let limit = self.config.max_frame_bytes;
        let (sealer, opener) = established.split(RecordLimits {
            max_text: limit,
            max_binary: limit,
        });
        self.secure = Some(Secure {
            sealer,
            opener,
            handshake_hash,
            vessel,
            commitment: None,
            nonce: None,
            code_shown: false,
            closing: None,
        });
        self.outputs.push_back(Output::Connected);
        let paired = self
            .credentials
            .as_ref()
            .is_some_and(Credentials::is_paired);
        if paired {
            let frame = DeviceFrame::KeyAuth {
                device_id: Cow::Borrowed(&self.device_id),
                manifest: Cow::Borrowed(&self.manifest_json),
            }
            .to_json();
            self.send_frame(frame);
            self.phase = Phase::Serving;
        } else {
            let frame = self.hello();
            self.send_frame(frame);
            self.phase = Phase::Pairing;
        }
        let _ = now;
    }

    /// Opens one record: the frame it completes, if any. `Err` when the
    /// channel failed (the opener then refuses everything).
    fn open_record(&mut self, bytes: &[u8]) -> Result<Option<String>, ()> {
        let Some(secure) = self.secure.as_mut() else {
            return Err(());
        };
        if bytes.len() > MAX_MESSAGE {
            return Err(());
        }
        match secure.opener.open(bytes) {
            Ok(None) => Ok(None),
            Ok(Some(OpenedFrame::Text(text))) => Ok(Some(text)),
            Ok(Some(OpenedFrame::Binary(_))) => {
                self.outputs
                    .push_back(Output::Notice(Notice::IgnoredBinary));
                Ok(None)
            }
            Err(_) => Err(()),
        }
    }

    /// One text frame from the vessel, in the pairing or serving phase.
    fn frame(&mut self, text: Cow<'_, str>) -> Result<(), Break> {
        match self.phase {
            Phase::Pairing if self.secure.is_some() => self.pair_secure(&text),
            Phase::Pairing => self.pair_v1(&text),
            Phase::Serving => self.serve(text),
            _ => Ok(()),
        }
    }

    /// v1's pairing: the code to show, then the token.
    fn pair_v1(&mut self, text: &str) -> Result<(), Break> {
        match VesselFrame::parse(text.as_bytes()) {
            Ok(VesselFrame::Pairing { code }) => self.show_code(&code),
            Ok(VesselFrame::Paired { device_token }) => {
                if !is_token(&device_token) {
                    return Err(Break::Token);
                }
                let token = device_token.into_owned();
                self.token = Some(token.clone());
                self.outputs.push_back(Output::StoreToken(token));
                self.phase = Phase::Serving;
            }
            Ok(VesselFrame::Error { error }) => {
                self.notice(Notice::SetAside(SetAside::VesselError(printable(&error))))
            }
            Ok(other) => self.notice(Notice::Ignored(other.type_name())),
            Err(error) => self.notice(Notice::SetAside(SetAside::Refused(error))),
        }
        Ok(())
    }

    /// One frame of dk/2's pairing exchange, read in the order the rules
    /// demand: commit, then the device's nonce, then the reveal (checked
    /// against the commitment), then `device:paired`. Anything repeated,
    /// early or out of order breaks the pairing.
    fn pair_secure(&mut self, text: &str) -> Result<(), Break> {
        let frame =
            match VesselFrame::parse_on(text.as_bytes(), FrameLimits::default(), Channel::Dk2) {
                Ok(frame) => frame,
                Err(error) => {
                    // A pairing frame that does not parse (a nonce that is not
                    // 64 hex digits, v1's code on dk/2) ends the pairing.
                    if let Some(kind) = VesselFrame::pairing_type(text) {
                        return Err(Break::Pairing(format!(
                            "a malformed or unexpected {kind} frame"
                        )));
                    }
                    self.notice(Notice::SetAside(SetAside::Refused(error)));
                    return Ok(());
                }
            };
        let broken = |why: &str| Err(Break::Pairing(why.to_string()));
        let Some(secure) = self.secure.as_mut() else {
            return Ok(());
        };
        match frame {
            VesselFrame::PairCommit { commitment } => {
                if secure.commitment.is_some() {
                    return broken("a second commitment");
                }
                let Some(commitment) = dk_channel::from_hex32(&commitment) else {
                    return broken("a commitment that is not 64 hex digits");
                };
                secure.commitment = Some(commitment);
                let Ok(nonce) = random32(self.entropy.as_mut()) else {
                    return broken("the device has no random bytes for its nonce");
                };
                if let Some(secure) = self.secure.as_mut() {
                    secure.nonce = Some(nonce);
                }
                let frame = DeviceFrame::PairNonce {
                    nonce: Cow::Owned(dk_channel::to_hex32(&nonce)),
                }
                .to_json();
                self.send_frame(frame);
                Ok(())
            }
            VesselFrame::PairReveal { nonce } => {
                let (Some(commitment), Some(nd)) = (secure.commitment, secure.nonce) else {
                    return broken("a reveal before the commitment");
                };
                if secure.code_shown {
                    return broken("a second reveal");
                }
                let Some(nv) = dk_channel::from_hex32(&nonce) else {
                    return broken("a reveal that is not 64 hex digits");
                };
                if !dk_channel::commitment_holds(&commitment, &nv, &secure.handshake_hash) {
                    return broken(
                        "the vessel's reveal does not match its commitment (a relay may be in the middle)",
                    );
                }
                let code = dk_channel::pairing_code(&secure.handshake_hash, &nd, &nv);
                secure.code_shown = true;
                self.show_code(&code);
                Ok(())
            }
            VesselFrame::KeyPaired => {
                if !secure.code_shown {
                    return broken("paired before the codes were computed");
                }
                let vessel = secure.vessel;
                if let Some(credentials) = self.credentials.as_mut() {
                    credentials.pin(vessel);
                    self.outputs.push_back(Output::Store(credentials.clone()));
                }
                self.outputs.push_back(Output::Pinned(vessel));
                self.phase = Phase::Serving;
                Ok(())
            }
            VesselFrame::Closing { code, reason } => {
                secure.closing = Some((code, printable(&reason)));
                Ok(())
            }
            VesselFrame::Error { error } => {
                self.notice(Notice::SetAside(SetAside::VesselError(printable(&error))));
                Ok(())
            }
            other => {
                self.notice(Notice::Ignored(other.type_name()));
                Ok(())
            }
        }
    }

    /// One frame once paired or authenticated: a call, a streaming
    /// admission, a refusal announced (dk/2), or something to log. The
    /// frame is read once; a call's input stays in the frame's buffer.
    fn serve(&mut self, text: Cow<'_, str>) -> Result<(), Break> {
        let channel = self.config.channel;
        let read =
            VesselFrame::parse_keeping_input(text.as_bytes(), FrameLimits::default(), channel);
        let pairing = match &read {
            Ok(VesselRead::Frame(VesselFrame::Error { error })) => {
                self.notice(Notice::SetAside(SetAside::VesselError(printable(error))));
                return Ok(());
            }
            Ok(VesselRead::Frame(VesselFrame::Closing { code, reason })) => {
                if let Some(secure) = self.secure.as_mut() {
                    secure.closing = Some((*code, printable(reason)));
                }
                return Ok(());
            }
            Ok(VesselRead::Frame(
                frame @ (VesselFrame::PairCommit { .. } | VesselFrame::PairReveal { .. }),
            )) => Some(frame.type_name()),
            Ok(_) => None,
            Err(_) => VesselFrame::pairing_type(&text),
        };
        // dk/2: a pairing frame once paired or authenticated ends the
        // connection (the order rule).
        if self.secure.is_some()
            && let Some(kind) = pairing
        {
            return Err(Break::Pairing(format!(
                "an unexpected {kind} frame after pairing"
            )));
        }
        if let Some(admitted) = StreamingFrame::parse(&text) {
            self.stream_cap = admitted.max_chunk_bytes;
            self.notice(Notice::StreamingAdmitted {
                kind: printable(&admitted.kind),
                max_chunk_bytes: admitted.max_chunk_bytes,
            });
            return Ok(());
        }
        if let Some(dropped) = StreamDroppedFrame::parse(&text) {
            self.notice(Notice::StreamChunkDropped {
                stream: printable(&dropped.stream),
                seq: dropped.seq,
                bytes: dropped.bytes,
                marker: printable(&dropped.marker),
            });
            return Ok(());
        }
        let accepted = match read {
            Ok(VesselRead::Invoke(invoke)) => {
                // The input is cut out of the frame's own buffer when the
                // core holds it (dk/2), copied out of a frame lent (v1).
                let kept = match (&text, range_in(&text, invoke.input.get())) {
                    (Cow::Owned(_), Some(range)) => Err(range),
                    _ => Ok(Input::copy(invoke.input.get())),
                };
                let (call_id, capability) = (
                    Cow::Owned(invoke.call_id.into_owned()),
                    Cow::Owned(invoke.capability.into_owned()),
                );
                let input = kept.unwrap_or_else(|range| Input::cut(text.into_owned(), range));
                self.calls.accept_call(call_id, capability, input)
            }
            Ok(VesselRead::Frame(frame)) => self.calls.accept(frame),
            Err(error) => Accepted::SetAside(SetAside::Refused(error)),
        };
        match accepted {
            Accepted::Run(invocation) => self.outputs.push_back(Output::Invoke(invocation)),
            Accepted::Reply { frame, .. } => self.send_frame(frame),
            Accepted::SetAside(SetAside::VesselError(error)) => {
                self.notice(Notice::SetAside(SetAside::VesselError(printable(&error))));
            }
            Accepted::SetAside(aside) => self.notice(Notice::SetAside(aside)),
        }
        Ok(())
    }

    fn notice(&mut self, notice: Notice) {
        self.outputs.push_back(Output::Notice(notice));
    }

    fn show_code(&mut self, code: &str) {
        if code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit()) {
            self.outputs.push_back(Output::ShowCode(code.to_string()));
        } else {
            self.notice(Notice::InvalidCode(printable(code)));
        }
    }

    /// What a close from the vessel means: connect again when the close
    /// says so, else stop with what it stands for (forgetting the
    /// credential when the vessel did).
    fn closed_with(&mut self, code: u16, reason: String) -> End {
        // Over dk/2 a close travels outside the channel, where anyone on the
        // path can forge one: only a close announced inside it counts.
        let (code, reason) = match self.secure.as_mut() {
            None => (code, reason),
            Some(secure) => match secure.closing.take() {
                Some(announced) => announced,
                None => {
                    self.notice(Notice::UnannouncedClose(code));
                    return End::Retry(Retry::Closed { code, reason });
                }
            },
        };
        let frame = CloseFrame { code, reason };
        if frame.retry() {
            return End::Retry(Retry::Closed {
                code,
                reason: frame.reason,
            });
        }
        match frame.close_code() {
            Some(CloseCode::PairingRefused) => End::Stop(Stop::PairingRefused(frame.reason)),
            Some(CloseCode::AuthFailed) => {
                self.forget_credential();
                End::Stop(Stop::AuthFailed)
            }
            Some(CloseCode::ManifestChanged) => {
                // dk/2: the next run asks to pair again (with its pin kept),
                // as the close says, instead of sending device:auth forever.
                if self.config.channel == Channel::Dk2 {
                    self.forget_credential();
                }
                End::Stop(Stop::ManifestChanged)
            }
            Some(CloseCode::Unpaired) => {
                self.forget_credential();
                End::Stop(Stop::Unpaired)
            }
            // Not the session cap, which frees up when another session ends.
            Some(CloseCode::AdmissionRefused) => End::Stop(Stop::AdmissionRefused(frame.reason)),
            _ => End::Retry(Retry::Closed {
                code,
                reason: frame.reason,
            }),
        }
    }

    /// Forgets the credential the connection used: a dk/2 key is marked
    /// unpaired (the key and the vessel's pin stay), a v1 token dropped.
    fn forget_credential(&mut self) {
        match self.config.channel {
            Channel::Dk2 => {
                if let Some(credentials) = self.credentials.as_mut() {
                    credentials.unpair();
                    self.outputs.push_back(Output::Store(credentials.clone()));
                }
            }
            Channel::V1 => {
                if let Some(token) = self.token.take() {
                    self.outputs.push_back(Output::ForgetToken(token));
                }
            }
        }
    }
}

/// A close 1011 (an unexpected condition on the device's side).
fn unexpected_condition(reason: &str) -> CloseFrame {
    CloseFrame {
        code: 1011,
        reason: reason.to_string(),
    }
}

/// Whether `token` can be kept: printable ASCII, 1 to [`MAX_TOKEN_BYTES`]
/// bytes.
pub fn is_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= MAX_TOKEN_BYTES
        && token.bytes().all(|b| b.is_ascii_graphic())
}

/// `text` with characters a device may not put in text (controls, escapes,
/// invisible and bidirectional characters) escaped, cut to 200 characters,
/// so logging or showing it cannot drive a terminal.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(256));
    for (i, c) in text.chars().enumerate() {
        if i == 200 {
            out.push('…');
            break;
        }
        if dk_proto::is_unsafe_char(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

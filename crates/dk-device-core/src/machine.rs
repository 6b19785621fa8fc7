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
//! ([`DeviceCore::poll`]). Its parts: [`phase`] (where a connection
//! stands), [`handshake`], [`pairing`], [`serving`], [`end`] (what a
//! close means) and [`io`] (what goes between the core and its driver).

mod closing;
mod end;
mod handshake;
mod io;
mod pairing;
mod phase;
mod serving;

use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::{String, ToString as _};
use core::fmt;
use core::time::Duration;

use dk_channel::{FrameKind, Initiator};
use dk_proto::{
    Channel, CloseCode, CloseFrame, DeviceFrame, FrameLimits, MAX_FRAME_BYTES, Manifest,
    VesselFrame,
};
use serde_json::value::RawValue;

pub use end::{End, Retry, Stop};
pub use io::{ChunkRefusal, Message, Notice, Output, Received};
pub use phase::State;
use phase::{Link, PairStep, Phase};

use crate::calls::{Calls, EventRefusal, event_frame};
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
        self.phase.state()
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
        match self.phase {
            Phase::Serving { stream_cap, .. } => stream_cap,
            _ => 0,
        }
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
            Phase::Handshake { deadline, .. }
            | Phase::Closing { deadline, .. }
            | Phase::Serving {
                stop_by: Some(deadline),
                ..
            } => Some(*deadline),
            _ => None,
        }
    }

    /// Starts a connection on a WebSocket the driver just opened: the
    /// first handshake message on dk/2 (a key is made first if none is
    /// kept), `device:hello` or `device:auth` on v1. A connection still
    /// open is forgotten (its calls abandoned).
    pub fn connect(&mut self, now: Instant) {
        self.calls.abandon();
        self.phase = Phase::Idle;
        match self.config.channel {
            Channel::V1 => {
                self.outputs.push_back(Output::Connected);
                let (frame, phase) = match &self.token {
                    Some(token) => (
                        DeviceFrame::Auth {
                            device_id: Cow::Borrowed(&self.device_id),
                            token: Cow::Borrowed(token),
                            manifest: Some(Cow::Borrowed(&self.manifest_json)),
                        }
                        .to_json(),
                        Phase::Serving {
                            link: Link::V1,
                            stream_cap: 0,
                            stop_by: None,
                        },
                    ),
                    None => (self.hello(), Phase::Pairing(PairStep::V1)),
                };
                self.send(Message::Text(frame));
                self.phase = phase;
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
            (
                Phase::Closing {
                    link: Link::Dk2(secure),
                    ..
                },
                Received::Binary(bytes),
            ) => {
                // A refusal the vessel announces while the device closes.
                if let Ok(Some(text)) = secure.open(bytes, &mut self.outputs)
                    && let Ok(VesselFrame::Closing { code, reason }) =
                        VesselFrame::parse_on(text.as_bytes(), FrameLimits::default(), Channel::Dk2)
                {
                    secure.closing = Some((code, printable(&reason)));
                }
            }
            (Phase::Closing { .. }, Received::Text(_) | Received::Binary(_)) => {}
            (Phase::Handshake { .. }, message) => self.handshake(message),
            (Phase::Pairing(_) | Phase::Serving { .. }, Received::Lost) => {
                self.end(End::Retry(Retry::Lost));
            }
            (Phase::Pairing(_) | Phase::Serving { .. }, Received::Close(frame)) => {
                let (code, reason) = match frame {
                    Some((code, reason)) => (code, printable(reason)),
                    None => (CloseCode::NoStatus.code(), String::new()),
                };
                let end = self.closed_with(code, reason);
                self.end(end);
            }
            (
                Phase::Pairing(PairStep::V1) | Phase::Serving { link: Link::V1, .. },
                Received::Text(text),
            ) => {
                if let Err(why) = self.frame(Cow::Borrowed(text)) {
                    self.broken(now, why);
                }
            }
            (
                Phase::Pairing(PairStep::V1) | Phase::Serving { link: Link::V1, .. },
                Received::Binary(_),
            ) => self.notice(Notice::IgnoredBinary),
            // dk/2: every frame comes inside the channel.
            (Phase::Pairing(_) | Phase::Serving { .. }, Received::Text(_)) => {
                self.broken(now, Break::Channel);
            }
            (Phase::Pairing(_) | Phase::Serving { .. }, Received::Binary(bytes)) => {
                let opened = match self.phase.secure_mut() {
                    Some(secure) => secure.open(bytes, &mut self.outputs),
                    None => Err(()),
                };
                match opened {
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
            Phase::Serving {
                stop_by: Some(deadline),
                ..
            } if now >= *deadline => self.close(now, shutting_down(), End::Shutdown),
            _ => {}
        }
    }

    /// Ends the connection on the device's side: a close 1000 (the vessel's
    /// answer is waited for), or at once during the handshake. Calls that
    /// run get `grace` to be answered: meanwhile no new call starts (each
    /// is refused, [`CallRefusal::ShuttingDown`](crate::CallRefusal::ShuttingDown)), and the close
    /// comes once the last is answered or at `now + grace`, whichever is
    /// first ([`poll_timeout`](DeviceCore::poll_timeout) says when). A
    /// second shutdown can only bring the close nearer.
    pub fn shutdown(&mut self, now: Instant, grace: Duration) {
        let running = self.calls.running();
        match &mut self.phase {
            Phase::Idle | Phase::Ended | Phase::Closing { .. } => {}
            Phase::Handshake { .. } => self.end(End::Shutdown),
            Phase::Serving { stop_by, .. } if running > 0 && !grace.is_zero() => {
                let by = now.saturating_add(grace);
                *stop_by = Some(stop_by.map_or(by, |at| at.min(by)));
            }
            Phase::Pairing(_) | Phase::Serving { .. } => {
                self.close(now, shutting_down(), End::Shutdown);
            }
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
        match &mut self.phase {
            Phase::Pairing(_) | Phase::Serving { .. } => {
                self.close(now, unexpected_condition(what), End::Stop(Stop::Storage));
            }
            Phase::Closing { then, .. } => *then = End::Stop(Stop::Storage),
            _ => self.end(End::Stop(Stop::Storage)),
        }
    }

    /// Answers a running call with its handler's outcome: a result as JSON
    /// text, or an error's text. `false` when no such call runs (it was
    /// answered, or its connection ended: the vessel failed it already).
    pub fn answer(&mut self, call_id: &str, outcome: Result<&str, &str>) -> bool {
        if !matches!(self.phase, Phase::Serving { .. }) {
            return false;
        }
        let Some(frame) = self.calls.answer(call_id, outcome) else {
            return false;
        };
        self.send_frame(frame);
        // Shutting down and nothing runs any more: the close is due now.
        if self.calls.running() == 0
            && let Phase::Serving {
                stop_by: Some(at), ..
            } = &mut self.phase
        {
            *at = Instant::from_millis(0);
        }
        true
    }

    /// Sends `device:event {capability, data}` (data as JSON text) for a
    /// declared capability, or for a declared event (the dk extension)
    /// whose data keeps its params, when a connection is serving.
    pub fn emit(&mut self, capability: &str, data: &str) -> Result<(), EventRefusal> {
        self.calls.check_event(capability, data)?;
        let frame = event_frame(capability, data)?;
        self.send_device_frame(frame)
    }

    /// Sends a device frame already written and checked (an event queued
    /// while disconnected, say), when a connection is serving.
    pub fn send_device_frame(&mut self, frame: String) -> Result<(), EventRefusal> {
        if !matches!(self.phase, Phase::Serving { .. }) {
            return Err(EventRefusal::NotConnected);
        }
        self.send_frame(frame);
        Ok(())
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
    /// on dk/2 (a frame over the record layer's limit is not sent: every
    /// frame sent was checked against the vessel's limits).
    fn send_frame(&mut self, frame: String) {
        match self.phase.secure_mut() {
            Some(secure) => {
                let _ = secure.seal(FrameKind::Text, frame.as_bytes(), &mut self.outputs);
            }
            None => self.send(Message::Text(frame)),
        }
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

    /// One text frame from the vessel, in the pairing or serving phase.
    fn frame(&mut self, text: Cow<'_, str>) -> Result<(), Break> {
        match self.phase {
            Phase::Pairing(PairStep::V1) => self.pair_v1(&text),
            Phase::Pairing(_) => self.pair_dk2(&text),
            Phase::Serving { .. } => self.serve(text),
            _ => Ok(()),
        }
    }
}

/// The close 1000 a device sends when it shuts down.
fn shutting_down() -> CloseFrame {
    CloseFrame::new(CloseCode::Normal, "device shutting down")
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

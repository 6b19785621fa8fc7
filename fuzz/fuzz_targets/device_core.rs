//! dk-device-core's `DeviceCore` against a vessel the fuzzer's bytes drive:
//! a script of connects, handshake messages (real, replayed, low-order or
//! arbitrary), frames sealed through a real channel (each pairing frame
//! right or wrong, calls, closes announced or not, arbitrary JSON and
//! bytes), records dropped, replayed or reordered, closes and lost
//! connections, time moved anywhere, answers, events, chunks, shutdowns
//! and storage failures, on v1 and dk/2 with tight limits. The script runs
//! up to four times over the same core.
//!
//! After every step it drains `poll()` and checks: no panic; one step's
//! outputs are bounded; `running_calls() <= max_in_flight`; after `Ended`
//! nothing but a new `connect` sends anything; every credential given to
//! keep reads back from its bytes; every frame the device sends is one a
//! vessel takes; and the heap (counted by this target's allocator) stays
//! under a bound set by the configuration alone, whatever the script's
//! length.

#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dk_channel::{
    FrameKind, LowOrderSlot, MAX_PIECE, OpenedFrame, Opener, RecordLimits, Responder, Sealer,
    StaticKey,
};
use dk_device_core::{
    Config, Credentials, DeviceCore, Entropy, EntropyFailed, Instant, Message, Output, Received,
    State,
};
use dk_proto::{Channel, DeviceFrame, FrameLimits, MAX_FRAME_BYTES, Manifest, StreamChunk};

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only a
// counter is kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Whether to print every output (`DK_FUZZ_TRACE=1`, to read a run).
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("DK_FUZZ_TRACE").is_some())
}

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

const LAMP: &str = include_str!("../../fixtures/manifests/valid/desk-lamp.json");

fn lamp() -> Option<Manifest> {
    let value: serde_json::Value = serde_json::from_str(LAMP).ok()?;
    dk_proto::validate_manifest(&value).ok()
}

/// The fuzzer's bytes, read as a script: zeros once they run out.
struct Script<'a> {
    data: &'a [u8],
    at: usize,
}

impl Script<'_> {
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }

    fn u8(&mut self) -> u8 {
        let byte = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        byte
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        let mut bytes = [0u8; 8];
        for byte in &mut bytes {
            *byte = self.u8();
        }
        u64::from_le_bytes(bytes)
    }

    /// Up to 255 bytes as they are.
    fn bytes(&mut self) -> Vec<u8> {
        let len = usize::from(self.u8());
        let start = self.at.min(self.data.len());
        let end = (start + len).min(self.data.len());
        self.at = start + len;
        self.data[start..end].to_vec()
    }

    /// Up to 255 bytes as text (lossily).
    fn text(&mut self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// A size: small mostly, now and then near or over the frame limit
    /// (rarely, so that the runs it costs leave time for the rest).
    fn size(&mut self, limit: usize) -> usize {
        match self.u8() {
            0..=7 => limit.saturating_sub(usize::from(self.u8())),
            8..=15 => limit + usize::from(self.u8()),
            16..=47 => usize::from(self.u16()),
            _ => usize::from(self.u8()),
        }
    }

    /// A text of `size` bytes repeating one printable character.
    fn long_text(&mut self, limit: usize) -> String {
        let size = self.size(limit);
        let c = char::from(b'a' + self.u8() % 26);
        c.to_string().repeat(size)
    }
}

fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// The vessel's keys: the one the device may have pinned, and another.
fn vessel_key(which: u8) -> Option<StaticKey> {
    StaticKey::from_secret([0x41 + which % 2; 32]).ok()
}

/// How the vessel answers the next handshake.
#[derive(Clone, Copy)]
enum Persona {
    Key(u8),
    LowOrder(LowOrderSlot),
}

/// Where the vessel's end of the connection stands.
enum Link {
    /// No connection, or the device closed it.
    None,
    /// Waiting for the device's message 1.
    AwaitFirst,
    /// Message 1 read; message 2 not sent yet.
    ReadFirst(Box<Responder>),
    /// Message 2 sent; waiting for message 3.
    AwaitThird(Box<Responder>),
    /// The channel is open.
    Open {
        sealer: Sealer,
        opener: Opener,
        hash: [u8; 32],
    },
}

/// The vessel's side, as the script drives it.
struct Vessel {
    persona: Persona,
    link: Link,
    /// The vessel's pairing nonce.
    nv: [u8; 32],
    /// Message 2, once sent: replayed on demand.
    second: Option<Vec<u8>>,
    /// The last records sent, for replays and reorders (at most four).
    history: Vec<Vec<u8>>,
    /// Records sealed but held back, to deliver out of order.
    held: Vec<Vec<u8>>,
}

const HISTORY: usize = 4;

impl Vessel {
    fn remember(&mut self, record: &[u8]) {
        if self.history.len() == HISTORY {
            self.history.remove(0);
        }
        self.history.push(record.to_vec());
    }

    /// Reads a message the device sent.
    fn hear(&mut self, channel: Channel, message: &Message) {
        match message {
            Message::Close(_) => self.link = Link::None,
            Message::Text(text) => {
                assert_eq!(channel, Channel::V1, "text on dk/2");
                check_device_frame(text, channel);
            }
            Message::Binary(bytes) => match std::mem::replace(&mut self.link, Link::None) {
                Link::AwaitFirst => {
                    let Some(key) = vessel_key(match self.persona {
                        Persona::Key(which) => which,
                        Persona::LowOrder(_) => 0,
                    }) else {
                        return;
                    };
                    let responder = match self.persona {
                        Persona::Key(_) => {
                            Responder::with_fixed_ephemeral_for_vectors(&key, &[7; 32])
                        }
                        Persona::LowOrder(slot) => {
                            Responder::presenting_low_order_for_tests(&key, slot)
                        }
                    };
                    let Ok(mut responder) = responder else {
                        return;
                    };
                    assert!(
                        responder.read_first(bytes).is_ok(),
                        "message 1 does not read"
                    );
                    self.link = Link::ReadFirst(Box::new(responder));
                }
                Link::AwaitThird(responder) => {
                    let established = responder.read_third(bytes);
                    let Ok(established) = established else {
                        panic!("message 3 does not read: {established:?}");
                    };
                    let hash = established.handshake_hash;
                    let (sealer, opener) = established.split(RecordLimits {
                        max_text: 2 * MAX_FRAME_BYTES,
                        max_binary: 2 * MAX_FRAME_BYTES,
                    });
                    self.link = Link::Open {
                        sealer,
                        opener,
                        hash,
                    };
                }
                Link::Open {
                    sealer,
                    mut opener,
                    hash,
                } => {
                    match opener.open(bytes) {
                        Ok(None) => {}
                        Ok(Some(OpenedFrame::Text(text))) => check_device_frame(&text, channel),
                        Ok(Some(OpenedFrame::Binary(chunk))) => {
                            assert!(
                                StreamChunk::parse(&chunk).is_ok(),
                                "a chunk that does not read"
                            );
                        }
                        Err(error) => panic!("a device record does not open: {error:?}"),
                    }
                    self.link = Link::Open {
                        sealer,
                        opener,
                        hash,
                    };
                }
                other => {
                    assert_eq!(channel, Channel::V1, "a binary message out of turn");
                    // v1: a stream chunk.
                    assert!(
                        StreamChunk::parse(bytes).is_ok(),
                        "a chunk that does not read"
                    );
                    self.link = other;
                }
            },
        }
    }
}

/// Every frame the device sends must be one the vessel takes.
fn check_device_frame(text: &str, channel: Channel) {
    if let Err(error) = DeviceFrame::parse_on(text.as_bytes(), FrameLimits::default(), channel) {
        panic!(
            "the device sent a frame the vessel refuses ({error}): {:.200}",
            text
        );
    }
}

/// Random bytes from a counter, failing after so many draws when asked.
fn entropy(seed: u8, fail_after: Option<u8>) -> Box<dyn Entropy + Send> {
    let mut next = seed;
    let mut draws = 0u32;
    Box::new(move |dest: &mut [u8]| {
        draws += 1;
        if fail_after.is_some_and(|after| draws > u32::from(after)) {
            return Err(EntropyFailed);
        }
        for byte in dest.iter_mut() {
            *byte = next;
            next = next.wrapping_mul(31).wrapping_add(7);
        }
        Ok(())
    })
}

/// The steps a script is made of.
const OPS: u8 = 16;

struct Run {
    core: DeviceCore,
    config: Config,
    vessel: Vessel,
    now: u64,
    /// The ids of the calls the device was asked to run, not yet answered.
    running: Vec<String>,
    /// A counter for fresh call ids.
    next_call: u64,
    /// Whether the connection ended and no connect came since.
    ended: bool,
}

impl Run {
    fn instant(&self) -> Instant {
        Instant::from_millis(self.now)
    }

    /// Drains the outputs of one step and checks them.
    fn drain(&mut self, connecting: bool) {
        let channel = self.config.channel;
        let mut count = 0usize;
        let mut sends = 0usize;
        while let Some(output) = self.core.poll() {
            count += 1;
            if trace() {
                eprintln!("{:.300}", format!("{output:?}"));
            }
            match &output {
                Output::Send(message) => {
                    sends += 1;
                    assert!(!self.ended, "sent after the end: {message:?}");
                    self.vessel.hear(channel, message);
                }
                Output::Store(credentials) => {
                    let bytes = credentials.to_bytes();
                    let back = Credentials::from_bytes(&bytes[..]);
                    assert_eq!(
                        back.as_ref(),
                        Ok(credentials),
                        "credentials do not read back"
                    );
                }
                Output::Invoke(invocation) => {
                    if self.running.len() < 128 {
                        self.running.push(invocation.call_id.clone());
                    }
                }
                Output::Ended(_) => {
                    self.ended = true;
                    self.running.clear();
                    self.vessel.link = Link::None;
                }
                Output::Connected => {}
                Output::ShowCode(code) => {
                    assert!(code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit()));
                }
                Output::Pinned(_) | Output::StoreToken(_) | Output::ForgetToken(_) => {}
                Output::Notice(_) => {}
            }
        }
        // One step: a few dozen outputs, and the records of one frame.
        let records = MAX_FRAME_BYTES.div_ceil(MAX_PIECE) + 1;
        assert!(count <= 32 + records, "{count} outputs in one step");
        assert!(
            sends <= 8 + records || connecting,
            "{sends} sends in one step"
        );
        assert!(self.core.running_calls() <= self.config.max_in_flight.max(1));
        if self.ended {
            assert_eq!(self.core.state(), State::Ended);
            assert_eq!(self.core.running_calls(), 0);
        }
        if matches!(self.core.state(), State::Handshaking | State::Closing) {
            assert!(self.core.poll_timeout().is_some());
        }
    }

    /// Gives `received` to the core.
    fn receive(&mut self, received: Received<'_>) {
        let now = self.instant();
        self.core.receive(now, received);
    }

    /// Seals a frame (or arbitrary bytes) and delivers its records: all in
    /// order, or some held back, dropped or swapped.
    fn deliver_frame(&mut self, kind: FrameKind, frame: &[u8], script: &mut Script<'_>) {
        let how = script.u8();
        let sealed = match &mut self.vessel.link {
            Link::Open { sealer, .. } => Some(sealer.seal(kind, frame)),
            _ => None,
        };
        match sealed {
            Some(Ok(mut records)) => {
                match how % 8 {
                    // Hold the last record back for later.
                    0 => {
                        if let Some(last) = records.pop()
                            && self.vessel.held.len() < HISTORY
                        {
                            self.vessel.held.push(last);
                        }
                    }
                    // Drop the first.
                    1 if records.len() > 1 => {
                        records.remove(0);
                    }
                    // Swap two.
                    2 if records.len() > 1 => records.swap(0, 1),
                    _ => {}
                }
                for record in &records {
                    self.vessel.remember(record);
                    self.receive(Received::Binary(record));
                }
            }
            Some(Err(_)) => {}
            // v1, or no channel: as a text or binary message.
            None => match (kind, std::str::from_utf8(frame)) {
                (FrameKind::Text, Ok(text)) if how % 8 != 7 => self.receive(Received::Text(text)),
                _ => self.receive(Received::Binary(frame)),
            },
        }
    }

    /// One structured vessel frame.
    fn vessel_frame(&mut self, script: &mut Script<'_>) -> String {
        let limit = self.config.max_frame_bytes;
        let hex = |bytes: &[u8; 32]| dk_channel::to_hex32(bytes);
        match script.u8() % 18 {
            0 => {
                let commitment = match &self.vessel.link {
                    Link::Open { hash, .. } => dk_channel::commitment(&self.vessel.nv, hash),
                    _ => [0; 32],
                };
                format!(
                    r#"{{"type":"device:pair-commit","commitment":"{}"}}"#,
                    hex(&commitment)
                )
            }
            1 => format!(
                r#"{{"type":"device:pair-commit","commitment":{}}}"#,
                json_string(&script.text())
            ),
            2 => format!(
                r#"{{"type":"device:pair-reveal","nonce":"{}"}}"#,
                hex(&self.vessel.nv)
            ),
            3 => {
                let mut nonce = [0u8; 32];
                nonce[0] = script.u8();
                format!(
                    r#"{{"type":"device:pair-reveal","nonce":"{}"}}"#,
                    hex(&nonce)
                )
            }
            4 => r#"{"type":"device:paired"}"#.to_owned(),
            5 => format!(
                r#"{{"type":"device:closing","code":{},"reason":{}}}"#,
                [4001u16, 4002, 4003, 4007, 4011, 4012, 1000, 1008][usize::from(script.u8() % 8)],
                json_string(&script.text())
            ),
            6 => format!(
                r#"{{"type":"device:closing","code":{},"reason":{}}}"#,
                script.u16(),
                json_string(&script.text())
            ),
            7..=9 => {
                let call_id = match script.u8() % 6 {
                    0 => script.text(),
                    1 => script.long_text(limit),
                    2 => self.running.last().cloned().unwrap_or_default(),
                    _ => {
                        self.next_call += 1;
                        format!("c{}", self.next_call)
                    }
                };
                let capability = match script.u8() % 6 {
                    0 => script.text(),
                    1 => "read_light".to_owned(),
                    2 => "strobe".to_owned(),
                    _ => "set_light".to_owned(),
                };
                let input = match script.u8() % 4 {
                    0 => format!(
                        r#"{{"on":true,"note":{}}}"#,
                        json_string(&script.long_text(limit))
                    ),
                    1 => script.text(),
                    _ => r#"{"on":true,"brightness":37}"#.to_owned(),
                };
                format!(
                    r#"{{"type":"device:invoke","callId":{},"capability":{},"input":{}}}"#,
                    json_string(&call_id),
                    json_string(&capability),
                    input
                )
            }
            10 => format!(
                r#"{{"type":"device:streaming","kind":{},"maxChunkBytes":{},"maxConcurrentSessions":1}}"#,
                json_string(&script.text()),
                script.u64() % 100_000
            ),
            11 => format!(
                r#"{{"type":"device:stream-dropped","stream":{},"seq":{},"accepted":false,"bytes":{},"marker":"dropped_oversize"}}"#,
                json_string(&script.text()),
                script.u64(),
                script.u64()
            ),
            12 => match script.u8() % 2 {
                0 => r#"{"type":"device:revoked"}"#.to_owned(),
                _ => format!(
                    r#"{{"type":"device:revoked","capability":{}}}"#,
                    json_string(&script.text())
                ),
            },
            13 => format!(
                r#"{{"type":"device:error","error":{}}}"#,
                json_string(&script.text())
            ),
            14 => format!(
                r#"{{"type":"device:pairing","code":{}}}"#,
                json_string(&script.text())
            ),
            15 => format!(
                r#"{{"type":"device:paired","deviceToken":{}}}"#,
                json_string(&script.text())
            ),
            16 => {
                // Nested deep.
                let depth = usize::from(script.u8());
                format!(
                    r#"{{"type":"device:invoke","callId":"deep","capability":"set_light","input":{{"a":{}{}}}}}"#,
                    "[".repeat(depth),
                    "]".repeat(depth)
                )
            }
            _ => script.text(),
        }
    }

    fn step(&mut self, op: u8, script: &mut Script<'_>) {
        let mut connecting = false;
        match op % OPS {
            0 => {
                let persona = script.u8();
                self.vessel.persona = match persona % 8 {
                    0 => Persona::LowOrder(LowOrderSlot::Static),
                    1 => Persona::LowOrder(LowOrderSlot::Ephemeral),
                    2 => Persona::Key(1),
                    _ => Persona::Key(0),
                };
                self.vessel.link = match self.config.channel {
                    Channel::Dk2 => Link::AwaitFirst,
                    Channel::V1 => Link::None,
                };
                self.vessel.second = None;
                self.vessel.held.clear();
                self.vessel.nv = [persona; 32];
                self.running.clear();
                self.ended = false;
                connecting = true;
                let now = self.instant();
                self.core.connect(now);
            }
            1 => {
                // Message 2: the real one, or the last one again.
                match std::mem::replace(&mut self.vessel.link, Link::None) {
                    Link::ReadFirst(mut responder) => {
                        let Ok(second) = responder.second_message() else {
                            return;
                        };
                        self.vessel.link = Link::AwaitThird(responder);
                        self.vessel.second = Some(second.clone());
                        self.receive(Received::Binary(&second));
                    }
                    other => {
                        self.vessel.link = other;
                        if let Some(second) = self.vessel.second.clone() {
                            self.receive(Received::Binary(&second));
                        }
                    }
                }
            }
            2 => {
                let mut bytes = script.bytes();
                if script.u8().is_multiple_of(4) {
                    // Over a Noise message.
                    bytes.resize(dk_channel::MAX_MESSAGE + 1, 0x5a);
                }
                self.receive(Received::Binary(&bytes));
            }
            3 => {
                let text = script.text();
                self.receive(Received::Text(&text));
            }
            4..=6 => {
                let frame = self.vessel_frame(script);
                self.deliver_frame(FrameKind::Text, frame.as_bytes(), script);
            }
            7 => {
                let kind = if script.u8().is_multiple_of(2) {
                    FrameKind::Text
                } else {
                    FrameKind::Binary
                };
                let mut bytes = script.bytes();
                if script.u8().is_multiple_of(4) {
                    // A frame around the limit, in pieces.
                    let size = script.size(self.config.max_frame_bytes);
                    bytes.resize(size, b' ');
                }
                self.deliver_frame(kind, &bytes, script);
            }
            8 => {
                // A record replayed, or one held back delivered late.
                let pick = usize::from(script.u8());
                let record = if pick % 2 == 0 && !self.vessel.held.is_empty() {
                    Some(self.vessel.held.remove(pick % self.vessel.held.len()))
                } else if !self.vessel.history.is_empty() {
                    Some(self.vessel.history[pick % self.vessel.history.len()].clone())
                } else {
                    None
                };
                if let Some(record) = record {
                    self.receive(Received::Binary(&record));
                }
            }
            9 => {
                let close = match script.u8() % 4 {
                    0 => None,
                    1 => Some(script.u16()),
                    _ => Some(
                        [4001u16, 4002, 4003, 4007, 4011, 4012, 1000, 1008]
                            [usize::from(script.u8() % 8)],
                    ),
                };
                let reason = script.text();
                self.receive(Received::Close(close.map(|code| (code, reason.as_str()))));
            }
            10 => self.receive(Received::Lost),
            11 => {
                self.now = match script.u8() % 6 {
                    0 => u64::MAX,
                    1 => self.now.saturating_sub(u64::from(script.u16())),
                    2 => self
                        .core
                        .poll_timeout()
                        .map_or(self.now, Instant::as_millis),
                    3 => script.u64(),
                    _ => self.now.saturating_add(u64::from(script.u16())),
                };
                let now = self.instant();
                self.core.handle_timeout(now);
            }
            12 => {
                let call_id = match script.u8() % 4 {
                    0 => script.text(),
                    _ if self.running.is_empty() => String::new(),
                    pick => self
                        .running
                        .swap_remove(usize::from(pick) % self.running.len()),
                };
                let limit = self.config.max_frame_bytes;
                let outcome = match script.u8() % 6 {
                    0 => Err(script.text()),
                    1 => Ok(script.text()),
                    2 => Ok(json_string(&script.long_text(MAX_FRAME_BYTES))),
                    3 => Err(script.long_text(MAX_FRAME_BYTES)),
                    4 => Ok(format!("{}{}", "[".repeat(100), "]".repeat(100))),
                    _ => Ok(format!(
                        r#"{{"on":true,"pad":{}}}"#,
                        json_string(&script.long_text(limit))
                    )),
                };
                let answered = self.core.answer(
                    &call_id,
                    outcome.as_ref().map(String::as_str).map_err(String::as_str),
                );
                if answered {
                    assert_eq!(self.core.state(), State::Serving);
                }
            }
            13 => {
                let capability = match script.u8() % 4 {
                    0 => script.text(),
                    _ => "read_light".to_owned(),
                };
                let data = match script.u8() % 4 {
                    0 => script.text(),
                    1 => json_string(&script.long_text(MAX_FRAME_BYTES)),
                    _ => r#"{"on":false}"#.to_owned(),
                };
                let sent = self.core.emit(&capability, &data);
                if sent.is_ok() {
                    assert_eq!(self.core.state(), State::Serving);
                }
            }
            14 => {
                let stream = match script.u8() % 4 {
                    0 => script.long_text(300),
                    _ => "read_light".to_owned(),
                };
                let payload = vec![0xc3; script.size(70_000)];
                let chunk = StreamChunk {
                    stream: &stream,
                    seq: script.u64(),
                    payload: &payload,
                };
                let sent = self.core.send_chunk(&chunk);
                if sent.is_ok() {
                    assert_eq!(self.core.state(), State::Serving);
                }
            }
            _ => match script.u8() % 2 {
                0 => {
                    let now = self.instant();
                    let grace = core::time::Duration::from_millis(u64::from(script.u8()) * 10);
                    self.core.shutdown(now, grace);
                }
                _ => {
                    let now = self.instant();
                    self.core.storage_failed(now);
                }
            },
        }
        self.drain(connecting);
    }
}

/// What the core may hold between steps, whatever the script's length:
/// its fixed state, one frame in reassembly (twice, for a vector's
/// growth), the running calls' ids and the remembered call ids.
fn heap_bound(config: &Config) -> usize {
    let frame = config.max_frame_bytes.clamp(1024, MAX_FRAME_BYTES);
    64 * 1024
        + 4 * frame
        + config.max_in_flight.max(1) * (frame + 512)
        + config.remember_calls.max(1) * 128
}

impl Run {
    /// What the harness itself holds: the vessel's records kept for
    /// replays, its channel's state and the ids of running calls.
    fn harness_bytes(&self) -> usize {
        let vessel = &self.vessel;
        let records: usize = vessel
            .history
            .iter()
            .chain(&vessel.held)
            .chain(&vessel.second)
            .map(|record| record.capacity() + 64)
            .sum();
        let ids: usize = self.running.iter().map(|id| id.capacity() + 64).sum();
        records + ids + 64 * 1024
    }
}

fn run(data: &[u8]) {
    let Some(manifest) = lamp() else {
        return;
    };
    let mut script = Script { data, at: 0 };
    let head = script.u8();
    let sizes = script.u8();
    let config = Config {
        channel: if head.is_multiple_of(4) {
            Channel::V1
        } else {
            Channel::Dk2
        },
        max_in_flight: [1, 2, 3, 64][usize::from(sizes & 3)],
        remember_calls: [1, 2, 16, 1024][usize::from((sizes >> 2) & 3)],
        max_frame_bytes: [1024, 4096, 70_000, MAX_FRAME_BYTES][usize::from((sizes >> 4) & 3)],
        handshake_timeout: Duration::from_millis(u64::from(script.u16())),
        close_timeout: Duration::from_millis(u64::from(script.u16())),
    };
    let pinned = vessel_key(0).map(|key| key.public());
    let other = vessel_key(1).map(|key| key.public());
    let credentials = match (head >> 2) % 6 {
        0 | 1 => None,
        2 => Some(Credentials::from_parts([3; 32], pinned, true)),
        3 => Some(Credentials::from_parts([3; 32], other, true)),
        4 => Some(Credentials::from_parts([3; 32], pinned, false)),
        _ => Some(Credentials::from_parts([0; 32], None, true)),
    };
    let token = match (head >> 5) % 4 {
        0 => Some("kept-token".to_owned()),
        // What a driver keeps passed `is_token` when it was kept.
        1 => Some(script.text()).filter(|token| dk_device_core::is_token(token)),
        _ => None,
    };
    let fail_after = match script.u8() {
        byte if byte < 8 => Some(byte),
        _ => None,
    };
    // Up to 16 times over: a leak per step adds up past any fixed bound.
    let passes = 1 + usize::from(head >> 6) + 4 * usize::from(sizes >> 6);
    let bound = heap_bound(&config);
    let before = live();
    let Ok(core) = DeviceCore::new(
        &manifest,
        config.clone(),
        entropy(head, fail_after),
        credentials,
        token,
    ) else {
        return;
    };
    let mut run = Run {
        core,
        config,
        vessel: Vessel {
            persona: Persona::Key(0),
            link: Link::None,
            nv: [9; 32],
            second: None,
            history: Vec::new(),
            held: Vec::new(),
        },
        now: 1_000,
        running: Vec::new(),
        next_call: 0,
        ended: false,
    };
    let start = script.at;
    for _ in 0..passes {
        script.at = start;
        while !script.done() {
            let op = script.u8();
            run.step(op, &mut script);
            let held = live()
                .saturating_sub(before)
                .saturating_sub(run.harness_bytes());
            assert!(held <= bound, "{held} bytes held, over {bound}");
        }
    }
    // Everything comes back once the core is dropped (the token it was
    // given, made before, with it): nothing leaked.
    drop(run);
    let after = live();
    assert!(after <= before, "{} bytes leaked", after - before);
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| run(data));

//! Calls: `device:invoke` in, a handler to run, `device:result` out. The
//! rules of which call runs are here, whatever runs the handlers (a task
//! per call in dk-device, a C function on a microcontroller).

use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::format;
use alloc::string::{String, ToString as _};
use alloc::vec::Vec;
use core::fmt;
use core::ops::Range;

use dk_proto::{Capability, DeviceFrame, EventSpec, FrameError, Manifest, VesselFrame, VesselRead};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

/// How many calls may run at once by default; a call beyond it is answered
/// with an error at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// How many call ids are remembered by default, so that a repeated one is
/// never run again (across reconnects, too).
pub const DEFAULT_REMEMBERED_CALLS: usize = 1024;

/// A call the vessel made that is to run: the platform runs the
/// capability's handler with the input and gives the outcome back with
/// [`Calls::answer`] (or the core's `answer`).
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// The call's id, to answer with.
    pub call_id: String,
    /// The capability called (one the manifest declares).
    pub capability: String,
    /// The call's input, as the vessel checked it against the params.
    pub input: Input,
}

/// A call's input: the JSON object the vessel sent, as its text. Cut out
/// of the frame it came in, in the frame's own buffer, so that a call
/// holds no more than its frame: nothing is built from the input unless a
/// driver asks for the object ([`Input::to_map`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// A JSON object (the frame's parser checked it).
    json: String,
}

impl Input {
    /// The input at `range` of `frame`, which must be a JSON object:
    /// the rest of the frame is moved out of the buffer, not copied.
    pub(crate) fn cut(mut frame: String, range: Range<usize>) -> Input {
        if frame.get(range.clone()).is_none() {
            return Input::empty();
        }
        frame.truncate(range.end);
        frame.drain(..range.start);
        Input { json: frame }
    }

    /// A copy of `json`, a JSON object.
    pub(crate) fn copy(json: &str) -> Input {
        Input {
            json: json.to_string(),
        }
    }

    /// `{}`.
    fn empty() -> Input {
        Input {
            json: "{}".to_string(),
        }
    }

    /// An input given as an object.
    pub fn from_map(input: &Map<String, Value>) -> Input {
        serde_json::to_string(input).map_or_else(|_| Input::empty(), |json| Input { json })
    }

    /// The JSON object, as text.
    pub fn as_str(&self) -> &str {
        &self.json
    }

    /// The JSON object, built (an empty one for text that would not read
    /// as one, which the frame's parser ruled out).
    pub fn to_map(&self) -> Map<String, Value> {
        serde_json::from_str(&self.json).unwrap_or_default()
    }

    /// The text, in the buffer the frame came in: its capacity is the
    /// frame's, so a NUL or another byte can be added without asking for
    /// memory.
    pub fn into_string(self) -> String {
        self.json
    }
}

/// Checks `input` against `capability`'s declared params and bounds, as
/// the vessel does at its input check.
fn bounded_input(capability: &Capability, input: &Input) -> Result<(), String> {
    let value: Value = serde_json::from_str(input.as_str()).map_err(|e| e.to_string())?;
    dk_proto::check_input(capability, &value).map_err(|e| e.to_string())
}

/// Where `part`, a slice of `text`, stands in it.
pub(crate) fn range_in(text: &str, part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    let range = start..start.checked_add(part.len())?;
    (text.get(range.clone()) == Some(part)).then_some(range)
}

/// Whether the device takes new calls: not once it shuts down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taking {
    /// New calls run.
    Yes,
    /// New calls are refused with [`CallRefusal::ShuttingDown`].
    No,
}

/// Why a call was answered with an error instead of its handler's outcome.
/// `Display` is the error text the vessel is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallRefusal {
    /// The device declares no such capability (8DK's text).
    UnknownCapability(String),
    /// A call id the device already received (a replay): not run again.
    AlreadyReceived(String),
    /// The device already runs its most calls at once.
    Busy(usize),
    /// The input does not keep the bounds the manifest declares (the dk
    /// extension): the handler never sees it, whatever the vessel checked.
    OutOfBounds {
        /// The capability called.
        capability: String,
        /// Which bound, as the vessel would say it (`"celsius" must be at
        /// most 30 °C`).
        why: String,
    },
    /// The device has no memory to remember the call's id by (and a call
    /// it could not refuse again if repeated does not run).
    OutOfMemory,
    /// The device is shutting down: the calls it runs get their grace, no
    /// new one starts.
    ShuttingDown,
    /// The handler's answer is not JSON.
    NotJson {
        /// The capability called.
        capability: String,
        /// What the JSON reader said.
        why: String,
    },
    /// The result or error frame would be refused by the vessel (too
    /// large, nested too deep), so this is sent in its place.
    CannotBeSent {
        /// `result` or `error`.
        what: &'static str,
        /// The capability called.
        capability: String,
        /// Why the vessel would refuse the frame.
        why: String,
    },
}

impl fmt::Display for CallRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallRefusal::UnknownCapability(name) => write!(f, "unknown capability \"{name}\""),
            CallRefusal::AlreadyReceived(id) => {
                write!(f, "call \"{id}\" was already received: not run again")
            }
            CallRefusal::Busy(max) => write!(f, "device is busy: {max} calls in flight"),
            CallRefusal::OutOfMemory => f.write_str("device is out of memory"),
            CallRefusal::ShuttingDown => f.write_str("device is shutting down"),
            CallRefusal::OutOfBounds { capability, why } => {
                write!(f, "input of \"{capability}\" refused: {why}")
            }
            CallRefusal::NotJson { capability, why } => {
                write!(f, "result of \"{capability}\" is not JSON: {why}")
            }
            CallRefusal::CannotBeSent {
                what,
                capability,
                why,
            } => write!(f, "the {what} of \"{capability}\" cannot be sent: {why}"),
        }
    }
}

impl core::error::Error for CallRefusal {}

/// What [`Calls::accept`] made of a vessel frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Accepted {
    /// Run this call's handler.
    Run(Invocation),
    /// Send this `device:result` at once: the call is refused, and why.
    Reply {
        /// The `device:result` to send.
        frame: String,
        /// Why the call does not run.
        refusal: CallRefusal,
    },
    /// Nothing to send or run: the frame was set aside, and why.
    SetAside(SetAside),
}

/// A vessel frame the calls' rules set aside: nothing to answer, something
/// to log.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SetAside {
    /// The frame did not parse.
    Refused(FrameError),
    /// An invoke reusing the id of a call still running: ignored.
    DuplicateCall(String),
    /// v1's `device:pairing {code}` outside the pairing.
    Pairing(String),
    /// v1's `device:paired {deviceToken}` outside the pairing (a secret).
    Paired(String),
    /// `device:revoked`: a grant was revoked, or the pairing ended (no
    /// capability).
    Revoked(Option<String>),
    /// `device:error`: the vessel refused a frame; its words.
    VesselError(String),
    /// A frame of the pairing, closing or streaming exchange, which the
    /// connection reads, not the calls.
    NotACall(&'static str),
}

/// The call ids received lately, oldest first out, kept as keyed hashes so
/// that a long id costs no more memory than a short one: 8 bytes each, in
/// one ring that grows as ids come, up to its most.
struct SeenCalls {
    key: [u8; 16],
    order: VecDeque<u64>,
    max: usize,
}

impl SeenCalls {
    fn hash(&self, call_id: &str) -> u64 {
        let digest = Sha256::new()
            .chain_update(self.key)
            .chain_update(call_id.as_bytes())
            .finalize();
        digest
            .first_chunk::<8>()
            .map_or(0, |head| u64::from_le_bytes(*head))
    }

    /// Remembers `call_id`: `Ok(false)` when it was already remembered,
    /// `Err` when there is no memory to remember it by.
    fn insert(&mut self, call_id: &str) -> Result<bool, CallRefusal> {
        let hash = self.hash(call_id);
        if self.order.contains(&hash) {
            return Ok(false);
        }
        if self.order.len() >= self.max {
            self.order.pop_front();
        } else {
            self.order
                .try_reserve(1)
                .map_err(|_| CallRefusal::OutOfMemory)?;
        }
        self.order.push_back(hash);
        Ok(true)
    }
}

/// The calls' rules for one device, across its connections: each call id
/// runs at most once, at most `max_in_flight` run at once, only declared
/// capabilities run, and every answer goes out as a `device:result` the
/// vessel will take.
pub struct Calls {
    capabilities: BTreeSet<String>,
    /// The capabilities whose params declare bounds (the dk extension),
    /// whose input is checked before the handler; none for a manifest
    /// without it, so a v1 device holds nothing more. Each a copy of what
    /// the input check reads, in a slice of exactly their number (a map's
    /// node would hold room for eleven).
    bounded: Box<[Capability]>,
    /// The events the manifest declares (the dk extension), each a copy of
    /// what the check of its data reads: a declared event goes out only
    /// with data that keeps its params.
    events: Box<[EventSpec]>,
    max_in_flight: usize,
    /// The calls running, by id, with their capability.
    running: BTreeMap<String, String>,
    seen: SeenCalls,
}

impl fmt::Debug for Calls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calls")
            .field("capabilities", &self.capabilities)
            .field("max_in_flight", &self.max_in_flight)
            .field("running", &self.running.len())
            .field("remembered", &self.seen.order.len())
            .finish()
    }
}

impl Calls {
    /// The rules for `manifest`'s capabilities, with at most
    /// `max_in_flight` calls at once and the last `remember` call ids
    /// remembered (each at least one), their hashes keyed with `key`
    /// (random bytes, so that the vessel cannot choose ids that collide).
    pub fn new(manifest: &Manifest, max_in_flight: usize, remember: usize, key: [u8; 16]) -> Calls {
        // Inserted one by one: collecting into a set sorts first, which
        // links a sort into the firmware for a handful of names.
        let mut capabilities = BTreeSet::new();
        for capability in manifest.capabilities() {
            capabilities.insert(capability.name().to_string());
        }
        Calls {
            capabilities,
            bounded: manifest
                .capabilities()
                .iter()
                .filter(|c| {
                    manifest.extended() && c.params().iter().any(|p| !p.bounds().is_empty())
                })
                .map(Capability::for_input_checks)
                .collect::<Vec<_>>()
                .into_boxed_slice(),
            events: manifest
                .events()
                .iter()
                .map(EventSpec::for_data_checks)
                .collect::<Vec<_>>()
                .into_boxed_slice(),
            max_in_flight: max_in_flight.max(1),
            running: BTreeMap::new(),
            seen: SeenCalls {
                key,
                order: VecDeque::new(),
                max: remember.max(1),
            },
        }
    }

    /// How many calls run now.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Whether the manifest declares `capability`.
    pub fn declares(&self, capability: &str) -> bool {
        self.capabilities.contains(capability)
    }

    /// Checks an event before it is sent: a declared event's data (JSON
    /// text) must keep its params, as the vessel checks them; any other
    /// name must be a capability. The same rule as dk-device's senders.
    pub fn check_event(&self, name: &str, data: &str) -> Result<(), EventRefusal> {
        let Some(event) = self.events.iter().find(|e| e.name() == name) else {
            return if self.declares(name) {
                Ok(())
            } else {
                Err(EventRefusal::UnknownCapability(name.to_string()))
            };
        };
        let value: Value =
            serde_json::from_str(data).map_err(|e| EventRefusal::NotJson(e.to_string()))?;
        dk_proto::check_event(event, &value)
            .map_err(|why| EventRefusal::Refused(format!("event \"{name}\" data: {why}")))
    }

    /// Says what to do with a vessel frame, read once
    /// ([`VesselFrame::parse_keeping_input`]): an invoke (its input copied
    /// from the frame as text, nothing built from it) runs or is refused; a
    /// revocation, an error or a frame of the pairing, closing or
    /// streaming exchange is set aside.
    pub fn accept(&mut self, frame: VesselRead<'_>) -> Accepted {
        let (call_id, capability, input) = match frame {
            VesselRead::Invoke(invoke) => (
                invoke.call_id,
                invoke.capability,
                Input::copy(invoke.input.get()),
            ),
            VesselRead::Frame(VesselFrame::Invoke {
                call_id,
                capability,
                input,
            }) => (call_id, capability, Input::from_map(&input)),
            VesselRead::Frame(VesselFrame::Pairing { code }) => {
                return Accepted::SetAside(SetAside::Pairing(code.into_owned()));
            }
            VesselRead::Frame(VesselFrame::Paired { device_token }) => {
                return Accepted::SetAside(SetAside::Paired(device_token.into_owned()));
            }
            VesselRead::Frame(VesselFrame::Revoked { capability }) => {
                return Accepted::SetAside(SetAside::Revoked(capability.map(Cow::into_owned)));
            }
            VesselRead::Frame(VesselFrame::Error { error }) => {
                return Accepted::SetAside(SetAside::VesselError(error.into_owned()));
            }
            VesselRead::Frame(
                other @ (VesselFrame::PairCommit { .. }
                | VesselFrame::PairReveal { .. }
                | VesselFrame::KeyPaired
                | VesselFrame::Closing { .. }
                | VesselFrame::Streaming(_)
                | VesselFrame::StreamDropped(_)),
            ) => {
                return Accepted::SetAside(SetAside::NotACall(other.type_name()));
            }
        };
        self.accept_call(call_id, capability, input, Taking::Yes)
    }

    /// Says what to do with an invoke, its input read already.
    pub(crate) fn accept_call(
        &mut self,
        call_id: Cow<'_, str>,
        capability: Cow<'_, str>,
        input: Input,
        taking: Taking,
    ) -> Accepted {
        if self.running.contains_key(call_id.as_ref()) {
            return Accepted::SetAside(SetAside::DuplicateCall(call_id.into_owned()));
        }
        // Never run twice, even after a reconnect: the vessel never
        // re-sends a call, so a repeat is a replay.
        let refused = match self.seen.insert(&call_id) {
            Ok(true) => None,
            Ok(false) => Some(CallRefusal::AlreadyReceived(call_id.to_string())),
            Err(refusal) => Some(refusal),
        };
        if let Some(refusal) = refused {
            let frame = refused_frame(&call_id, &capability, &refusal);
            return Accepted::Reply { frame, refusal };
        }
        if taking == Taking::No {
            let refusal = CallRefusal::ShuttingDown;
            let frame = refused_frame(&call_id, &capability, &refusal);
            return Accepted::Reply { frame, refusal };
        }
        if !self.declares(&capability) {
            let refusal = CallRefusal::UnknownCapability(capability.to_string());
            let frame = refused_frame(&call_id, &capability, &refusal);
            return Accepted::Reply { frame, refusal };
        }
        if let Some(declared) = self
            .bounded
            .iter()
            .find(|c| c.name() == capability.as_ref())
            && let Err(error) = bounded_input(declared, &input)
        {
            let refusal = CallRefusal::OutOfBounds {
                capability: capability.to_string(),
                why: error,
            };
            let frame = refused_frame(&call_id, &capability, &refusal);
            return Accepted::Reply { frame, refusal };
        }
        if self.running.len() >= self.max_in_flight {
            let refusal = CallRefusal::Busy(self.max_in_flight);
            let frame = refused_frame(&call_id, &capability, &refusal);
            return Accepted::Reply { frame, refusal };
        }
        let call_id = call_id.into_owned();
        let capability = capability.into_owned();
        self.running.insert(call_id.clone(), capability.clone());
        Accepted::Run(Invocation {
            call_id,
            capability,
            input,
        })
    }

    /// The `device:result` answering a running call with its handler's
    /// outcome (a result as JSON text, or an error's text); `None` when no
    /// call with that id runs (answered already, or never invoked). The
    /// call no longer runs after it.
    pub fn answer(&mut self, call_id: &str, outcome: Result<&str, &str>) -> Option<String> {
        let capability = self.running.remove(call_id)?;
        Some(result_frame(call_id, &capability, outcome))
    }

    /// The capability of the running call `call_id`.
    pub fn capability_of(&self, call_id: &str) -> Option<&str> {
        self.running.get(call_id).map(String::as_str)
    }

    /// Forgets the running calls (their connection ended: the vessel fails
    /// them itself); their ids stay remembered. Returns how many there were.
    pub fn abandon(&mut self) -> usize {
        let running = self.running.len();
        self.running.clear();
        running
    }
}

fn refused_frame(call_id: &str, capability: &str, refusal: &CallRefusal) -> String {
    let text = refusal.to_string();
    result_frame(call_id, capability, Err(&text))
}

/// `device:result` for a call; a result that is not JSON, or whose frame
/// the vessel would refuse (too large, nested too deep), answers an error
/// saying so instead.
pub fn result_frame(call_id: &str, capability: &str, outcome: Result<&str, &str>) -> String {
    let failed = outcome.is_err();
    let frame = match unchecked_result_frame(call_id, capability, outcome) {
        Ok(frame) => frame,
        Err(refusal) => return refused_frame(call_id, capability, &refusal),
    };
    let Some(why) = refused_by_vessel(&frame) else {
        return frame;
    };
    let refusal = CallRefusal::CannotBeSent {
        what: if failed { "error" } else { "result" },
        capability: capability.to_string(),
        why: why.to_string(),
    };
    let text = refusal.to_string();
    unchecked_result_frame(call_id, capability, Err(&text)).unwrap_or_default()
}

fn unchecked_result_frame(
    call_id: &str,
    capability: &str,
    outcome: Result<&str, &str>,
) -> Result<String, CallRefusal> {
    let frame = match outcome {
        Ok(result) => {
            let raw: &RawValue =
                serde_json::from_str(result).map_err(|e| CallRefusal::NotJson {
                    capability: capability.to_string(),
                    why: e.to_string(),
                })?;
            DeviceFrame::Result {
                call_id: Cow::Borrowed(call_id),
                ok: true,
                result: Some(Cow::Borrowed(raw)),
                error: None,
            }
        }
        Err(error) => DeviceFrame::Result {
            call_id: Cow::Borrowed(call_id),
            ok: false,
            result: None,
            error: Some(Cow::Borrowed(error)),
        },
    };
    Ok(frame.to_json())
}

/// Why the vessel would refuse `frame`, read by dk-proto's own parser with
/// the vessel's default limits (size, nesting depth): a frame the vessel
/// refuses counts as malformed there and, repeated, closes the connection,
/// so none is ever sent.
pub fn refused_by_vessel(frame: &str) -> Option<FrameError> {
    DeviceFrame::parse(frame.as_bytes()).err()
}

/// `device:event {capability, data}` for a declared capability, checked as
/// every outgoing frame is; `data` is JSON text.
pub fn event_frame(capability: &str, data: &str) -> Result<String, EventRefusal> {
    let raw: &RawValue =
        serde_json::from_str(data).map_err(|e| EventRefusal::NotJson(e.to_string()))?;
    let frame = DeviceFrame::Event {
        capability: Cow::Borrowed(capability),
        data: Some(Cow::Borrowed(raw)),
    }
    .to_json();
    match refused_by_vessel(&frame) {
        Some(why) => Err(EventRefusal::Refused(why.to_string())),
        None => Ok(frame),
    }
}

/// Why an event was not sent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventRefusal {
    /// The manifest declares no such capability (nor such an event).
    UnknownCapability(String),
    /// The event's data is not JSON.
    NotJson(String),
    /// The vessel would refuse the frame (too large, nested too deep).
    Refused(String),
    /// No connection is serving: nothing can be sent now.
    NotConnected,
}

impl fmt::Display for EventRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventRefusal::UnknownCapability(name) => write!(f, "unknown capability \"{name}\""),
            EventRefusal::NotJson(why) => write!(f, "event data is not JSON: {why}"),
            EventRefusal::Refused(why) => write!(f, "the vessel would refuse the event: {why}"),
            EventRefusal::NotConnected => f.write_str("no connection to the vessel"),
        }
    }
}

impl core::error::Error for EventRefusal {}

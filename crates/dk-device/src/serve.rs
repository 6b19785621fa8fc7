//! The device side of a connection: answers `device:invoke` frames with
//! `device:result` and forwards the device's own `device:event` frames.
//!
//! The loop is written against a [`Stream`] of incoming text frames and a
//! [`Sink`] of outgoing ones, so a WebSocket, a pair of channels in a test or
//! a pipe can carry it.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::hash::BuildHasher;
use std::time::Duration;

use dk_proto::{DeviceFrame, FrameError, VesselFrame};
use futures::{Sink, SinkExt as _, Stream, StreamExt as _};
use serde_json::{Map, Value};
use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::Instant;

use crate::device::CallError;
use crate::{Device, EventReceiver};

/// How long in-flight handlers may run once the incoming frames end, by default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// How many calls may run at once by default; a call beyond it is answered
/// with an error at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// How many call ids are remembered by default, so that a repeated one is
/// never run again (across reconnects of one client, too).
pub const DEFAULT_REMEMBERED_CALLS: usize = 1024;

/// Why [`serve_device`] stopped before its incoming frames ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServeError {
    /// Writing a frame to the outgoing sink failed; the connection is
    /// unusable. In-flight handlers were stopped.
    #[error("send failed: {0}")]
    Send(String),
    /// The loop was not run inside a Tokio runtime, which it needs to run
    /// handlers; nothing was read.
    #[error("serve_device must run inside a tokio runtime")]
    NoRuntime,
}

/// Something the vessel said, or a frame the loop set aside, reported to the
/// [`ServeOptions::on_notice`] hook. None of these needs an answer.
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub enum Notice {
    /// `device:pairing {code}`: the code to show the person.
    Pairing {
        /// Six digits.
        code: String,
    },
    /// `device:paired {deviceToken}`: the token to keep for reconnecting.
    Paired {
        /// The device token (a secret: `Debug` does not show it).
        device_token: String,
    },
    /// `device:revoked {capability?}`: a grant was revoked, or the whole
    /// pairing ended when there is no capability.
    Revoked {
        /// The capability revoked.
        capability: Option<String>,
    },
    /// A frame that did not parse as a vessel frame; it was ignored.
    Refused {
        /// Why it was refused.
        error: FrameError,
    },
    /// An invoke reusing a call id already received: ignored while that call
    /// runs, answered with an error once it has been answered; never run again.
    DuplicateCall {
        /// The repeated call id.
        call_id: String,
    },
    /// `device:invoke`: a call for a declared capability, about to run.
    Invoked {
        /// The call's id.
        call_id: String,
        /// The capability called.
        capability: String,
        /// The call's input.
        input: Map<String, Value>,
    },
}

impl fmt::Debug for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::Pairing { code } => f.debug_struct("Pairing").field("code", code).finish(),
            Notice::Paired { .. } => f
                .debug_struct("Paired")
                .field("device_token", &"<redacted>")
                .finish(),
            Notice::Revoked { capability } => f
                .debug_struct("Revoked")
                .field("capability", capability)
                .finish(),
            Notice::Refused { error } => f.debug_struct("Refused").field("error", error).finish(),
            Notice::DuplicateCall { call_id } => f
                .debug_struct("DuplicateCall")
                .field("call_id", call_id)
                .finish(),
            Notice::Invoked {
                call_id,
                capability,
                input,
            } => f
                .debug_struct("Invoked")
                .field("call_id", call_id)
                .field("capability", capability)
                .field("input", input)
                .finish(),
        }
    }
}

/// A hook receiving every [`Notice`].
type NoticeHook = Box<dyn FnMut(Notice) + Send>;

/// How [`serve_device_with`] runs. `ServeOptions::default()` is what
/// [`serve_device`] uses.
pub struct ServeOptions {
    grace: Duration,
    max_in_flight: usize,
    events: Option<EventReceiver>,
    on_notice: Option<NoticeHook>,
    seen: SeenCalls,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            grace: DEFAULT_GRACE,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            events: None,
            on_notice: None,
            seen: SeenCalls::new(DEFAULT_REMEMBERED_CALLS),
        }
    }
}

/// The call ids received lately, oldest first out, kept as keyed hashes so a
/// long id costs no more memory than a short one.
struct SeenCalls {
    hasher: RandomState,
    order: VecDeque<u64>,
    ids: HashSet<u64>,
    max: usize,
}

impl SeenCalls {
    fn new(max: usize) -> SeenCalls {
        SeenCalls {
            hasher: RandomState::new(),
            order: VecDeque::new(),
            ids: HashSet::new(),
            max: max.max(1),
        }
    }

    /// Remembers `call_id`; `false` when it was already remembered.
    fn insert(&mut self, call_id: &str) -> bool {
        let hash = self.hasher.hash_one(call_id);
        if !self.ids.insert(hash) {
            return false;
        }
        self.order.push_back(hash);
        while self.order.len() > self.max {
            if let Some(oldest) = self.order.pop_front() {
                self.ids.remove(&oldest);
            }
        }
        true
    }
}

impl fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeOptions")
            .field("grace", &self.grace)
            .field("max_in_flight", &self.max_in_flight)
            .field("events", &self.events.is_some())
            .field("on_notice", &self.on_notice.is_some())
            .field("remembered_calls", &self.seen.max)
            .finish()
    }
}

impl ServeOptions {
    /// The defaults: [`DEFAULT_GRACE`], [`DEFAULT_MAX_IN_FLIGHT`], no events,
    /// no hook.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long handlers still running when the incoming frames end may
    /// take to finish (their results are still sent); after it they are
    /// stopped.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// How many calls may run at once (at least one); an invoke beyond it is
    /// answered `device is busy: <n> calls in flight`.
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max.max(1);
        self
    }

    /// How many call ids to remember (at least one; default
    /// [`DEFAULT_REMEMBERED_CALLS`]). An invoke whose id is among them is
    /// never run: it is ignored while the first call runs and answered
    /// `call "<id>" was already received: not run again` after. The client
    /// keeps one set of options, so this holds across its reconnects.
    pub fn remember_calls(mut self, max: usize) -> Self {
        self.seen = SeenCalls::new(max);
        self
    }

    /// Forwards the events queued through the matching
    /// [`EventSender`](crate::EventSender) as `device:event` frames.
    pub fn events(mut self, events: EventReceiver) -> Self {
        self.events = Some(events);
        self
    }

    /// Calls `hook` with every [`Notice`]: each call about to run, pairing
    /// codes, the device token, revocations, and frames that were set aside.
    /// It runs on the loop, so it should return quickly.
    pub fn on_notice(mut self, hook: impl FnMut(Notice) + Send + 'static) -> Self {
        self.on_notice = Some(Box::new(hook));
        self
    }
}

/// Serves `device` with the default [`ServeOptions`]; see [`serve_device_with`].
pub async fn serve_device<S, K>(device: &Device, incoming: S, outgoing: K) -> Result<(), ServeError>
where
    S: Stream<Item = String> + Unpin,
    K: Sink<String> + Unpin,
    K::Error: fmt::Display,
{
    serve_device_with(device, incoming, outgoing, ServeOptions::default()).await
}

/// Serves `device` on one connection: reads vessel frames from `incoming`
/// and writes device frames to `outgoing`.
///
/// - Each `device:invoke` runs its handler as a task of its own, so several
///   calls are in flight at once, and is answered with
///   `device:result {callId, ok:true, result}` or `{callId, ok:false, error}`:
///   `unknown capability "<name>"`, the handler's message, or
///   `handler for "<name>" panicked`. A call id is run at most once: an
///   invoke reusing the id of a call still running is ignored, and one
///   reusing the id of a call already answered (among the last
///   [`ServeOptions::remember_calls`]) is answered with an error.
/// - Frames that do not parse, and frames that are not invokes, never stop
///   the loop; they are reported to the [`ServeOptions::on_notice`] hook.
/// - When `incoming` ends, handlers still running get the grace period to
///   finish (their results are sent), then are stopped; nothing is left
///   running when this returns `Ok(())`. The sink is not closed.
/// - It fails only when `outgoing` does, after stopping every handler.
///
/// Must run inside a Tokio runtime with time enabled. A handler that blocks
/// its thread instead of awaiting cannot be stopped.
pub async fn serve_device_with<S, K>(
    device: &Device,
    mut incoming: S,
    mut outgoing: K,
    mut options: ServeOptions,
) -> Result<(), ServeError>
where
    S: Stream<Item = String> + Unpin,
    K: Sink<String> + Unpin,
    K::Error: fmt::Display,
{
    serve_session(device, &mut incoming, &mut outgoing, &mut options).await
}

/// [`serve_device_with`] keeping the options, so one queue of events and one
/// hook serve connection after connection.
pub(crate) async fn serve_session<S, K>(
    device: &Device,
    incoming: &mut S,
    outgoing: &mut K,
    options: &mut ServeOptions,
) -> Result<(), ServeError>
where
    S: Stream<Item = String> + Unpin,
    K: Sink<String> + Unpin,
    K::Error: fmt::Display,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ServeError::NoRuntime);
    }
    let mut calls = Calls::new(device.clone(), options.max_in_flight);
    let result = run(&mut calls, incoming, outgoing, options).await;
    calls.tasks.shutdown().await;
    result
}

async fn run<S, K>(
    calls: &mut Calls,
    incoming: &mut S,
    outgoing: &mut K,
    options: &mut ServeOptions,
) -> Result<(), ServeError>
where
    S: Stream<Item = String> + Unpin,
    K: Sink<String> + Unpin,
    K::Error: fmt::Display,
{
    let mut deadline: Option<Instant> = None;
    loop {
        if deadline.is_some() && calls.tasks.is_empty() {
            return Ok(());
        }
        tokio::select! {
            text = incoming.next(), if deadline.is_none() => match text {
                Some(text) => {
                    if let Some(reply) = calls.accept(&text, &mut options.seen, &mut options.on_notice) {
                        send(outgoing, reply).await?;
                    }
                }
                None => deadline = Some(Instant::now() + options.grace),
            },
            Some(done) = calls.tasks.join_next_with_id(), if !calls.tasks.is_empty() => {
                if let Some(reply) = calls.answer(done) {
                    send(outgoing, reply).await?;
                }
            }
            event = next_event(&mut options.events), if options.events.is_some() => match event {
                Some(frame) => send(outgoing, frame).await?,
                None => options.events = None,
            },
            () = sleep_until(deadline), if deadline.is_some() => return Ok(()),
        }
    }
}

async fn next_event(events: &mut Option<EventReceiver>) -> Option<String> {
    match events {
        Some(events) => events.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn send<K>(outgoing: &mut K, frame: String) -> Result<(), ServeError>
where
    K: Sink<String> + Unpin,
    K::Error: fmt::Display,
{
    outgoing
        .send(frame)
        .await
        .map_err(|e| ServeError::Send(e.to_string()))
}

/// A call whose handler is running.
struct Call {
    call_id: String,
    capability: String,
}

/// The calls in flight: one task each in a set the loop owns.
struct Calls {
    device: Device,
    max: usize,
    tasks: JoinSet<Result<Value, CallError>>,
    by_task: HashMap<Id, Call>,
    call_ids: HashSet<String>,
}

impl Calls {
    fn new(device: Device, max: usize) -> Self {
        Calls {
            device,
            max,
            tasks: JoinSet::new(),
            by_task: HashMap::new(),
            call_ids: HashSet::new(),
        }
    }

    /// Handles one incoming frame: starts a call, or answers at once, or
    /// reports it.
    fn accept(
        &mut self,
        text: &str,
        seen: &mut SeenCalls,
        hook: &mut Option<NoticeHook>,
    ) -> Option<String> {
        let notify = |hook: &mut Option<NoticeHook>, notice| {
            if let Some(hook) = hook {
                hook(notice);
            }
        };
        let frame = match VesselFrame::parse(text.as_bytes()) {
            Ok(frame) => frame,
            Err(error) => {
                notify(hook, Notice::Refused { error });
                return None;
            }
        };
        match frame {
            VesselFrame::Invoke {
                call_id,
                capability,
                input,
            } => {
                if self.call_ids.contains(call_id.as_ref()) {
                    let call_id = call_id.into_owned();
                    notify(hook, Notice::DuplicateCall { call_id });
                    return None;
                }
                // Never run twice, even after a reconnect: the vessel never
                // re-sends a call, so a repeat is a replay.
                if !seen.insert(&call_id) {
                    let error = CallError::AlreadyReceived(call_id.to_string()).to_string();
                    let reply = result_frame(&call_id, &capability, Err(error));
                    let call_id = call_id.into_owned();
                    notify(hook, Notice::DuplicateCall { call_id });
                    return Some(reply);
                }
                if !self.device.has_capability(&capability) {
                    let error = CallError::UnknownCapability(capability.to_string()).to_string();
                    return Some(result_frame(&call_id, &capability, Err(error)));
                }
                if self.tasks.len() >= self.max {
                    let error = CallError::Busy(self.max).to_string();
                    return Some(result_frame(&call_id, &capability, Err(error)));
                }
                let input = input.into_owned();
                if let Some(hook) = hook {
                    hook(Notice::Invoked {
                        call_id: call_id.clone().into_owned(),
                        capability: capability.clone().into_owned(),
                        input: input.clone(),
                    });
                }
                let task = self.tasks.spawn(self.device.call(&capability, input));
                let call_id = call_id.into_owned();
                self.call_ids.insert(call_id.clone());
                self.by_task.insert(
                    task.id(),
                    Call {
                        call_id,
                        capability: capability.into_owned(),
                    },
                );
                None
            }
            VesselFrame::Pairing { code } => {
                let code = code.into_owned();
                notify(hook, Notice::Pairing { code });
                None
            }
            VesselFrame::Paired { device_token } => {
                let device_token = device_token.into_owned();
                notify(hook, Notice::Paired { device_token });
                None
            }
            // dk/2's pairing and closing frames: `VesselFrame::parse` reads
            // v1, which has none of them.
            VesselFrame::PairCommit { .. }
            | VesselFrame::PairReveal { .. }
            | VesselFrame::KeyPaired
            | VesselFrame::Closing { .. } => None,
            VesselFrame::Error { error } => {
                let message = error.escape_debug().to_string();
                tracing::warn!(%message, "the vessel reported an error");
                None
            }
            VesselFrame::Revoked { capability } => {
                let capability = capability.map(Cow::into_owned);
                match &capability {
                    Some(capability) => {
                        tracing::info!(capability = %capability.escape_debug(), "grant revoked");
                    }
                    None => tracing::warn!("pairing ended by the vessel"),
                }
                notify(hook, Notice::Revoked { capability });
                None
            }
        }
    }

    /// The result frame of a finished task.
    fn answer(
        &mut self,
        done: Result<(Id, Result<Value, CallError>), JoinError>,
    ) -> Option<String> {
        let (id, outcome) = match done {
            Ok((id, outcome)) => (id, Ok(outcome)),
            Err(error) => (error.id(), Err(error)),
        };
        let call = self.by_task.remove(&id)?;
        self.call_ids.remove(&call.call_id);
        let outcome = match outcome {
            Ok(outcome) => outcome.map_err(|error| error.to_string()),
            Err(error) if error.is_panic() => {
                Err(CallError::Panicked(call.capability.clone()).to_string())
            }
            Err(_) => Err(CallError::Stopped(call.capability.clone()).to_string()),
        };
        Some(result_frame(&call.call_id, &call.capability, outcome))
    }
}

/// `device:result` for a call; a result that cannot be written as JSON,
/// or whose frame the vessel would refuse (too large, nested too deep),
/// answers an error saying so instead.
fn result_frame(call_id: &str, capability: &str, outcome: Result<Value, String>) -> String {
    let failed = outcome.is_err();
    let frame = unchecked_result_frame(call_id, capability, outcome);
    let Some(why) = crate::outgoing::refused_by_vessel(&frame) else {
        return frame;
    };
    let what = if failed { "error" } else { "result" };
    tracing::warn!(capability = %capability.escape_debug(), "{what} not sent: {why}");
    unchecked_result_frame(
        call_id,
        capability,
        Err(CallError::CannotBeSent {
            what,
            capability: capability.to_owned(),
            why: why.to_string(),
        }
        .to_string()),
    )
}

fn unchecked_result_frame(
    call_id: &str,
    capability: &str,
    outcome: Result<Value, String>,
) -> String {
    let outcome = outcome.and_then(|value| {
        serde_json::value::to_raw_value(&value).map_err(|e| {
            CallError::NotJson {
                capability: capability.to_owned(),
                why: e.to_string(),
            }
            .to_string()
        })
    });
    let frame = match outcome {
        Ok(result) => DeviceFrame::Result {
            call_id: Cow::Borrowed(call_id),
            ok: true,
            result: Some(Cow::Owned(result)),
            error: None,
        },
        Err(error) => DeviceFrame::Result {
            call_id: Cow::Borrowed(call_id),
            ok: false,
            result: None,
            error: Some(Cow::Owned(error)),
        },
    };
    frame.to_json()
}

#[cfg(test)]
mod tests;

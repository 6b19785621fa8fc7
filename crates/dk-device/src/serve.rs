//! The device side of a connection: answers `device:invoke` frames with
//! `device:result` and forwards the device's own `device:event` frames.
//!
//! The loop is written against a [`Stream`] of incoming text frames and a
//! [`Sink`] of outgoing ones, so a WebSocket, a pair of channels in a test or
//! a pipe can carry it.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use dk_device_core::{Accepted, CallRefusal, Calls, Channel, Config, Invocation, SetAside};
use dk_proto::{FrameError, FrameLimits, VesselFrame};
use futures::{Sink, SinkExt as _, Stream, StreamExt as _};
use serde_json::{Map, Value};
use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::Instant;

use crate::device::CallError;
use crate::{Device, EventReceiver};

/// How long in-flight handlers may run once the incoming frames end, by default.
pub const DEFAULT_GRACE: Duration = dk_device_core::reconnect::DEFAULT_GRACE;

/// How many calls may run at once by default; a call beyond it is answered
/// with an error at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = dk_device_core::DEFAULT_MAX_IN_FLIGHT;

/// How many call ids are remembered by default, so that a repeated one is
/// never run again (across reconnects of one client, too).
pub const DEFAULT_REMEMBERED_CALLS: usize = dk_device_core::DEFAULT_REMEMBERED_CALLS;

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
    remember_calls: usize,
    events: Option<EventReceiver>,
    on_notice: Option<NoticeHook>,
    /// The calls' rules, made at the first session and kept for the next
    /// ones (the call ids seen, across a client's reconnects).
    calls: Option<Calls>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            grace: DEFAULT_GRACE,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            remember_calls: DEFAULT_REMEMBERED_CALLS,
            events: None,
            on_notice: None,
            calls: None,
        }
    }
}

impl fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeOptions")
            .field("grace", &self.grace)
            .field("max_in_flight", &self.max_in_flight)
            .field("events", &self.events.is_some())
            .field("on_notice", &self.on_notice.is_some())
            .field("remembered_calls", &self.remember_calls)
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
        self.calls = None;
        self
    }

    /// How many call ids to remember (at least one; default
    /// [`DEFAULT_REMEMBERED_CALLS`]). An invoke whose id is among them is
    /// never run: it is ignored while the first call runs and answered
    /// `call "<id>" was already received: not run again` after. The client
    /// keeps one set of options, so this holds across its reconnects.
    pub fn remember_calls(mut self, max: usize) -> Self {
        self.remember_calls = max.max(1);
        self.calls = None;
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

impl ServeOptions {
    /// The device core's settings for these options: calls at once and
    /// call ids remembered.
    pub(crate) fn core_config(&self, channel: Channel) -> Config {
        Config {
            channel,
            max_in_flight: self.max_in_flight,
            remember_calls: self.remember_calls,
            ..Config::default()
        }
    }

    /// How long running handlers may finish once the session ends.
    pub(crate) fn grace_period(&self) -> Duration {
        self.grace
    }

    /// The queue of events, while it is open.
    pub(crate) fn events_mut(&mut self) -> &mut Option<EventReceiver> {
        &mut self.events
    }

    /// Tells the notice hook, if there is one.
    pub(crate) fn notify(&mut self, notice: Notice) {
        if let Some(hook) = &mut self.on_notice {
            hook(notice);
        }
    }

    /// The calls' rules for `device`, kept from one session to the next.
    fn calls_for(&mut self, device: &Device) -> &mut Calls {
        let (max_in_flight, remember) = (self.max_in_flight, self.remember_calls);
        self.calls.get_or_insert_with(|| {
            Calls::new(
                device.manifest(),
                max_in_flight,
                remember,
                rand::random::<[u8; 16]>(),
            )
        })
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

/// [`serve_device_with`] keeping the options, so one queue of events, one
/// hook and one set of call ids serve connection after connection.
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
    let mut handlers = Handlers::new(device.clone());
    let result = run(device, &mut handlers, incoming, outgoing, options).await;
    handlers.stop().await;
    // The session's calls are the vessel's to fail; their ids stay seen.
    options.calls_for(device).abandon();
    result
}

async fn run<S, K>(
    device: &Device,
    handlers: &mut Handlers,
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
        if deadline.is_some() && handlers.is_empty() {
            return Ok(());
        }
        tokio::select! {
            text = incoming.next(), if deadline.is_none() => match text {
                Some(text) => {
                    // Read once; the calls' rules take the frame as read.
                    let accepted = match VesselFrame::parse_keeping_input(
                        text.as_bytes(),
                        FrameLimits::default(),
                        Channel::V1,
                    ) {
                        Ok(read) => options.calls_for(device).accept(read),
                        Err(error) => Accepted::SetAside(SetAside::Refused(error)),
                    };
                    if let Some(reply) = take_call(handlers, options, accepted) {
                        send(outgoing, reply).await?;
                    }
                }
                None => deadline = Some(Instant::now() + options.grace),
            },
            Some(done) = handlers.next(), if !handlers.is_empty() => {
                let (call_id, outcome) = done;
                let outcome = outcome.as_deref().map_err(String::as_str);
                if let Some(reply) = options.calls_for(device).answer(&call_id, outcome) {
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

/// Does what the calls' rules made of a vessel frame: starts the call's
/// handler, or gives the refusal to send, or reports the frame set aside.
pub(crate) fn take_call(
    handlers: &mut Handlers,
    options: &mut ServeOptions,
    accepted: Accepted,
) -> Option<String> {
    match accepted {
        Accepted::Run(invocation) => {
            options.notify(Notice::Invoked {
                call_id: invocation.call_id.clone(),
                capability: invocation.capability.clone(),
                input: invocation.input.to_map(),
            });
            handlers.spawn(invocation);
            None
        }
        Accepted::Reply { frame, refusal } => {
            if let CallRefusal::AlreadyReceived(call_id) = refusal {
                options.notify(Notice::DuplicateCall { call_id });
            }
            Some(frame)
        }
        Accepted::SetAside(aside) => {
            set_aside(options, aside);
            None
        }
    }
}

/// Reports a frame the calls' rules set aside.
pub(crate) fn set_aside(options: &mut ServeOptions, aside: SetAside) {
    match aside {
        SetAside::Refused(error) => options.notify(Notice::Refused { error }),
        SetAside::DuplicateCall(call_id) => options.notify(Notice::DuplicateCall { call_id }),
        SetAside::Pairing(code) => options.notify(Notice::Pairing { code }),
        SetAside::Paired(device_token) => options.notify(Notice::Paired { device_token }),
        SetAside::Revoked(capability) => {
            match &capability {
                Some(capability) => {
                    tracing::info!(capability = %capability.escape_debug(), "grant revoked");
                }
                None => tracing::warn!("pairing ended by the vessel"),
            }
            options.notify(Notice::Revoked { capability });
        }
        SetAside::VesselError(error) => {
            let message = error.escape_debug().to_string();
            tracing::warn!(%message, "the vessel reported an error");
        }
        // dk/2's pairing and closing frames, which the connection reads.
        _ => {}
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

/// The handlers running: one task each in a set their owner holds.
pub(crate) struct Handlers {
    device: Device,
    tasks: JoinSet<Result<Value, CallError>>,
    by_task: HashMap<Id, Call>,
}

impl Handlers {
    pub(crate) fn new(device: Device) -> Self {
        Handlers {
            device,
            tasks: JoinSet::new(),
            by_task: HashMap::new(),
        }
    }

    /// Whether no handler runs.
    pub(crate) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Runs the call's handler in a task of its own.
    pub(crate) fn spawn(&mut self, invocation: Invocation) {
        let Invocation {
            call_id,
            capability,
            input,
        } = invocation;
        let task = self
            .tasks
            .spawn(self.device.call(&capability, input.to_map()));
        self.by_task.insert(
            task.id(),
            Call {
                call_id,
                capability,
            },
        );
    }

    /// The next call whose handler finished, with its outcome: the result
    /// as JSON text, or the error's text. Waits forever when none runs.
    pub(crate) async fn next(&mut self) -> Option<(String, Result<String, String>)> {
        loop {
            let done = self.tasks.join_next_with_id().await?;
            if let Some(answer) = self.finished(done) {
                return Some(answer);
            }
        }
    }

    /// The call and outcome of a finished task.
    fn finished(
        &mut self,
        done: Result<(Id, Result<Value, CallError>), JoinError>,
    ) -> Option<(String, Result<String, String>)> {
        let (id, outcome) = match done {
            Ok((id, outcome)) => (id, Ok(outcome)),
            Err(error) => (error.id(), Err(error)),
        };
        let call = self.by_task.remove(&id)?;
        let outcome = match outcome {
            Ok(Ok(value)) => serde_json::to_string(&value).map_err(|e| {
                CallError::NotJson {
                    capability: call.capability.clone(),
                    why: e.to_string(),
                }
                .to_string()
            }),
            Ok(Err(error)) => Err(error.to_string()),
            Err(error) if error.is_panic() => {
                Err(CallError::Panicked(call.capability.clone()).to_string())
            }
            Err(_) => Err(CallError::Stopped(call.capability.clone()).to_string()),
        };
        Some((call.call_id, outcome))
    }

    /// Stops every handler still running.
    pub(crate) async fn stop(&mut self) {
        self.tasks.shutdown().await;
        self.by_task.clear();
    }
}

#[cfg(test)]
mod tests;

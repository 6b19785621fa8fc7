//! Links to connected devices: the [`DeviceLink`] trait the adapter calls
//! through, the table of connected devices, and the [`CallCorrelator`] that
//! matches `device:result` frames to `device:invoke` calls.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use crate::hook::Hook;
use dk_proto::{DeviceFrame, InvokeError, LinkClosed, SendError, VesselFrame};
use futures::future::BoxFuture;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

/// A device's answer: `Ok` with the result (`None` when the device sent no
/// `result` key), or `Err` with the device's own error or the vessel's
/// failure to reach it; its text is what the caller sees after
/// `device error: `.
pub type InvokeResult = Result<Option<Box<RawValue>>, InvokeError>;

/// Anything that can carry a capability call to a device and bring back the
/// answer: a WebSocket connection, an in-process pipe, a test double.
pub trait DeviceLink: Send + Sync {
    /// Calls `capability` with the validated `input`, waiting at most `timeout`.
    fn invoke<'a>(
        &'a self,
        capability: &'a str,
        input: &'a Map<String, Value>,
        timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult>;

    /// Ends the link: pending and later calls fail, saying `why`. Used
    /// when a newer connection of the same device replaces this one. Does
    /// nothing by default.
    fn close(&self, why: LinkClosed) {
        let _ = why;
    }
}

/// Where a correlator writes its `device:invoke` frames.
pub trait FrameSink: Send + Sync {
    /// Sends one text frame; the error says why it could not be sent.
    fn send_frame(&self, text: String) -> BoxFuture<'_, Result<(), SendError>>;
}

/// A channel to a writer task: never waits; a full channel is an error.
impl FrameSink for mpsc::Sender<String> {
    fn send_frame(&self, text: String) -> BoxFuture<'_, Result<(), SendError>> {
        let sent = self.try_send(text).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => SendError::BackedUp,
            mpsc::error::TrySendError::Closed(_) => SendError::Closed,
        });
        Box::pin(std::future::ready(sent))
    }
}

/// Devices connected to other vessels of a fleet, reached through the
/// vessel that holds each: the adapter's last check calls one when the
/// device is not connected here.
pub trait RemoteLinks: Send + Sync {
    /// A link to `device_id` through the member holding it, when one does.
    fn reach(&self, device_id: &str) -> Option<Arc<dyn DeviceLink>>;

    /// The name of the other member `device_id` is connected to, if any.
    fn holder(&self, device_id: &str) -> Option<String>;
}

/// The connected devices, by id. At most one link per device: connecting
/// again replaces the old link.
#[derive(Default)]
pub struct Links {
    links: RwLock<HashMap<String, Arc<dyn DeviceLink>>>,
    /// Where a device not connected here is reached, in a fleet.
    remote: Hook<dyn RemoteLinks>,
    /// Counts every connect and disconnect, so a watcher can tell cheaply
    /// whether the set changed, and wait for it to.
    changes: tokio::sync::watch::Sender<u64>,
}

impl fmt::Debug for Links {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self
            .links
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("Links").field("connected", &count).finish()
    }
}

impl Links {
    /// No device connected.
    pub fn new() -> Links {
        Links::default()
    }

    /// Records `link` as the way to reach `device_id`, returning the link it replaces.
    pub fn connect(
        &self,
        device_id: &str,
        link: Arc<dyn DeviceLink>,
    ) -> Option<Arc<dyn DeviceLink>> {
        let replaced = self
            .links
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(device_id.to_owned(), link);
        self.changes.send_modify(|n| *n += 1);
        replaced
    }

    /// Forgets the link of `device_id`, but only if it is still `link`
    /// (a newer connection of the same device stays).
    pub fn disconnect(&self, device_id: &str, link: &Arc<dyn DeviceLink>) {
        let mut links = self.links.write().unwrap_or_else(PoisonError::into_inner);
        if links.get(device_id).is_some_and(|l| Arc::ptr_eq(l, link)) {
            links.remove(device_id);
            drop(links);
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Reaches devices not connected here through `remote` (a fleet's
    /// other members) from now on.
    pub fn set_remote(&self, remote: Arc<dyn RemoteLinks>) {
        self.remote.set(remote);
    }

    /// The way to call `device_id`: its link here when it is connected
    /// here, else through the fleet member holding it, if any.
    pub fn reach(&self, device_id: &str) -> Option<Arc<dyn DeviceLink>> {
        if let Some(link) = self.get(device_id) {
            return Some(link);
        }
        self.remote()?.reach(device_id)
    }

    /// The fleet member `device_id` is connected to, when it is not
    /// connected here but to another member.
    pub fn held_elsewhere(&self, device_id: &str) -> Option<String> {
        if self.is_connected(device_id) {
            return None;
        }
        self.remote()?.holder(device_id)
    }

    /// Where devices not connected here are reached, when in a fleet.
    fn remote(&self) -> Option<Arc<dyn RemoteLinks>> {
        self.remote.get()
    }

    /// The ids of the devices connected here, in no order.
    pub fn ids(&self) -> Vec<String> {
        self.links
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// How many times a device connected or disconnected so far: equal
    /// counts mean [`Links::ids`] did not change between them.
    pub fn changes(&self) -> u64 {
        *self.changes.borrow()
    }

    /// [`Links::changes`] from now on, to wait for the next change.
    pub fn watch_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The link of `device_id`, when it is connected.
    pub fn get(&self, device_id: &str) -> Option<Arc<dyn DeviceLink>> {
        self.links
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(device_id)
            .cloned()
    }

    /// How many devices are connected.
    pub fn count(&self) -> usize {
        self.links
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether `device_id` is connected.
    pub fn is_connected(&self, device_id: &str) -> bool {
        self.links
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(device_id)
    }
}

/// Calls in flight on one connection at most, by default.
pub const DEFAULT_MAX_PENDING: usize = 64;

/// What the correlator did with a frame from the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// A result settled a pending call.
    Settled,
    /// A result for a call that is not pending (unknown, late or repeated): ignored.
    UnknownCall,
    /// Not a result: the caller decides (events, a stray hello, ...).
    NotAResult,
}

/// Vessel side of one connection: sends `device:invoke` frames as text
/// through a channel, matches `device:result` frames by callId, times calls
/// out, and fails every pending call at once when the connection closes.
/// Nothing is ever re-sent.
pub struct CallCorrelator {
    out: Arc<dyn FrameSink>,
    state: Mutex<State>,
    max_pending: usize,
    unknown_results: AtomicU64,
    closed: tokio::sync::Notify,
}

struct State {
    pending: HashMap<String, oneshot::Sender<InvokeResult>>,
    closed: Option<LinkClosed>,
}

impl fmt::Debug for CallCorrelator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallCorrelator")
            .field("pending", &self.pending_calls())
            .finish()
    }
}

impl CallCorrelator {
    /// A correlator writing frames to `out`, with at most
    /// [`DEFAULT_MAX_PENDING`] calls in flight.
    pub fn new(out: impl FrameSink + 'static) -> CallCorrelator {
        CallCorrelator::with_max_pending(out, DEFAULT_MAX_PENDING)
    }

    /// A correlator with its own cap on calls in flight.
    pub fn with_max_pending(out: impl FrameSink + 'static, max_pending: usize) -> CallCorrelator {
        CallCorrelator {
            out: Arc::new(out),
            state: Mutex::new(State {
                pending: HashMap::new(),
                closed: None,
            }),
            max_pending,
            unknown_results: AtomicU64::new(0),
            closed: tokio::sync::Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Calls in flight.
    pub fn pending_calls(&self) -> usize {
        self.state().pending.len()
    }

    /// Results that matched no pending call, so far.
    pub fn unknown_results(&self) -> u64 {
        self.unknown_results.load(Ordering::Relaxed)
    }

    /// Feeds in a frame from the device. A `device:result` settles its call:
    /// `ok:false` without error text reads `device error`.
    pub fn handle(&self, frame: &DeviceFrame<'_>) -> Handled {
        let DeviceFrame::Result {
            call_id,
            ok,
            result,
            error,
        } = frame
        else {
            return Handled::NotAResult;
        };
        let Some(settle) = self.state().pending.remove(call_id.as_ref()) else {
            self.unknown_results.fetch_add(1, Ordering::Relaxed);
            return Handled::UnknownCall;
        };
        let outcome = if *ok {
            Ok(result.as_ref().map(|r| r.as_ref().to_owned()))
        } else {
            Err(InvokeError::Device(
                error
                    .as_deref()
                    .unwrap_or(InvokeError::NO_DEVICE_TEXT)
                    .to_owned(),
            ))
        };
        // The caller may have timed out a moment ago; then nobody listens.
        let _ = settle.send(outcome);
        Handled::Settled
    }

    /// Fails every pending call, saying `why`, and refuses new ones: the
    /// connection is gone.
    pub fn close(&self, why: LinkClosed) {
        let pending = {
            let mut state = self.state();
            state.closed.get_or_insert(why);
            std::mem::take(&mut state.pending)
        };
        for (_, settle) in pending {
            let _ = settle.send(Err(InvokeError::Closed(why)));
        }
        self.closed.notify_waiters();
    }

    /// Why the correlator was closed, if it was.
    pub fn closed_reason(&self) -> Option<LinkClosed> {
        self.state().closed
    }

    /// Waits until [`CallCorrelator::close`] is called, and returns why.
    pub async fn closed(&self) -> LinkClosed {
        loop {
            let notified = self.closed.notified();
            if let Some(reason) = self.closed_reason() {
                return reason;
            }
            notified.await;
        }
    }

    async fn call(
        &self,
        capability: &str,
        input: &Map<String, Value>,
        timeout: Duration,
    ) -> InvokeResult {
        // A random (v4) UUID from the thread's CSPRNG: no system call per call.
        let call_id = uuid::Builder::from_random_bytes(rand::random())
            .into_uuid()
            .to_string();
        let (settle, answer) = oneshot::channel();
        {
            let mut state = self.state();
            if let Some(why) = state.closed {
                return Err(InvokeError::Closed(why));
            }
            if state.pending.len() >= self.max_pending {
                return Err(InvokeError::TooManyInFlight(self.max_pending));
            }
            state.pending.insert(call_id.clone(), settle);
        }
        // From here on the slot is given back however the call ends,
        // including when its caller stops waiting and drops this future.
        let mut slot = Slot {
            correlator: self,
            call_id: &call_id,
            answered: false,
        };
        let frame = VesselFrame::Invoke {
            call_id: Cow::Borrowed(&call_id),
            capability: Cow::Borrowed(capability),
            input: Cow::Borrowed(input),
        };
        // The send counts against the call's time too: a device that stops
        // reading cannot hold the caller past its timeout.
        let deadline = tokio::time::Instant::now() + timeout;
        let sent = tokio::time::timeout_at(deadline, self.out.send_frame(frame.to_json())).await;
        let failed = match sent {
            Ok(Ok(())) => None,
            Ok(Err(why)) => Some(InvokeError::Send(why)),
            Err(_) => Some(InvokeError::SendTimeout(timeout)),
        };
        if let Some(why) = failed {
            return Err(why);
        }
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(settled) => {
                // Whoever settled it (an answer, or closing) took it out.
                slot.answered = true;
                // The settle side dropped without an answer: treat as closed.
                settled.unwrap_or(Err(InvokeError::Closed(LinkClosed::Dropped)))
            }
            Err(_) => Err(InvokeError::Timeout(timeout)),
        }
    }
}

/// A call's place among the pending calls, taken out when the call ends
/// without an answer: it failed to send, timed out, or its caller gave up
/// (an agent's HTTP request cut, a task aborted). Without this, a call
/// abandoned while its device never answers would hold its place until the
/// connection ends, and enough of them would refuse every later call as
/// too many in flight.
struct Slot<'a> {
    correlator: &'a CallCorrelator,
    call_id: &'a str,
    /// Settled through the map, which already let the place go.
    answered: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.correlator.state().pending.remove(self.call_id);
        }
    }
}

impl DeviceLink for CallCorrelator {
    fn invoke<'a>(
        &'a self,
        capability: &'a str,
        input: &'a Map<String, Value>,
        timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        Box::pin(self.call(capability, input, timeout))
    }

    fn close(&self, why: LinkClosed) {
        CallCorrelator::close(self, why);
    }
}

/// Something a connected device noticed (`device:event`).
#[derive(Debug, Clone)]
pub struct DeviceEvent {
    /// The device that sent it.
    pub device_id: String,
    /// The capability it belongs to.
    pub capability: String,
    /// Its data, as sent (`None` when the frame had none).
    pub data: Option<Box<RawValue>>,
}

/// What [`pump_device_frames`] saw on a connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PumpReport {
    /// Results that settled a call.
    pub settled: u64,
    /// Results for calls that were not pending.
    pub unknown_results: u64,
    /// Events delivered to the subscriber.
    pub events: u64,
    /// Events dropped because the subscriber was full or absent.
    pub events_dropped: u64,
    /// Frames that did not parse, or that a device may not send after auth.
    pub refused: u64,
}

/// Reads text frames from an authenticated device until the stream ends:
/// results go to `correlator`, events to `events` (without waiting: a full
/// subscriber loses the event, never stalls the device), anything else is
/// counted and dropped. When the stream ends every pending call fails at once
/// with `device disconnected`.
pub async fn pump_device_frames<S>(
    device_id: &str,
    correlator: &CallCorrelator,
    mut incoming: S,
    events: Option<&mpsc::Sender<DeviceEvent>>,
) -> PumpReport
where
    S: futures::Stream<Item = String> + Unpin,
{
    use futures::StreamExt;

    let mut report = PumpReport::default();
    while let Some(text) = incoming.next().await {
        let Ok(frame) = DeviceFrame::parse(text.as_bytes()) else {
            report.refused += 1;
            continue;
        };
        match correlator.handle(&frame) {
            Handled::Settled => report.settled += 1,
            Handled::UnknownCall => report.unknown_results += 1,
            Handled::NotAResult => match frame {
                DeviceFrame::Event { capability, data } => {
                    let event = DeviceEvent {
                        device_id: device_id.to_owned(),
                        capability: capability.into_owned(),
                        data: data.map(|d| d.into_owned()),
                    };
                    match events.map(|tx| tx.try_send(event)) {
                        Some(Ok(())) => report.events += 1,
                        _ => report.events_dropped += 1,
                    }
                }
                _ => report.refused += 1,
            },
        }
    }
    correlator.close(LinkClosed::Disconnected);
    report
}

#[cfg(test)]
mod tests;

//! Calls that cross the fleet: a device connected to another member is
//! reached through it ([`FleetLinks`], [`RoutedLink`]), and a call another
//! member carries here is handed to the device ([`carry`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dk_core::Vessel;
use dk_core::link::{DeviceLink, InvokeResult, RemoteLinks};
use dk_fleet::{Fleet, MemberId, RequestError};
use dk_proto::InvokeError;
use futures::future::BoxFuture;
use serde_json::{Map, Value};

use super::wire::{self, Ask, Reply};

/// What a routed call adds to the call's own time before the member asking
/// gives up on the member holding the device: that member's answer, even
/// "did not answer within", comes back in the words of a local call.
const ROUTING_MARGIN: Duration = Duration::from_secs(1);

/// Devices connected to other members, reached through them.
pub(super) struct FleetLinks {
    pub(super) fleet: Arc<Fleet>,
}

impl RemoteLinks for FleetLinks {
    fn reach(&self, device_id: &str) -> Option<Arc<dyn DeviceLink>> {
        if !self.fleet.is_connected() {
            // Whether another member holds it cannot be known: say why.
            return Some(Arc::new(Unreachable));
        }
        let holder = self.fleet.holder_of(device_id)?;
        if holder == *self.fleet.member() {
            // Announced from here but gone meanwhile: not connected.
            return None;
        }
        Some(Arc::new(RoutedLink {
            fleet: Arc::clone(&self.fleet),
            holder,
            device: device_id.to_owned(),
        }))
    }

    fn holder(&self, device_id: &str) -> Option<String> {
        let holder = self.fleet.holder_of(device_id)?;
        (holder != *self.fleet.member()).then(|| holder.as_str().to_owned())
    }
}

/// A device not connected here while the fleet's NATS connection is down.
struct Unreachable;

impl DeviceLink for Unreachable {
    fn invoke<'a>(
        &'a self,
        _: &'a str,
        _: &'a Map<String, Value>,
        _: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        Box::pin(std::future::ready(Err(InvokeError::Routed(
            "fleet: the fleet's NATS connection is down: a device not connected to this \
             vessel cannot be reached"
                .to_owned(),
        ))))
    }
}

/// A device connected to another member, called through it.
struct RoutedLink {
    fleet: Arc<Fleet>,
    holder: MemberId,
    device: String,
}

impl DeviceLink for RoutedLink {
    fn invoke<'a>(
        &'a self,
        capability: &'a str,
        input: &'a Map<String, Value>,
        timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        Box::pin(async move {
            let ask = Ask::Invoke {
                device: self.device.clone(),
                capability: capability.to_owned(),
                input: input.clone(),
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            };
            let deadline = Instant::now() + timeout + ROUTING_MARGIN;
            let reply = self
                .fleet
                .request(&self.holder, &wire::encode(&ask), deadline)
                .await
                .map_err(|e| routed(&e))?;
            match wire::decode::<Reply>(&reply) {
                Ok(Reply::Invoked { result }) => Ok(result),
                Ok(Reply::Failed { error }) => Err(error),
                Ok(Reply::NotUnderstood { kind, version }) => Err(InvokeError::Routed(format!(
                    "fleet: member `{}` did not understand the call (`{kind}`, version {version})",
                    self.holder
                ))),
                Ok(_) => Err(InvokeError::Routed(
                    "fleet: a reply of another kind".to_owned(),
                )),
                Err(why) => Err(InvokeError::Routed(format!("fleet: {why}"))),
            }
        })
    }
}

/// A request's failure, as a routed call's.
fn routed(error: &RequestError) -> InvokeError {
    InvokeError::Routed(format!("fleet: {error}"))
}

/// Hands a call another member decided to the device connected here, and
/// says what came of it.
pub(super) async fn carry(
    vessel: &Vessel,
    deadline: Instant,
    device: &str,
    capability: &str,
    input: &Map<String, Value>,
    timeout: Duration,
) -> Reply {
    let Some(link) = vessel.links().get(device) else {
        return Reply::Failed {
            error: InvokeError::Routed(format!(
                "fleet: device \"{device}\" is no longer connected to the member holding it"
            )),
        };
    };
    let left = deadline.saturating_duration_since(Instant::now());
    match link.invoke(capability, input, timeout.min(left)).await {
        Ok(result) => Reply::Invoked { result },
        Err(error) => Reply::Failed { error },
    }
}

/// The reply saying a device's answer was too large for the fleet, so the
/// member asking does not wait for it.
pub(super) fn too_large(bytes: usize) -> Reply {
    Reply::Failed {
        error: InvokeError::Routed(format!(
            "fleet: the device's answer ({bytes} bytes) is larger than the fleet carries ({} bytes)",
            dk_fleet::MAX_REPLY
        )),
    }
}

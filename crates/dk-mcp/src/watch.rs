//! What a connected client is told without asking: its tool list changed,
//! its resource list changed, a resource it follows was updated. One watch
//! per session (or per `subscriptions/listen` request), with one receiver
//! per event source, so nothing queues without bound: a watch that falls
//! behind on device events treats every resource it follows as updated.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::ResourceUpdatedNotificationParam;
use rmcp::service::{Peer, SubscriptionSink};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::events::{EventLog, Update, event_visible, events_uri, visible_devices};
use super::tools::visible_tools;
use crate::adapter::ToolDefinition;
use crate::agents::{Agent, AgentDirectory, AgentEvent, AgentId};
use crate::registry::RegistryEvent;
use crate::vessel::Vessel;

/// The most resources one client may follow at once.
pub(crate) const MAX_SUBSCRIPTIONS: usize = 256;

/// The devices whose event resources a client follows, shared between the
/// handler (`resources/subscribe`, `resources/unsubscribe`) and the watch.
pub(crate) type Followed = Arc<Mutex<BTreeSet<String>>>;

/// What changed for a client since it was last told.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Changes {
    /// Its tool list.
    pub(crate) tools: bool,
    /// Its resource list.
    pub(crate) resources: bool,
    /// Followed devices with new events.
    pub(crate) updated: BTreeSet<String>,
}

/// Watches what changes an agent's lists (registry events, agent changes)
/// and the events of the devices it follows. After a registry or agent
/// change, the agent's lists are computed again and a change is reported
/// only when they differ.
pub(crate) struct SessionWatch {
    vessel: Arc<Vessel>,
    agents: Arc<AgentDirectory>,
    agent: Agent,
    registry_events: broadcast::Receiver<RegistryEvent>,
    agent_events: broadcast::Receiver<AgentEvent>,
    updates: Option<broadcast::Receiver<Update>>,
    followed: Followed,
    tools: Vec<ToolDefinition>,
    devices: BTreeSet<String>,
}

impl SessionWatch {
    /// Subscribes now, so nothing after this point is missed. `None` when
    /// the agent no longer exists.
    pub(crate) fn new(
        vessel: Arc<Vessel>,
        agents: Arc<AgentDirectory>,
        events: &EventLog,
        agent: &AgentId,
        followed: Followed,
    ) -> Option<SessionWatch> {
        let registry_events = vessel.registry().subscribe();
        let agent_events = agents.subscribe();
        let updates = Some(events.subscribe());
        let agent = agents.get(agent)?;
        let tools = visible_tools(&vessel, &agent);
        let devices = visible_devices(&vessel, &agent);
        Some(SessionWatch {
            vessel,
            agents,
            agent,
            registry_events,
            agent_events,
            updates,
            followed,
            tools,
            devices,
        })
    }

    fn follows(&self, device_id: &str) -> bool {
        self.followed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(device_id)
    }

    /// Every followed device the agent still sees.
    fn all_followed(&self) -> BTreeSet<String> {
        let followed = self
            .followed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        followed
            .into_iter()
            .filter(|d| self.devices.contains(d))
            .collect()
    }

    /// Waits until something changed for the client (`Some`), or the watch
    /// is over (`None`: the agent was removed or an event source closed).
    /// Cancel-safe: it only waits on broadcast receivers.
    pub(crate) async fn next_changes(&mut self) -> Option<Changes> {
        loop {
            let updates = async {
                match self.updates.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = self.registry_events.recv() => {
                    if matches!(event, Err(RecvError::Closed)) {
                        return None;
                    }
                }
                event = self.agent_events.recv() => match event {
                    Ok(AgentEvent::Removed { id }) if id == self.agent.id => return None,
                    Err(RecvError::Closed) => return None,
                    _ => {}
                },
                update = updates => {
                    let updated = match update {
                        Ok(update) => {
                            let seen = self.follows(&update.device_id)
                                && event_visible(
                                    &self.vessel,
                                    &self.agent,
                                    &update.device_id,
                                    &update.capability,
                                );
                            if seen {
                                BTreeSet::from([update.device_id.to_string()])
                            } else {
                                BTreeSet::new()
                            }
                        }
                        Err(RecvError::Lagged(_)) => self.all_followed(),
                        Err(RecvError::Closed) => {
                            self.updates = None;
                            BTreeSet::new()
                        }
                    };
                    if updated.is_empty() {
                        continue;
                    }
                    return Some(Changes { updated, ..Changes::default() });
                }
            }
            self.agent = self.agents.get(&self.agent.id)?;
            let tools = visible_tools(&self.vessel, &self.agent);
            let devices = visible_devices(&self.vessel, &self.agent);
            let changes = Changes {
                tools: tools != self.tools,
                resources: devices != self.devices,
                updated: BTreeSet::new(),
            };
            self.tools = tools;
            self.devices = devices;
            if changes.tools || changes.resources {
                return Some(changes);
            }
        }
    }

    /// Runs until the watch is over or `notifier` says the client is gone.
    /// Lists changes are told at once; updates of one resource are told at
    /// most once per `interval`, events in between coalesced into one.
    pub(crate) async fn run(mut self, notifier: Notifier, interval: Duration) {
        let mut pending: BTreeSet<String> = BTreeSet::new();
        let mut quiet_until = Instant::now();
        loop {
            let waiting = !pending.is_empty();
            tokio::select! {
                changes = self.next_changes() => {
                    let Some(changes) = changes else {
                        return;
                    };
                    if changes.tools && !notifier.tools_changed().await {
                        return;
                    }
                    if changes.resources && !notifier.resources_changed().await {
                        return;
                    }
                    pending.extend(changes.updated);
                }
                () = tokio::time::sleep_until(quiet_until), if waiting => {
                    for device in std::mem::take(&mut pending) {
                        if !notifier.updated(events_uri(&device)).await {
                            return;
                        }
                    }
                    quiet_until = Instant::now() + interval;
                }
            }
        }
    }

    /// The tool list as last seen.
    #[cfg(test)]
    pub(crate) fn tools(&self) -> &[ToolDefinition] {
        &self.tools
    }
}

/// Where a watch's notifications go.
pub(crate) enum Notifier {
    /// An `initialize` session's standalone stream: every change is told.
    Session(Peer<RoleServer>),
    /// A `subscriptions/listen` request: only what its accepted filter names.
    Listen(SubscriptionSink),
    /// A test's channel: what would be sent, as its method (and URI).
    #[cfg(test)]
    Test(tokio::sync::mpsc::UnboundedSender<String>),
}

impl Notifier {
    /// Tells of a tool list change; false when the client is gone.
    async fn tools_changed(&self) -> bool {
        match self {
            Notifier::Session(peer) => peer.notify_tool_list_changed().await.is_ok(),
            Notifier::Listen(sink) => {
                sink.accepted().tools_list_changed != Some(true)
                    || sink.notify_tool_list_changed().await.is_ok()
            }
            #[cfg(test)]
            Notifier::Test(tx) => tx.send("tools/list_changed".to_owned()).is_ok(),
        }
    }

    /// Tells of a resource list change; false when the client is gone.
    async fn resources_changed(&self) -> bool {
        match self {
            Notifier::Session(peer) => peer.notify_resource_list_changed().await.is_ok(),
            Notifier::Listen(sink) => {
                sink.accepted().resources_list_changed != Some(true)
                    || sink.notify_resource_list_changed().await.is_ok()
            }
            #[cfg(test)]
            Notifier::Test(tx) => tx.send("resources/list_changed".to_owned()).is_ok(),
        }
    }

    /// Tells of an update of `uri`; false when the client is gone.
    async fn updated(&self, uri: String) -> bool {
        match self {
            Notifier::Session(peer) => peer
                .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                .await
                .is_ok(),
            Notifier::Listen(sink) => {
                let accepted = sink
                    .accepted()
                    .resource_subscriptions
                    .as_ref()
                    .is_some_and(|uris| uris.contains(&uri));
                !accepted || sink.notify_resource_updated(uri).await.is_ok()
            }
            #[cfg(test)]
            Notifier::Test(tx) => tx.send(format!("resources/updated {uri}")).is_ok(),
        }
    }
}

//! What comes to a member: the requests sent to it ([`Requests`], each a
//! [`Request`] to answer once) and the events other members publish
//! ([`Events`]).

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt as _;

use super::shared::{EVENT_SUBJECT, Shared, Taken};
use crate::error::FleetError;
use crate::member::{Incarnation, MemberId};
use crate::reply::Status;
use crate::seal::Replays;

/// Requests sent to this member, from [`Fleet::serve`](crate::Fleet::serve).
pub struct Requests {
    pub(super) shared: Arc<Shared>,
    pub(super) replays: Replays,
    pub(super) subject: String,
    pub(super) subscriber: async_nats::Subscriber,
}

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requests")
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl Requests {
    /// The next verified request meant for this incarnation whose
    /// deadline has not passed; `None` when the subscription ends.
    /// Anything else is dropped and counted.
    pub async fn next(&mut self) -> Option<Request> {
        while let Some(message) = self.subscriber.next().await {
            if let Some(request) = self
                .shared
                .take_request(&self.subject, message, &mut self.replays)
                .await
            {
                return Some(request.with(Arc::clone(&self.shared)));
            }
        }
        None
    }
}

/// One verified request, to be answered once.
pub struct Request {
    shared: Arc<Shared>,
    request: Taken,
}

impl Taken {
    fn with(self, shared: Arc<Shared>) -> Request {
        Request {
            shared,
            request: self,
        }
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("from", &self.request.from)
            .field("bytes", &self.request.payload.len())
            .field("deadline", &self.request.deadline)
            .finish_non_exhaustive()
    }
}

impl Request {
    /// The member that sent it.
    pub fn from(&self) -> &MemberId {
        &self.request.from
    }

    /// The incarnation of the member that sent it.
    pub fn from_incarnation(&self) -> Incarnation {
        self.request.from_incarnation
    }

    /// What it asks.
    pub fn payload(&self) -> &[u8] {
        &self.request.payload
    }

    /// When the sender stops waiting.
    pub fn deadline(&self) -> Instant {
        self.request.deadline
    }

    /// Answers it with `reply`, sealed for the sender's inbox, in as many
    /// messages as the servers' limit needs; a reply larger than
    /// [`crate::MAX_REPLY`] is [`FleetError::TooLarge`] and nothing is
    /// sent, so a smaller answer saying so can follow.
    pub async fn respond(&self, reply: &[u8]) -> Result<(), FleetError> {
        self.shared
            .answer(
                &self.request.reply,
                self.request.from_incarnation,
                Status::Data,
                reply,
            )
            .await
    }
}

/// One verified event from another member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The member that published it.
    pub from: MemberId,
    /// The incarnation that published it.
    pub incarnation: Incarnation,
    /// What it says.
    pub payload: Vec<u8>,
}

/// Events other members publish, from [`Fleet::events`](crate::Fleet::events).
pub struct Events {
    pub(super) shared: Arc<Shared>,
    pub(super) replays: Replays,
    pub(super) subscriber: async_nats::Subscriber,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// The next verified event from another member; `None` when the
    /// subscription ends. This member's own events are skipped, and so
    /// are those of an incarnation that is gone.
    pub async fn next(&mut self) -> Option<Event> {
        while let Some(message) = self.subscriber.next().await {
            let Some(opened) = self
                .shared
                .open(EVENT_SUBJECT, &message.payload, &mut self.replays)
            else {
                continue;
            };
            if opened.from == self.shared.member {
                continue;
            }
            return Some(Event {
                from: opened.from,
                incarnation: opened.from_incarnation,
                payload: opened.body,
            });
        }
        None
    }
}

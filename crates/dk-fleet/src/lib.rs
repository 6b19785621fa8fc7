//! dk's fleet transport: the messages between the vessels of one fleet,
//! over NATS.
//!
//! Every member holds the fleet key (a vessel key file, 0600, the one dk/2
//! key devices pin for the whole fleet); from its secret HKDF-SHA256
//! derives the key that seals every fleet message with
//! XChaCha20-Poly1305, the NATS subject and the sender bound to it, the
//! time sent and a message id inside. A NATS client without the key reads
//! nothing and can inject nothing: what it sends is dropped and counted,
//! and a message replayed twice or later than the window is dropped.
//!
//! On top: presence ([`Fleet::announce`], [`Fleet::holder_of`]), routed
//! requests ([`Fleet::request`], [`Fleet::serve`]) and broadcast events
//! ([`Fleet::publish`], [`Fleet::events`]). No input from NATS can make
//! it panic; every message is bounded ([`MAX_MESSAGE`]) before it is read.

#![forbid(unsafe_code)]

mod error;
mod fleet;
mod key;
mod member;
mod options;
mod presence;
mod reply;
mod seal;

pub use error::{ConnectError, FleetError, RequestError};
pub use fleet::{
    CLOCK_TOLERANCE, Dropped, EVENT_SUBJECT, Event, Events, Fleet, FleetState, PRESENCE_PREFIX,
    PRESENCE_SUBJECT, REQUEST_PREFIX, Request, Requests,
};
pub use key::{FleetKey, KeyError};
pub use member::{BadIncarnation, BadMemberId, Incarnation, MAX_MEMBER_ID, MemberId};
pub use options::{Auth, FleetOptions};
pub use presence::{Departed, MAX_DEVICES, PresenceChange, Seen};
pub use reply::MAX_REPLY;
pub use seal::{MAX_MESSAGE, SealError};

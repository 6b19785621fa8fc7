//! The sessions of `initialize` clients, kept the short way: a request's
//! message goes straight into the session's rmcp service loop, and the
//! service's answer goes straight back to that request's HTTP response,
//! found by its JSON-RPC id. rmcp's own `LocalSessionManager` passes both
//! through a worker task per session, with a round trip to it to open each
//! answer stream: about four more task hand-offs a call, which on a small
//! machine cost more than the rest of MCP.
//!
//! - An answer (result or error) ends its request's stream.
//! - A request the client gives up is told so ([`Hangup`], in the request's
//!   extensions, which the handler watches): when its stream is dropped
//!   before the answer (the client closed the connection), when the client
//!   cancels it (`notifications/cancelled`, which also ends its stream, as
//!   no answer will come), and when its session ends. rmcp runs a handler
//!   in a task of its own that nothing else ends.
//! - Everything else the server sends (list and resource changes) goes to
//!   the session's standalone stream (the client's `GET`), if one is open; a
//!   newer `GET` replaces an older one.
//! - A session belongs to the agent whose request opened it (the guard sets
//!   [`OPENER`] around every request); only that agent may use it.
//! - A session ends with `DELETE`, when the route stops, or when it has seen
//!   no request for [`SESSION_IDLE_EXPIRY`] and has no standalone stream
//!   open (checked whenever a session is made).
//! - Each agent holds at most [`McpOptions::sessions_per_agent`] sessions:
//!   a new one past it ends that agent's own longest unused session (one
//!   without a standalone stream open first), never another agent's. All
//!   agents together hold at most [`McpOptions::max_sessions`]: past it the
//!   agent holding the most loses its longest unused one, so another agent
//!   can always open a session.
//! - Streams are not resumable: no event ids are sent, so a client whose
//!   connection drops asks again rather than resuming.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use rmcp::RoleServer;
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, GetExtensions as _, RequestId, ServerJsonRpcMessage,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::common::server_side_http::ServerSseMessage;
use rmcp::transport::streamable_http_server::session::{SessionId, SessionManager};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::options::McpOptions;
use crate::agents::AgentId;

tokio::task_local! {
    /// The agent a request authenticated as, set by the guard while the
    /// request is served: a session made for the request is that agent's.
    pub(crate) static OPENER: AgentId;
}

/// A session without a request for this long, and without a standalone
/// stream open, ends when the next session is made.
pub(crate) const SESSION_IDLE_EXPIRY: Duration = Duration::from_secs(30 * 60);

/// Messages waiting for a session's service loop.
const INBOUND_QUEUE: usize = 64;

/// Messages waiting on one answer stream or the standalone stream.
const OUTBOUND_QUEUE: usize = 64;

/// Why a session could not take a message.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    /// No session has that id (it never existed, or it ended).
    #[error("no such MCP session")]
    Unknown,
    /// The session ended while the message was on its way.
    #[error("the MCP session has ended")]
    Ended,
    /// A session was to be made outside a request of an authenticated agent.
    #[error("an MCP session is opened only for an authenticated agent")]
    NoAgent,
}

/// Tells a request's handler that the client gave the request up; put in
/// the request's extensions when it enters its session.
#[derive(Clone, Debug)]
pub(crate) struct Hangup(CancellationToken);

impl Hangup {
    /// Resolves once the client has given the request up.
    pub(crate) async fn heard(&self) {
        self.0.cancelled().await;
    }
}

/// A request in flight: where its answer goes, and how its handler is told
/// the client gave it up.
struct OpenRequest {
    answers: mpsc::Sender<ServerSseMessage>,
    hangup: CancellationToken,
}

/// Where the server's messages for one session go.
#[derive(Default)]
struct Routes {
    /// Each request in flight, by JSON-RPC id.
    requests: HashMap<RequestId, OpenRequest>,
    /// The client's `GET` stream, if one is open.
    standalone: Option<mpsc::Sender<ServerSseMessage>>,
}

/// One session, shared by the manager and the session's transport.
struct Session {
    /// The agent that opened it, the only one that may use it.
    owner: AgentId,
    /// Its place in the order sessions were made.
    serial: u64,
    /// Into the service loop; taken out when the session ends, which ends
    /// the loop.
    inbound: Mutex<Option<mpsc::Sender<ClientJsonRpcMessage>>>,
    routes: Mutex<Routes>,
    last_request: Mutex<Instant>,
}

impl Session {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn inbound(&self) -> Option<mpsc::Sender<ClientJsonRpcMessage>> {
        self.inbound
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn end(&self) {
        self.inbound
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let mut routes = self.routes();
        for (_, request) in routes.requests.drain() {
            request.hangup.cancel();
        }
        routes.standalone = None;
    }

    /// The client gave up the request `id`: its handler is told, and its
    /// stream ends, as no answer will come.
    fn give_up(&self, id: &RequestId) {
        if let Some(request) = self.routes().requests.remove(id) {
            request.hangup.cancel();
        }
    }

    fn touch(&self, now: Instant) {
        *self
            .last_request
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = now;
    }

    fn last_request(&self) -> Instant {
        *self
            .last_request
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a standalone stream of the session is open.
    fn is_listening(&self) -> bool {
        self.routes()
            .standalone
            .as_ref()
            .is_some_and(|s| !s.is_closed())
    }

    /// Idle past `expiry` at `now`, with no standalone stream open.
    fn is_idle(&self, now: Instant, expiry: Duration) -> bool {
        !self.is_listening() && now.saturating_duration_since(self.last_request()) >= expiry
    }

    /// Which session goes first when one must: the smaller, the sooner.
    /// One without a standalone stream open before one with, then the one
    /// whose last request is the oldest, then the oldest.
    fn eviction_order(&self) -> (bool, Instant, u64) {
        (self.is_listening(), self.last_request(), self.serial)
    }

    /// Hands `message` to the service loop; a cancellation also gives up
    /// the request it names.
    async fn push(&self, message: ClientJsonRpcMessage) -> Result<(), SessionError> {
        if let ClientJsonRpcMessage::Notification(notification) = &message
            && let ClientNotification::CancelledNotification(cancelled) = &notification.notification
            && let Some(id) = &cancelled.params.request_id
        {
            self.give_up(id);
        }
        let inbound = self.inbound().ok_or(SessionError::Ended)?;
        inbound.send(message).await.map_err(|_| SessionError::Ended)
    }
}

/// The transport rmcp's service loop runs a session over.
pub(crate) struct SessionTransport {
    inbound: mpsc::Receiver<ClientJsonRpcMessage>,
    session: Arc<Session>,
}

impl Transport<RoleServer> for SessionTransport {
    type Error = SessionError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let session = Arc::clone(&self.session);
        async move {
            let target = {
                let mut routes = session.routes();
                match &item {
                    ServerJsonRpcMessage::Response(answer) => {
                        routes.requests.remove(&answer.id).map(|r| r.answers)
                    }
                    ServerJsonRpcMessage::Error(error) => error
                        .id
                        .as_ref()
                        .and_then(|id| routes.requests.remove(id))
                        .map(|r| r.answers),
                    ServerJsonRpcMessage::Request(_) | ServerJsonRpcMessage::Notification(_) => {
                        routes.standalone.clone()
                    }
                }
            };
            // A client that went away, or a message nobody listens for, is
            // not an error of the session.
            if let Some(target) = target {
                let _ = target.send(ServerSseMessage::from_message(item)).await;
            }
            Ok(())
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        self.inbound.recv()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.session.end();
        self.inbound.close();
        Ok(())
    }
}

/// The answers to one request, or the standalone stream, as a stream.
/// Dropped before a request's answer came (the client closed the
/// connection), it tells the request's handler the client gave it up.
pub(crate) struct Answers {
    receiver: mpsc::Receiver<ServerSseMessage>,
    _hangup: Option<DropGuard>,
}

impl Stream for Answers {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.receiver.poll_recv(cx)
    }
}

/// The sessions of the `/mcp` route.
pub(crate) struct Sessions {
    live: RwLock<HashMap<SessionId, Arc<Session>>>,
    idle_expiry: Duration,
    per_agent: usize,
    max: usize,
    made: AtomicU64,
}

/// Ends `id` and takes it out of `live`.
fn evict(live: &mut HashMap<SessionId, Arc<Session>>, id: &SessionId) {
    if let Some(session) = live.remove(id) {
        session.end();
    }
}

/// The session of `owner` to end first, if it has any.
fn first_to_go(live: &HashMap<SessionId, Arc<Session>>, owner: &str) -> Option<SessionId> {
    live.iter()
        .filter(|(_, s)| s.owner == owner)
        .min_by_key(|(_, s)| s.eviction_order())
        .map(|(id, _)| id.clone())
}

/// The agent that holds the most sessions; `opener` when it is among them.
fn largest_holder(live: &HashMap<SessionId, Arc<Session>>, opener: &str) -> Option<AgentId> {
    let mut held: HashMap<&str, usize> = HashMap::new();
    for session in live.values() {
        *held.entry(session.owner.as_str()).or_default() += 1;
    }
    let most = held.values().copied().max()?;
    if held.get(opener) == Some(&most) {
        return Some(opener.to_owned());
    }
    held.into_iter()
        .filter(|&(_, count)| count == most)
        .map(|(agent, _)| agent)
        .min()
        .map(str::to_owned)
}

impl Sessions {
    /// The sessions `options` bound, ended after [`SESSION_IDLE_EXPIRY`]
    /// without a request.
    pub(crate) fn new(options: &McpOptions) -> Sessions {
        Sessions::with_idle_expiry(options, SESSION_IDLE_EXPIRY)
    }

    /// Sessions that end after `idle_expiry` without a request.
    pub(crate) fn with_idle_expiry(options: &McpOptions, idle_expiry: Duration) -> Sessions {
        Sessions {
            live: RwLock::new(HashMap::new()),
            idle_expiry,
            per_agent: options.sessions_per_agent.max(1),
            max: options.max_sessions.max(1),
            made: AtomicU64::new(0),
        }
    }

    /// The agent that owns the live session `id`.
    pub(crate) fn owner(&self, id: &str) -> Option<AgentId> {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .map(|s| s.owner.clone())
    }

    fn get(&self, id: &SessionId) -> Result<Arc<Session>, SessionError> {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
            .ok_or(SessionError::Unknown)
    }

    /// How many sessions are live.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Opens the answer stream of `message` (when it is a request, with its
    /// [`Hangup`]) and hands it to the session.
    async fn route(
        &self,
        id: &SessionId,
        mut message: ClientJsonRpcMessage,
    ) -> Result<Answers, SessionError> {
        let session = self.get(id)?;
        session.touch(Instant::now());
        let (answers, receiver) = mpsc::channel(OUTBOUND_QUEUE);
        let hangup = CancellationToken::new();
        let request = match &mut message {
            ClientJsonRpcMessage::Request(request) => {
                request
                    .request
                    .extensions_mut()
                    .insert(Hangup(hangup.clone()));
                Some(request.id.clone())
            }
            _ => None,
        };
        if let Some(request) = &request {
            let open = OpenRequest {
                answers,
                hangup: hangup.clone(),
            };
            session.routes().requests.insert(request.clone(), open);
        }
        if let Err(error) = session.push(message).await {
            if let Some(request) = &request {
                session.routes().requests.remove(request);
            }
            return Err(error);
        }
        Ok(Answers {
            receiver,
            _hangup: request.map(|_| hangup.drop_guard()),
        })
    }
}

impl SessionManager for Sessions {
    type Error = SessionError;
    type Transport = SessionTransport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let owner = OPENER
            .try_with(AgentId::clone)
            .map_err(|_| SessionError::NoAgent)?;
        let now = Instant::now();
        let id: SessionId = uuid::Uuid::new_v4().simple().to_string().into();
        let (inbound, receiver) = mpsc::channel(INBOUND_QUEUE);
        let session = Arc::new(Session {
            owner,
            serial: self.made.fetch_add(1, Ordering::Relaxed),
            inbound: Mutex::new(Some(inbound)),
            routes: Mutex::new(Routes::default()),
            last_request: Mutex::new(now),
        });
        {
            let mut live = self.live.write().unwrap_or_else(PoisonError::into_inner);
            live.retain(|_, s| {
                let keep = !s.is_idle(now, self.idle_expiry);
                if !keep {
                    s.end();
                }
                keep
            });
            // The agent's own sessions make room first: at its cap it never
            // pushes out another agent's.
            let own = live.values().filter(|s| s.owner == session.owner).count();
            for _ in self.per_agent.saturating_sub(1)..own {
                if let Some(gone) = first_to_go(&live, &session.owner) {
                    evict(&mut live, &gone);
                }
            }
            // The backstop: the agent holding the most gives one up.
            while live.len() >= self.max {
                let Some(gone) = largest_holder(&live, &session.owner)
                    .and_then(|agent| first_to_go(&live, &agent))
                else {
                    break;
                };
                evict(&mut live, &gone);
            }
            live.insert(id.clone(), Arc::clone(&session));
        }
        let transport = SessionTransport {
            inbound: receiver,
            session,
        };
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        let mut answers = self.route(id, message).await?;
        let answer = answers.receiver.recv().await.ok_or(SessionError::Ended)?;
        answer
            .message
            .map(Arc::unwrap_or_clone)
            .ok_or(SessionError::Ended)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.get(id).is_ok())
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let removed = self
            .live
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        if let Some(session) = removed {
            session.end();
        }
        Ok(())
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.route(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        let session = self.get(id)?;
        session.push(message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let session = self.get(id)?;
        let (sender, receiver) = mpsc::channel(OUTBOUND_QUEUE);
        session.routes().standalone = Some(sender);
        Ok(Answers {
            receiver,
            _hangup: None,
        })
    }

    async fn resume(
        &self,
        id: &SessionId,
        _last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        // No event ids are handed out, so there is nothing to resume from:
        // a client reconnecting with one gets a fresh standalone stream.
        self.create_standalone_stream(id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens a session for `agent`, as the guard would.
    async fn open(sessions: &Sessions, agent: &str) -> (SessionId, SessionTransport) {
        OPENER
            .scope(agent.to_owned(), sessions.create_session())
            .await
            .unwrap()
    }

    fn bounded(per_agent: usize, max: usize) -> Sessions {
        Sessions::new(&McpOptions {
            sessions_per_agent: per_agent,
            max_sessions: max,
            ..McpOptions::default()
        })
    }

    /// Which of `ids` are still live.
    async fn live(sessions: &Sessions, ids: &[SessionId]) -> Vec<bool> {
        let mut out = Vec::new();
        for id in ids {
            out.push(sessions.has_session(id).await.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn idle_sessions_end_when_the_next_one_is_made_unless_listening() {
        let sessions = Sessions::with_idle_expiry(&McpOptions::default(), Duration::ZERO);
        let (listening, mut listening_transport) = open(&sessions, "main").await;
        let _stream = sessions.create_standalone_stream(&listening).await.unwrap();
        let (idle, mut idle_transport) = open(&sessions, "main").await;
        assert_eq!(sessions.len(), 2);
        let (_third, _transport) = open(&sessions, "main").await;
        assert!(sessions.has_session(&listening).await.unwrap());
        assert!(!sessions.has_session(&idle).await.unwrap());
        // The ended session's service loop sees its input end.
        assert!(idle_transport.receive().await.is_none());
        drop(_stream);
        let (_fourth, _transport) = open(&sessions, "main").await;
        assert!(!sessions.has_session(&listening).await.unwrap());
        assert!(listening_transport.receive().await.is_none());
    }

    #[tokio::test]
    async fn a_closed_session_ends_its_service_loop_and_is_unknown() {
        let sessions = Sessions::new(&McpOptions::default());
        let (id, mut transport) = open(&sessions, "main").await;
        sessions.close_session(&id).await.unwrap();
        assert!(transport.receive().await.is_none());
        let message: ClientJsonRpcMessage =
            serde_json::from_str(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
                .unwrap();
        assert!(matches!(
            sessions.accept_message(&id, message).await,
            Err(SessionError::Unknown)
        ));
    }

    /// A `tools/call` request with JSON-RPC id `id`, as a client sends it.
    fn call(id: u64) -> ClientJsonRpcMessage {
        serde_json::from_value(serde_json::json!({"jsonrpc": "2.0", "id": id,
            "method": "tools/call", "params": {"name": "device__desk_lamp__strobe"}}))
        .unwrap()
    }

    /// The [`Hangup`] the session put in the request its loop took next.
    async fn next_hangup(transport: &mut SessionTransport) -> Hangup {
        let Some(ClientJsonRpcMessage::Request(request)) = transport.receive().await else {
            panic!("no request reached the service loop");
        };
        request
            .request
            .extensions()
            .get::<Hangup>()
            .unwrap()
            .clone()
    }

    /// Whether `hangup` has been heard.
    fn heard(hangup: &Hangup) -> bool {
        hangup.0.is_cancelled()
    }

    #[tokio::test]
    async fn a_request_its_client_gives_up_is_told_so() {
        let sessions = Sessions::new(&McpOptions::default());
        let (id, mut transport) = open(&sessions, "main").await;

        // Its answer stream dropped before the answer: the connection closed.
        let answers = sessions.create_stream(&id, call(1)).await.unwrap();
        let dropped = next_hangup(&mut transport).await;
        assert!(!heard(&dropped));
        drop(answers);
        assert!(heard(&dropped));

        // Cancelled: told, and its stream ends, as no answer will come.
        let answers = sessions.create_stream(&id, call(2)).await.unwrap();
        let cancelled = next_hangup(&mut transport).await;
        let cancel: ClientJsonRpcMessage = serde_json::from_str(
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}"#,
        )
        .unwrap();
        sessions.accept_message(&id, cancel).await.unwrap();
        assert!(heard(&cancelled));
        futures::pin_mut!(answers);
        assert!(futures::StreamExt::next(&mut answers).await.is_none());
        // The notification still reaches the service loop.
        assert!(matches!(
            transport.receive().await,
            Some(ClientJsonRpcMessage::Notification(_))
        ));

        // Answered: the stream carries the answer; nothing is given up
        // before, and another request is not touched.
        let answers = sessions.create_stream(&id, call(3)).await.unwrap();
        let answered = next_hangup(&mut transport).await;
        let _waiting = sessions.create_stream(&id, call(4)).await.unwrap();
        let waiting = next_hangup(&mut transport).await;
        let answer: ServerJsonRpcMessage =
            serde_json::from_str(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#).unwrap();
        transport.send(answer).await.unwrap();
        futures::pin_mut!(answers);
        assert!(futures::StreamExt::next(&mut answers).await.is_some());
        assert!(!heard(&answered) && !heard(&waiting));

        // The session ends: every request still in flight is told.
        sessions.close_session(&id).await.unwrap();
        assert!(heard(&waiting));
    }

    #[tokio::test]
    async fn a_session_has_an_owner_or_is_not_made() {
        let sessions = Sessions::new(&McpOptions::default());
        assert!(matches!(
            sessions.create_session().await,
            Err(SessionError::NoAgent)
        ));
        let (id, _transport) = open(&sessions, "main").await;
        assert_eq!(sessions.owner(&id).as_deref(), Some("main"));
        assert_eq!(sessions.owner("made-up"), None);
    }

    #[tokio::test]
    async fn at_its_cap_an_agent_loses_its_own_longest_unused_session() {
        let sessions = bounded(3, 100);
        let (other, _other) = open(&sessions, "other").await;
        let mut mine = Vec::new();
        let mut transports = Vec::new();
        for _ in 0..3 {
            let (id, transport) = open(&sessions, "main").await;
            mine.push(id);
            transports.push(transport);
        }
        // The first is listening and the second was used last: the third
        // is the one to go, then the second, then the newer ones; the one
        // with a stream open stays while another can go.
        let _stream = sessions.create_standalone_stream(&mine[0]).await.unwrap();
        sessions.get(&mine[1]).unwrap().touch(Instant::now());
        let (fourth, _t4) = open(&sessions, "main").await;
        assert_eq!(live(&sessions, &mine).await, [true, true, false]);
        let (_fifth, _t5) = open(&sessions, "main").await;
        assert_eq!(live(&sessions, &mine).await, [true, false, false]);
        assert!(sessions.has_session(&fourth).await.unwrap());
        let (_sixth, _t6) = open(&sessions, "main").await;
        assert_eq!(live(&sessions, &mine).await, [true, false, false]);
        assert!(!sessions.has_session(&fourth).await.unwrap());
        // Another agent's session was never touched.
        assert!(sessions.has_session(&other).await.unwrap());
        assert_eq!(sessions.len(), 4);
    }

    #[tokio::test]
    async fn past_the_total_the_agent_holding_the_most_gives_one_up() {
        let sessions = bounded(8, 6);
        let mut greedy = Vec::new();
        let mut transports = Vec::new();
        for _ in 0..5 {
            let (id, transport) = open(&sessions, "greedy").await;
            greedy.push(id);
            transports.push(transport);
        }
        let (modest, _modest) = open(&sessions, "modest").await;
        // Full: a newcomer still gets in, at the expense of the agent
        // holding the most, its longest unused session first.
        let (newcomer, _newcomer) = open(&sessions, "newcomer").await;
        assert_eq!(sessions.len(), 6);
        assert!(sessions.has_session(&newcomer).await.unwrap());
        assert!(sessions.has_session(&modest).await.unwrap());
        assert_eq!(
            live(&sessions, &greedy).await,
            [false, true, true, true, true]
        );
        // The agent holding the most, opening more, pushes out only its own.
        for _ in 0..10 {
            let (id, transport) = open(&sessions, "greedy").await;
            greedy.push(id);
            transports.push(transport);
        }
        assert!(sessions.has_session(&newcomer).await.unwrap());
        assert!(sessions.has_session(&modest).await.unwrap());
        assert_eq!(sessions.len(), 6);
        // Agents holding one each: a tie with the opener costs the opener.
        let sessions = bounded(8, 2);
        let (a, _a) = open(&sessions, "a").await;
        let (b, _b) = open(&sessions, "b").await;
        let (b2, _b2) = open(&sessions, "b").await;
        assert!(sessions.has_session(&a).await.unwrap());
        assert!(!sessions.has_session(&b).await.unwrap());
        assert!(sessions.has_session(&b2).await.unwrap());
    }
}

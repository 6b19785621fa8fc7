//! The sessions of `initialize` clients, kept the short way: a request's
//! message goes straight into the session's rmcp service loop, and the
//! service's answer goes straight back to that request's HTTP response,
//! found by its JSON-RPC id. rmcp's own `LocalSessionManager` passes both
//! through a worker task per session, with a round trip to it to open each
//! answer stream: about four more task hand-offs a call, which on a small
//! machine cost more than the rest of MCP.
//!
//! - An answer (result or error) ends its request's stream.
//! - Everything else the server sends (list and resource changes) goes to
//!   the session's standalone stream (the client's `GET`), if one is open; a
//!   newer `GET` replaces an older one.
//! - A session ends with `DELETE`, when the route stops, or when it has seen
//!   no request for [`SESSION_IDLE_EXPIRY`] and has no standalone stream
//!   open (checked whenever a session is made). At most [`MAX_SESSIONS`]
//!   live at once.
//! - Streams are not resumable: no event ids are sent, so a client whose
//!   connection drops asks again rather than resuming.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, RequestId, ServerJsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::common::server_side_http::ServerSseMessage;
use rmcp::transport::streamable_http_server::session::{SessionId, SessionManager};
use tokio::sync::mpsc;

/// Sessions live at once; past this a new `initialize` is refused.
pub(crate) const MAX_SESSIONS: usize = 1024;

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
    /// [`MAX_SESSIONS`] sessions are live.
    #[error("too many MCP sessions are open ({MAX_SESSIONS})")]
    Full,
}

/// Where the server's messages for one session go.
#[derive(Default)]
struct Routes {
    /// The open answer stream of each request in flight, by JSON-RPC id.
    requests: HashMap<RequestId, mpsc::Sender<ServerSseMessage>>,
    /// The client's `GET` stream, if one is open.
    standalone: Option<mpsc::Sender<ServerSseMessage>>,
}

/// One session, shared by the manager and the session's transport.
struct Session {
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
        routes.requests.clear();
        routes.standalone = None;
    }

    fn touch(&self, now: Instant) {
        *self
            .last_request
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = now;
    }

    /// Idle past `expiry` at `now`, with no standalone stream open.
    fn is_idle(&self, now: Instant, expiry: Duration) -> bool {
        let last = *self
            .last_request
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let listening = self
            .routes()
            .standalone
            .as_ref()
            .is_some_and(|s| !s.is_closed());
        !listening && now.saturating_duration_since(last) >= expiry
    }

    /// Hands `message` to the service loop.
    async fn push(&self, message: ClientJsonRpcMessage) -> Result<(), SessionError> {
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
                    ServerJsonRpcMessage::Response(answer) => routes.requests.remove(&answer.id),
                    ServerJsonRpcMessage::Error(error) => {
                        error.id.as_ref().and_then(|id| routes.requests.remove(id))
                    }
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
pub(crate) struct Answers(mpsc::Receiver<ServerSseMessage>);

impl Stream for Answers {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// The sessions of the `/mcp` route.
pub(crate) struct Sessions {
    live: RwLock<HashMap<SessionId, Arc<Session>>>,
    idle_expiry: Duration,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::with_idle_expiry(SESSION_IDLE_EXPIRY)
    }
}

impl Sessions {
    /// Sessions that end after `idle_expiry` without a request.
    pub(crate) fn with_idle_expiry(idle_expiry: Duration) -> Sessions {
        Sessions {
            live: RwLock::new(HashMap::new()),
            idle_expiry,
        }
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

    /// Opens the answer stream of `message` (when it is a request) and hands
    /// it to the session.
    async fn route(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<mpsc::Receiver<ServerSseMessage>, SessionError> {
        let session = self.get(id)?;
        session.touch(Instant::now());
        let (answers, receiver) = mpsc::channel(OUTBOUND_QUEUE);
        let request = match &message {
            ClientJsonRpcMessage::Request(request) => Some(request.id.clone()),
            _ => None,
        };
        if let Some(request) = &request {
            session.routes().requests.insert(request.clone(), answers);
        }
        if let Err(error) = session.push(message).await {
            if let Some(request) = &request {
                session.routes().requests.remove(request);
            }
            return Err(error);
        }
        Ok(receiver)
    }
}

impl SessionManager for Sessions {
    type Error = SessionError;
    type Transport = SessionTransport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let now = Instant::now();
        let id: SessionId = uuid::Uuid::new_v4().simple().to_string().into();
        let (inbound, receiver) = mpsc::channel(INBOUND_QUEUE);
        let session = Arc::new(Session {
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
            if live.len() >= MAX_SESSIONS {
                return Err(SessionError::Full);
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
        let answer = answers.recv().await.ok_or(SessionError::Ended)?;
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
        Ok(Answers(self.route(id, message).await?))
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
        Ok(Answers(receiver))
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

    #[tokio::test]
    async fn idle_sessions_end_when_the_next_one_is_made_unless_listening() {
        let sessions = Sessions::with_idle_expiry(Duration::ZERO);
        let (listening, mut listening_transport) = sessions.create_session().await.unwrap();
        let _stream = sessions.create_standalone_stream(&listening).await.unwrap();
        let (idle, mut idle_transport) = sessions.create_session().await.unwrap();
        assert_eq!(sessions.len(), 2);
        let (_third, _transport) = sessions.create_session().await.unwrap();
        assert!(sessions.has_session(&listening).await.unwrap());
        assert!(!sessions.has_session(&idle).await.unwrap());
        // The ended session's service loop sees its input end.
        assert!(idle_transport.receive().await.is_none());
        drop(_stream);
        let (_fourth, _transport) = sessions.create_session().await.unwrap();
        assert!(!sessions.has_session(&listening).await.unwrap());
        assert!(listening_transport.receive().await.is_none());
    }

    #[tokio::test]
    async fn a_closed_session_ends_its_service_loop_and_is_unknown() {
        let sessions = Sessions::default();
        let (id, mut transport) = sessions.create_session().await.unwrap();
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
}

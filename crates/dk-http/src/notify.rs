//! Telling the person that something waits: for every new prompt, a POST
//! to a URL they chose (`dk vessel --notify-url`), in ntfy's form (a plain
//! text body with `Title`, `Click` and `Tags` headers) or as a small JSON
//! object for any webhook.
//!
//! A notification says only that a pairing or an approval is waiting, how
//! many are, and where the console is: never a device's name, an agent's
//! name, an input value, a code or a login link. Sending happens off the
//! prompt's path: a prompt is never held back by a notification, a slow or
//! failing endpoint is logged and skipped, and at most
//! [`NOTIFY_IN_FLIGHT`] are sent at once (more are dropped, and logged).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Request, Uri};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{self, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use tokio::sync::{Semaphore, broadcast};

use crate::person::{PersonEvent, Prompt};
use crate::vessel::Vessel;

/// Most notifications sent at once.
pub const NOTIFY_IN_FLIGHT: usize = 4;
/// How long one notification may take, connecting included.
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// The shape of a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyFormat {
    /// ntfy's: a text body, `Title`, `Click` (the console) and `Tags`.
    Ntfy,
    /// `{"event": "pairing"|"approval", "waiting": N, "console": URL}`.
    Json,
}

/// Where and how to notify.
#[derive(Debug, Clone)]
pub struct NotifyTarget {
    uri: Uri,
    host: String,
    port: u16,
    tls: bool,
    format: NotifyFormat,
}

/// Why a notification URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotifyUrlError {
    /// Not a URL with a host.
    #[error("`{0}` is not an http:// or https:// URL with a host")]
    NotAUrl(String),
    /// Credentials written into the URL would be printed and logged.
    #[error("a notification URL carries no user or password")]
    Credentials,
}

/// The JSON a `json` notifier posts: `{"event", "waiting", "console"}`.
#[derive(serde::Serialize)]
struct Notification<'a> {
    /// `pairing` or `approval`.
    event: &'a str,
    /// Prompts waiting, this one included.
    waiting: usize,
    /// The console's address, when it has one.
    console: Option<&'a str>,
}

impl NotifyTarget {
    /// An `http://` or `https://` URL with a host and no credentials.
    pub fn parse(url: &str, format: NotifyFormat) -> Result<NotifyTarget, NotifyUrlError> {
        let not_a_url = || NotifyUrlError::NotAUrl(url.to_owned());
        let uri: Uri = url.parse().map_err(|_| not_a_url())?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(not_a_url()),
        };
        let authority = uri.authority().ok_or_else(not_a_url)?;
        if authority.as_str().contains('@') {
            return Err(NotifyUrlError::Credentials);
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if host.is_empty() {
            return Err(not_a_url());
        }
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(NotifyTarget {
            uri,
            host,
            port,
            tls,
            format,
        })
    }

    /// The URL's scheme and host, to print: its path (an ntfy topic, a
    /// webhook's token) is a secret of its own.
    pub fn shown(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let host = self.uri.authority().map_or("", |a| a.as_str());
        format!("{scheme}://{host}/…")
    }

    /// The request telling that a prompt of `kind` waits.
    fn request(&self, kind: &str, waiting: usize, console: Option<&str>) -> Request<Full<Bytes>> {
        let authority = self
            .uri
            .authority()
            .map_or_else(String::new, |a| a.as_str().to_owned());
        let path = self
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        // hyper-util's client dials the host and port parse read, and
        // sends the path alone, with the URL's own Host.
        let scheme = if self.tls { "https" } else { "http" };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let builder = Request::post(format!("{scheme}://{host}:{}{path}", self.port))
            .header("host", authority)
            .header("user-agent", "dk-vessel");
        let (builder, body) = match self.format {
            NotifyFormat::Ntfy => {
                let what = if kind == "pairing" {
                    "A device asks to pair"
                } else {
                    "A call waits for your yes"
                };
                let mut builder = builder
                    .header("content-type", "text/plain; charset=utf-8")
                    .header("title", format!("dk: {kind} waiting"))
                    .header("tags", "bell");
                if let Some(console) = console {
                    builder = builder.header("click", console);
                }
                let body = format!("{what} ({waiting} waiting). Answer it in the dk console.");
                (builder, body)
            }
            NotifyFormat::Json => {
                let body = Notification {
                    event: kind,
                    waiting,
                    console,
                };
                (
                    builder.header("content-type", "application/json"),
                    serde_json::to_string(&body).unwrap_or_default(),
                )
            }
        };
        builder
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_else(|_| Request::new(Full::new(Bytes::new())))
    }

    /// The client this target's notifications go out on.
    fn client(&self) -> Result<Client, String> {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        if !self.tls {
            return Ok(Client::Plain(
                legacy::Client::builder(TokioExecutor::new()).build(http),
            ));
        }
        http.enforce_http(false);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let https = HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)
            .map_err(|e| format!("no trusted root certificate on this system: {e}"))?
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        Ok(Client::Tls(
            legacy::Client::builder(TokioExecutor::new()).build(https),
        ))
    }
}

/// The HTTP/1.1 client notifications go out on: hyper-util's, through
/// hyper-rustls (ring, the platform's roots) for an `https://` URL.
#[derive(Clone)]
enum Client {
    /// For an `http://` URL.
    Plain(legacy::Client<HttpConnector, Full<Bytes>>),
    /// For an `https://` URL.
    Tls(legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>),
}

impl Client {
    /// Sends one notification: its status, or why it failed.
    async fn send(&self, request: Request<Full<Bytes>>) -> Result<u16, String> {
        let answer = match self {
            Client::Plain(client) => client.request(request).await,
            Client::Tls(client) => client.request(request).await,
        };
        answer
            .map(|response| response.status().as_u16())
            .map_err(|e| why(&e))
    }
}

/// `error` and what caused it, the client's own words being only its kind
/// (`client error (Connect)`).
fn why(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Notifies `target` of every prompt `vessel` asks from now on, until
/// `stop` resolves; `console` is the link to put in each (the console's
/// address, never a login link).
pub async fn notify_prompts(
    vessel: Arc<Vessel>,
    target: NotifyTarget,
    console: Option<String>,
    stop: impl Future<Output = ()> + Send,
) {
    let mut events = vessel.person().subscribe();
    let room = Arc::new(Semaphore::new(NOTIFY_IN_FLIGHT));
    let console: Option<Arc<str>> = console.map(Arc::from);
    let client = target.client();
    tokio::pin!(stop);
    loop {
        let event = tokio::select! {
            () = &mut stop => return,
            event = events.recv() => event,
        };
        let kind = match event {
            Ok(PersonEvent::Asked(prompt)) => match prompt.prompt {
                Prompt::Consent(_) => "pairing",
                Prompt::Approval(_) => "approval",
            },
            Ok(PersonEvent::Closed { .. }) => continue,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "notify: prompts went by unnotified");
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let Ok(permit) = Arc::clone(&room).try_acquire_owned() else {
            tracing::warn!(
                "notify: {NOTIFY_IN_FLIGHT} notifications are still being sent; this {kind} is not notified"
            );
            continue;
        };
        let waiting = vessel.person().pending().len();
        let request = target.request(kind, waiting, console.as_deref());
        let client = client.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let sent = async {
                match &client {
                    Ok(client) => client.send(request).await,
                    Err(why) => Err(why.clone()),
                }
            };
            match tokio::time::timeout(NOTIFY_TIMEOUT, sent).await {
                Ok(Ok(status)) if (200..300).contains(&status) => {
                    tracing::debug!(status, "notify: sent");
                }
                Ok(Ok(status)) => {
                    tracing::warn!(status, "notify: the endpoint refused the notification");
                }
                Ok(Err(why)) => tracing::warn!("notify: not sent: {why}"),
                Err(_) => tracing::warn!(
                    "notify: not sent: no answer within {} s",
                    NOTIFY_TIMEOUT.as_secs()
                ),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use dk_policy::PolicySet;
    use dk_testkit::{LogBuffer, eventually, eventually_some};
    use serde_json::{Value, json};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tracing::Instrument as _;

    use super::{NotifyFormat, NotifyTarget, NotifyUrlError, notify_prompts};
    use crate::adapter::{ApprovalRequest, Approver};
    use crate::vessel::{Limits, Vessel};

    /// An HTTP endpoint keeping every request it gets (head and body).
    async fn endpoint(answer: bool) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook?x=1", listener.local_addr().unwrap());
        let got = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&got);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let keep = Arc::clone(&keep);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 4096];
                    loop {
                        let n = socket.read(&mut buffer).await.unwrap_or(0);
                        request.extend_from_slice(&buffer[..n]);
                        let text = String::from_utf8_lossy(&request).to_string();
                        if let Some((head, body)) = text.split_once("\r\n\r\n") {
                            let length = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length: "))
                                .and_then(|n| n.parse::<usize>().ok())
                                .unwrap_or(0);
                            if body.len() >= length {
                                keep.lock().unwrap().push(text);
                                break;
                            }
                        }
                        if n == 0 {
                            return;
                        }
                    }
                    if answer {
                        let _ = socket
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                            .await;
                    } else {
                        // Holds the request unanswered: a receiver that hangs.
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                });
            }
        });
        (url, got)
    }

    fn secret_call(n: u64) -> ApprovalRequest {
        ApprovalRequest {
            tool: "device__front_door__unlock".to_owned(),
            device_id: "front-door".to_owned(),
            capability: "unlock".to_owned(),
            input: json!({"pin": format!("hunter2-{n}")})
                .as_object()
                .unwrap()
                .clone(),
            reason: "asks every time".to_owned(),
            agent_id: Some("kitchen-agent".to_owned()),
            session_id: Some("session-x".to_owned()),
            channel: dk_proto::Channel::Dk2,
            microphone: None,
        }
    }

    async fn wait_for(got: &Arc<Mutex<Vec<String>>>, n: usize) -> Vec<String> {
        eventually_some(&format!("{n} notifications"), || {
            let got = got.lock().unwrap();
            (got.len() >= n).then(|| got.clone())
        })
        .await
    }

    #[tokio::test]
    async fn every_prompt_is_told_with_no_name_input_or_code() {
        for format in [NotifyFormat::Json, NotifyFormat::Ntfy] {
            let vessel = Vessel::new(PolicySet::empty(), Limits::default());
            let (url, got) = endpoint(true).await;
            let target = NotifyTarget::parse(&url, format).unwrap();
            let console = Some("http://127.0.0.1:7778/console/".to_owned());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(notify_prompts(
                Arc::clone(&vessel),
                target,
                console,
                async {
                    let _ = stopped.await;
                },
            ));
            tokio::task::yield_now().await;
            let person = Arc::clone(vessel.person());
            tokio::spawn(async move { person.approve(secret_call(1)).await });
            let request = wait_for(&got, 1).await.remove(0);
            assert!(request.starts_with("POST /hook?x=1 HTTP/1.1"), "{request}");
            for private in [
                "hunter2",
                "kitchen-agent",
                "front-door",
                "unlock",
                "session-x",
            ] {
                assert!(!request.contains(private), "{private} in {request}");
            }
            let (head, body) = request.split_once("\r\n\r\n").unwrap();
            match format {
                NotifyFormat::Json => {
                    let body: Value = serde_json::from_str(body).unwrap();
                    assert_eq!(
                        body,
                        json!({"event": "approval", "waiting": 1,
                               "console": "http://127.0.0.1:7778/console/"})
                    );
                }
                NotifyFormat::Ntfy => {
                    assert!(head.contains("title: dk: approval waiting"), "{head}");
                    assert!(
                        head.contains("click: http://127.0.0.1:7778/console/"),
                        "{head}"
                    );
                    assert!(
                        body.contains("A call waits for your yes (1 waiting)"),
                        "{body}"
                    );
                }
            }
            // The prompt was asked and is answered as if nothing happened.
            let id = vessel.person().pending()[0].id;
            vessel.person().answer_approval(id, false).unwrap();
            let _ = stop.send(());
        }
    }

    #[tokio::test]
    async fn an_endpoint_down_or_hanging_never_holds_a_prompt_back() {
        let vessel = Vessel::new(PolicySet::empty(), Limits::default());
        // Nothing listens on a port just freed; another endpoint never answers.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}/", listener.local_addr().unwrap())
        };
        let (hanging, got) = endpoint(false).await;
        // What the notifiers log, the hanging endpoint's inside a span of
        // that name: every prompt it let go by is a line.
        let logs = LogBuffer::default();
        let sink = logs.clone();
        let _logging = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_writer(move || sink.clone())
                .finish(),
        );
        for (name, url) in [("closed", closed), ("hanging", hanging)] {
            let target = NotifyTarget::parse(&url, NotifyFormat::Json).unwrap();
            tokio::spawn(
                notify_prompts(Arc::clone(&vessel), target, None, std::future::pending())
                    .instrument(tracing::warn_span!("notifier", name)),
            );
        }
        tokio::task::yield_now().await;
        for n in 0..10 {
            let person = Arc::clone(vessel.person());
            tokio::spawn(async move { person.approve(secret_call(n)).await });
        }
        eventually("ten prompts asked", || {
            vessel.person().pending().len() == 10
        })
        .await;
        assert_eq!(vessel.person().pending().len(), 10, "every prompt is asked");
        // The hanging endpoint holds at most its share of notifications:
        // once its notifier has logged every prompt past its share as not
        // notified, it has looked at all ten, and what reached the endpoint
        // is all that ever will (the rest hold their places until their
        // time is over).
        let dropped = 10 - super::NOTIFY_IN_FLIGHT;
        eventually("the hanging endpoint's notifier past every prompt", || {
            logs.text()
                .lines()
                .filter(|line| {
                    line.contains("name=\"hanging\"") && line.contains("is not notified")
                })
                .count()
                == dropped
        })
        .await;
        eventually("the hanging endpoint's share", || {
            got.lock().unwrap().len() >= super::NOTIFY_IN_FLIGHT
        })
        .await;
        assert_eq!(got.lock().unwrap().len(), super::NOTIFY_IN_FLIGHT);
        for prompt in vessel.person().pending() {
            vessel.person().answer_approval(prompt.id, true).unwrap();
        }
        assert!(vessel.person().pending().is_empty());
    }

    #[test]
    fn only_http_urls_without_credentials_are_taken() {
        let ok = NotifyTarget::parse("https://ntfy.sh/my-topic", NotifyFormat::Ntfy).unwrap();
        assert!(ok.tls && ok.port == 443 && ok.host == "ntfy.sh");
        let ok = NotifyTarget::parse("http://[::1]:8080/hook?x=1", NotifyFormat::Json).unwrap();
        assert!(!ok.tls && ok.port == 8080 && ok.host == "::1");
        for bad in ["ftp://x/", "ntfy.sh/topic", "http:///x", ""] {
            assert!(
                matches!(
                    NotifyTarget::parse(bad, NotifyFormat::Ntfy),
                    Err(NotifyUrlError::NotAUrl(_))
                ),
                "{bad}"
            );
        }
        assert_eq!(
            NotifyTarget::parse("https://me:pw@ntfy.sh/t", NotifyFormat::Ntfy).unwrap_err(),
            NotifyUrlError::Credentials
        );
    }
}

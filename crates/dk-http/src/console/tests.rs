//! Tests of the console over a real loopback socket, with a raw HTTP
//! client that sends exactly the headers a browser or an attacker would:
//! signing in once, the session, Origin, Sec-Fetch-Site and CSRF checks,
//! answering prompts from forms, escaping, the live feed, the audit pages.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dk_policy::PolicySet;
use dk_testkit::{eventually, eventually_async, eventually_some, lamp};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::Console;
use crate::adapter::{ApprovalRequest, Approver};
use crate::admin::{AdminToken, admin_router};
use crate::registry::DEFAULT_CONSENT_TIMEOUT;
use crate::store::AuditEvent;
use crate::vessel::{Limits, Vessel};

struct Running {
    vessel: Arc<Vessel>,
    console: Arc<Console>,
    addr: SocketAddr,
    token: AdminToken,
    _server: tokio::task::JoinHandle<()>,
}

async fn start() -> Running {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let console = Console::new();
    let token = AdminToken::generate();
    let router = admin_router(
        Arc::clone(&vessel),
        token.clone(),
        Arc::clone(&console),
        addr,
    );
    let server = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    Running {
        vessel,
        console,
        addr,
        token,
        _server: server,
    }
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One request on its own connection, `Host` set to the listener unless
/// `headers` name one.
async fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &str,
) -> Answer {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nconnection: close\r\n");
    if !headers.iter().any(|(n, _)| *n == "host") {
        request.push_str(&format!("host: 127.0.0.1:{}\r\n", addr.port()));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        request.push_str("content-type: application/x-www-form-urlencoded\r\n");
    }
    request.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A signed-in browser: its cookie, the CSRF token of its pages and the
/// console's secret path.
struct Browser {
    addr: SocketAddr,
    prefix: String,
    cookie: String,
    csrf: String,
}

impl Browser {
    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.addr.port())
    }

    /// `GET` of `page` under the console's secret path (`/devices`).
    async fn get(&self, page: &str) -> Answer {
        raw(
            self.addr,
            "GET",
            &format!("{}{page}", self.prefix),
            &[("cookie", self.cookie.clone())],
            "",
        )
        .await
    }

    /// A form posted to `page` from the console's own page.
    async fn post(&self, page: &str, form: &str) -> Answer {
        let path = format!("{}{page}", self.prefix);
        let body = format!("csrf={}&{form}", self.csrf);
        let headers = [
            ("cookie", self.cookie.clone()),
            ("origin", self.origin()),
            ("sec-fetch-site", "same-origin".to_owned()),
        ];
        raw(self.addr, "POST", &path, &headers, &body).await
    }
}

fn path_of(link: &str) -> String {
    let at = link.find("/console/").unwrap();
    link[at..].to_owned()
}

fn csrf_in(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").unwrap() + 19;
    page[at..at + 64].to_owned()
}

async fn sign_in(running: &Running) -> Browser {
    let link = running.console.login_link().unwrap();
    let answer = raw(running.addr, "GET", &path_of(&link), &[], "").await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    let set = answer.header("set-cookie").unwrap();
    let cookie = set.split(';').next().unwrap().to_owned();
    let mut browser = Browser {
        addr: running.addr,
        prefix: running.console.prefix(),
        cookie,
        csrf: String::new(),
    };
    let page = browser.get("/").await;
    assert_eq!(page.status, 200);
    browser.csrf = csrf_in(&page.body);
    browser
}

/// Starts pairing `manifest` through the person channel; the consent's id.
async fn pairing(vessel: &Arc<Vessel>, manifest: Value) -> u64 {
    let v = Arc::clone(vessel);
    tokio::spawn(async move {
        let person = Arc::clone(v.person());
        v.registry()
            .pair(
                &manifest,
                |_| {},
                |request| async move {
                    Ok::<_, ()>(person.ask_consent(request, DEFAULT_CONSENT_TIMEOUT).await)
                },
                DEFAULT_CONSENT_TIMEOUT,
            )
            .await
    });
    eventually_some("a consent prompt", || {
        vessel.person().pending().first().map(|first| first.id)
    })
    .await
}

#[tokio::test]
async fn a_login_link_signs_in_once_and_a_session_is_needed_for_every_page() {
    let running = start().await;
    let link = running.console.login_link().unwrap();
    let prefix = running.console.prefix();
    assert!(link.starts_with(&format!("http://{}{prefix}/login?key=", running.addr)));
    let first = raw(running.addr, "GET", &path_of(&link), &[], "").await;
    assert_eq!(first.status, 303);
    assert_eq!(
        first.header("location"),
        Some(format!("{prefix}/").as_str())
    );
    let cookie = first.header("set-cookie").unwrap();
    // The cookie goes only to the secret path: a page on another port
    // that asks its own server for `/console/...` is sent none.
    for attribute in ["HttpOnly", "SameSite=Strict", &format!("Path={prefix};")] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    let again = raw(running.addr, "GET", &path_of(&link), &[], "").await;
    assert_eq!(again.status, 403);
    assert!(again.header("set-cookie").is_none());
    let made_up = format!("{prefix}/login?key={}", "0".repeat(64));
    assert_eq!(
        raw(running.addr, "GET", &made_up, &[], "").await.status,
        403
    );

    for page in ["/", "/devices", "/agents", "/audit", "/status", "/live"] {
        let page = &format!("{prefix}{page}");
        let answer = raw(running.addr, "GET", page, &[], "").await;
        assert_eq!(answer.status, 401, "{page}");
        assert!(!answer.body.contains("csrf"), "{page}");
        let wrong = raw(
            running.addr,
            "GET",
            page,
            &[("cookie", format!("dk_console={}", "a".repeat(64)))],
            "",
        )
        .await;
        assert_eq!(wrong.status, 401, "{page}");
    }
    // The bearer token is not a way into the console, nor the reverse.
    let browser = sign_in(&running).await;
    let api = raw(
        running.addr,
        "GET",
        "/v1/status",
        &[("cookie", browser.cookie.clone())],
        "",
    )
    .await;
    assert_eq!(api.status, 401);
    for page in ["/devices", "/agents", "/status"] {
        let answer = browser.get(page).await;
        assert_eq!(answer.status, 200, "{page}");
        let csp = answer.header("content-security-policy").unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
        assert_eq!(answer.header("x-frame-options"), Some("DENY"));
    }
    // Cookies a page on another port planted (browsers share them across
    // ports) do not hide the real session, nor does a header that is not
    // ASCII; a planted value alone opens nothing.
    let planted = format!("dk_console={}; {}", "b".repeat(64), browser.cookie);
    let mut headers = axum::http::HeaderMap::new();
    headers.append("cookie", planted.parse().unwrap());
    headers.append(
        "cookie",
        axum::http::HeaderValue::from_bytes("x=\u{e9}".as_bytes()).unwrap(),
    );
    headers.append("cookie", browser.cookie.parse().unwrap());
    assert_eq!(super::session::cookies_of(&headers).len(), 3);
    let answer = raw(
        running.addr,
        "GET",
        &format!("{prefix}/status"),
        &[("cookie", planted.clone())],
        "",
    )
    .await;
    assert_eq!(answer.status, 200);
    let only_planted = format!("dk_console={}", "b".repeat(64));
    let answer = raw(
        running.addr,
        "GET",
        &format!("{prefix}/status"),
        &[("cookie", only_planted)],
        "",
    )
    .await;
    assert_eq!(answer.status, 401);

    // A foreign Host (DNS rebinding) is refused even with the session.
    let rebound = raw(
        running.addr,
        "GET",
        &format!("{prefix}/"),
        &[
            ("cookie", browser.cookie.clone()),
            ("host", "evil.example".to_owned()),
        ],
        "",
    )
    .await;
    assert_eq!(rebound.status, 403);

    let out = browser.post("/logout", "").await;
    assert_eq!(out.status, 200);
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"));
    assert_eq!(browser.get("/").await.status, 401);
    // The session of the first link is still open; this one is gone.
    assert_eq!(running.console.sessions(), 1);
}

#[tokio::test]
async fn only_the_secret_path_serves_the_console_and_nothing_else_needs_or_sets_a_cookie() {
    let running = start().await;
    let prefix = running.console.prefix();
    let secret = prefix.trim_start_matches("/console/");
    assert_eq!(secret.len(), 32);
    assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(Console::new().prefix(), prefix, "each run has its own");
    let browser = sign_in(&running).await;
    // The ways in and the assets hold no secret and need no session.
    let landing = raw(running.addr, "GET", "/console/", &[], "").await;
    assert_eq!(landing.status, 200);
    assert!(landing.body.contains("dk console"));
    assert!(!landing.body.contains(secret) && !landing.body.contains("csrf"));
    assert_eq!(
        running.console.url().unwrap(),
        format!("http://{}/console/", running.addr),
        "the printable address holds no secret"
    );
    assert_eq!(
        running.console.home().unwrap(),
        format!("http://{}{prefix}/", running.addr)
    );
    for (path, status) in [
        ("/", 303),
        ("/console", 303),
        ("/console/assets/console.js", 200),
    ] {
        let answer = raw(running.addr, "GET", path, &[], "").await;
        assert_eq!(answer.status, status, "{path}");
        assert!(!answer.body.contains(secret), "{path}");
    }
    // The old addresses, a wrong or shortened secret, even with the real
    // session: nothing but "no such page", and no cookie set.
    let wrong = format!("/console/{}", "0".repeat(32));
    let short = &prefix[..prefix.len() - 1];
    for path in [
        "/console/devices".to_owned(),
        "/console/agents".to_owned(),
        "/console/status".to_owned(),
        "/console/live".to_owned(),
        "/console/login".to_owned(),
        format!("/console/login?key={}", "0".repeat(64)),
        format!("{wrong}/"),
        format!("{wrong}/status"),
        format!("{short}/status"),
        format!("{prefix}x/status"),
    ] {
        let answer = raw(
            running.addr,
            "GET",
            &path,
            &[("cookie", browser.cookie.clone())],
            "",
        )
        .await;
        assert_eq!(answer.status, 404, "{path}");
        assert!(answer.header("set-cookie").is_none(), "{path}");
        assert!(
            !answer.body.contains(secret) && !answer.body.contains("csrf"),
            "{path}"
        );
    }
    let post = format!("csrf={}&name=x&scope=&role=admin", browser.csrf);
    let answer = raw(
        running.addr,
        "POST",
        "/console/agents",
        &[
            ("cookie", browser.cookie.clone()),
            ("origin", browser.origin()),
            ("sec-fetch-site", "same-origin".to_owned()),
        ],
        &post,
    )
    .await;
    assert_eq!(answer.status, 404);
    assert!(running.vessel.agents().list().is_empty());
    // Under the secret path, a login link works (and `/console/<secret>`
    // leads to the console's first page).
    let home = raw(running.addr, "GET", &prefix, &[], "").await;
    assert_eq!(home.status, 303);
    assert_eq!(home.header("location"), Some(format!("{prefix}/").as_str()));
    let page = browser.get("/").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains(&format!("data-base=\"{prefix}\"")));
    assert!(page.body.contains(&format!("href=\"{prefix}/devices\"")));
}

#[tokio::test]
async fn a_change_needs_the_consoles_origin_a_same_origin_fetch_and_the_sessions_csrf() {
    let running = start().await;
    let browser = sign_in(&running).await;
    let other = sign_in(&running).await;
    assert_ne!(browser.csrf, other.csrf, "each session has its own token");
    let form = "name=intruder&scope=&role=admin";
    let cookie = ("cookie", browser.cookie.clone());
    let own = ("origin", browser.origin());
    type Case<'a> = (Vec<(&'a str, String)>, String, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            vec![cookie.clone()],
            format!("csrf={}&{form}", browser.csrf),
            "no Origin",
        ),
        (
            vec![
                cookie.clone(),
                ("origin", "https://evil.example".to_owned()),
            ],
            format!("csrf={}&{form}", browser.csrf),
            "another Origin",
        ),
        (
            vec![cookie.clone(), ("origin", "null".to_owned())],
            format!("csrf={}&{form}", browser.csrf),
            "an opaque Origin",
        ),
        (
            vec![
                cookie.clone(),
                own.clone(),
                ("sec-fetch-site", "cross-site".to_owned()),
            ],
            format!("csrf={}&{form}", browser.csrf),
            "a cross-site fetch",
        ),
        (
            vec![cookie.clone(), own.clone()],
            form.to_owned(),
            "no CSRF token",
        ),
        (
            vec![cookie.clone(), own.clone()],
            format!("csrf={}&{form}", other.csrf),
            "another session's CSRF token",
        ),
        (
            vec![own.clone()],
            format!("csrf={}&{form}", browser.csrf),
            "no session",
        ),
    ];
    for (headers, body, case) in cases {
        let path = format!("{}/agents", browser.prefix);
        let answer = raw(running.addr, "POST", &path, &headers, &body).await;
        assert!(
            answer.status == 403 || answer.status == 401,
            "{case}: {}",
            answer.status
        );
        assert!(running.vessel.agents().list().is_empty(), "{case}");
    }
    // A GET changes nothing.
    let get = browser.get("/agents/x/remove").await;
    assert_eq!(get.status, 405);

    let added = browser.post("/agents", form).await;
    assert_eq!(added.status, 201, "{}", added.body);
    assert!(added.body.contains("id=\"credential\">dka_"));
    // The MCP configuration is pasteable JSON, newlines and all: what
    // "Copy configuration" copies is the block's text.
    let config = added
        .body
        .split_once("<pre id=\"mcp-config\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .unwrap()
        .0
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#39;", "'")
        .replace("&amp;", "&");
    let config: Value = serde_json::from_str(&config).unwrap_or_else(|e| panic!("{e}: {config}"));
    let bearer = config["mcpServers"]["dk"]["headers"]["Authorization"]
        .as_str()
        .unwrap();
    assert!(bearer.starts_with("Bearer dka_"), "{bearer}");
    assert_eq!(running.vessel.agents().list().len(), 1);
    // The credential is shown once: the agents page never shows it again.
    let page = browser.get("/agents").await;
    assert!(!page.body.contains("dka_"));
    let removed = browser.post("/agents/intruder/remove", "").await;
    assert_eq!(removed.status, 303);
    assert!(running.vessel.agents().list().is_empty());
}

#[tokio::test]
async fn a_pairing_is_answered_from_its_card_with_the_ticked_grants() {
    let running = start().await;
    let browser = sign_in(&running).await;
    let id = pairing(&running.vessel, lamp()).await;
    let page = browser.get("/").await;
    let code = match &running.vessel.person().pending()[0].prompt {
        crate::person::Prompt::Consent(c) => c.code.clone(),
        crate::person::Prompt::Approval(_) => unreachable!(),
    };
    assert!(page.body.contains("class=\"code\""));
    assert!(page.body.contains(&code), "the code is shown");
    assert!(page.body.contains("(1) Waiting"), "the title counts it");
    assert!(page.body.contains("value=\"read_light\""));
    let answered = browser
        .post(
            &format!("/pairings/{id}"),
            "answer=pair&grant=read_light&grant=set_light",
        )
        .await;
    assert_eq!(answered.status, 303, "{}", answered.body);
    let grants = eventually_some("the lamp paired", || {
        running
            .vessel
            .registry()
            .list()
            .first()
            .map(|device| device.grants.clone())
    })
    .await;
    assert_eq!(grants, ["read_light", "set_light"]);
    let device = browser.get("/devices/desk-lamp").await;
    assert!(device.body.contains("aria-checked=\"true\""));
    let revoked = browser
        .post("/devices/desk-lamp/grants/set_light", "allow=no")
        .await;
    assert_eq!(revoked.status, 303);
    assert_eq!(running.vessel.registry().list()[0].grants, ["read_light"]);
    // The same prompt cannot be answered twice.
    let twice = browser
        .post(&format!("/pairings/{id}"), "answer=refuse")
        .await;
    assert_eq!(twice.status, 404);
}

#[tokio::test]
async fn what_a_device_or_agent_wrote_is_escaped_and_hidden_characters_shown() {
    let running = start().await;
    let browser = sign_in(&running).await;
    // A manifest refuses hidden characters (the device never reaches the
    // person); markup in a name is allowed, and shown as text.
    let mut manifest = lamp();
    manifest["name"] = json!("<script>alert(1)</script> & 'co'");
    pairing(&running.vessel, manifest).await;
    let page = browser.get("/").await;
    assert!(!page.body.contains("<script>alert"));
    assert!(
        page.body
            .contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &#39;co&#39;")
    );

    let approval = ApprovalRequest {
        tool: "device__desk_lamp__set_light".to_owned(),
        device_id: "desk-lamp".to_owned(),
        capability: "set_light".to_owned(),
        input: json!({"note": "\"><img src=x onerror=alert(1)>\u{1b}[2J\u{202e}kcoL\u{200b}"})
            .as_object()
            .unwrap()
            .clone(),
        reason: "capability asks every time".to_owned(),
        agent_id: Some("kitchen</h2>".to_owned()),
        session_id: Some("s-1".to_owned()),
        channel: dk_proto::Channel::Dk2,
        microphone: None,
    };
    let person = Arc::clone(running.vessel.person());
    tokio::spawn(async move { person.approve(approval).await });
    let page = eventually_async("the approval on the page", || async {
        let page = browser.get("/").await;
        page.body.contains("approval").then_some(page)
    })
    .await;
    assert!(!page.body.contains("<img"));
    assert!(page.body.contains("&lt;img src=x onerror=alert(1)&gt;"));
    assert!(page.body.contains("\\u{001B}"));
    assert!(!page.body.contains('\u{202e}') && !page.body.contains('\u{200b}'));
    assert!(page.body.contains("\\u{202E}") && page.body.contains("\\u{200B}"));
    assert!(page.body.contains("kitchen&lt;/h2&gt;"));
}

#[tokio::test]
async fn the_live_feed_tells_each_prompt_asked_and_closed() {
    let running = start().await;
    let browser = sign_in(&running).await;
    let mut stream = TcpStream::connect(running.addr).await.unwrap();
    let request = format!(
        "GET {}/live HTTP/1.1\r\nhost: 127.0.0.1:{}\r\ncookie: {}\r\n\r\n",
        browser.prefix,
        running.addr.port(),
        browser.cookie
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut lines = BufReader::new(stream).lines();
    let mut next_event = async || {
        let mut name = String::new();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if let Some(event) = line.strip_prefix("event: ") {
                name = event.to_owned();
            } else if let Some(data) = line.strip_prefix("data: ") {
                let data: Value = serde_json::from_str(data).unwrap();
                return (name, data);
            }
        }
    };
    let (name, data) = next_event().await;
    assert_eq!((name.as_str(), data["pending"].as_u64()), ("sync", Some(0)));
    let (name, data) = next_event().await;
    assert_eq!(
        (name.as_str(), data["count"].as_u64()),
        ("microphones", Some(0))
    );
    let id = pairing(&running.vessel, lamp()).await;
    let (name, data) = next_event().await;
    assert_eq!(name, "asked");
    assert_eq!(data["id"], json!(id));
    assert_eq!(data["pending"], json!(1));
    let html = data["html"].as_str().unwrap();
    assert!(html.starts_with(&format!(
        "<article class=\"prompt pairing\" id=\"prompt-{id}\""
    )));
    assert!(html.contains(&browser.csrf), "the card's forms work");
    browser
        .post(&format!("/pairings/{id}"), "answer=refuse")
        .await;
    let (name, data) = next_event().await;
    assert_eq!(name, "closed");
    assert_eq!(
        (data["id"].as_u64(), data["pending"].as_u64()),
        (Some(id), Some(0))
    );
}

/// The live feed's events, read one at a time.
struct Live(tokio::io::Lines<BufReader<TcpStream>>);

impl Live {
    async fn open(running: &Running, browser: &Browser) -> Live {
        let mut stream = TcpStream::connect(running.addr).await.unwrap();
        let request = format!(
            "GET {}/live HTTP/1.1\r\nhost: 127.0.0.1:{}\r\ncookie: {}\r\n\r\n",
            browser.prefix,
            running.addr.port(),
            browser.cookie
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        Live(BufReader::new(stream).lines())
    }

    /// The next event named `want`, skipping others.
    async fn next(&mut self, want: &str) -> Value {
        let mut name = String::new();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(10), self.0.next_line())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if let Some(event) = line.strip_prefix("event: ") {
                name = event.to_owned();
            } else if let Some(data) = line.strip_prefix("data: ")
                && name == want
            {
                return serde_json::from_str(data).unwrap();
            }
        }
    }
}

/// A voice device's link: counts the stops it is sent.
#[derive(Default)]
struct VoiceLink(std::sync::Mutex<Vec<String>>);

impl crate::link::DeviceLink for VoiceLink {
    fn invoke<'a>(
        &'a self,
        capability: &'a str,
        _input: &'a serde_json::Map<String, Value>,
        _timeout: Duration,
    ) -> futures::future::BoxFuture<'a, crate::link::InvokeResult> {
        self.0.lock().unwrap().push(capability.to_owned());
        Box::pin(async { Ok(None) })
    }
}

fn microphone_event(device: &str, data: Value) -> crate::link::DeviceEvent {
    crate::link::DeviceEvent {
        device_id: device.to_owned(),
        capability: "listen".to_owned(),
        data: Some(serde_json::value::to_raw_value(&data).unwrap()),
    }
}

#[tokio::test]
async fn a_live_microphone_shows_on_every_page_and_its_stop_reaches_the_device() {
    let running = start().await;
    let vessel = &running.vessel;
    let voice = json!({
        "id": "kitchen", "name": "Kitchen", "kind": "voice", "version": "1",
        "capabilities": [
            {"name": "listen", "kind": "sensor", "confirm": true, "description": "Record."},
            {"name": "stop", "kind": "actuator", "description": "Stop."},
        ],
    });
    for (manifest, grant) in [(voice, "listen"), (lamp(), "read_light")] {
        vessel
            .registry()
            .pair(
                &manifest,
                |_| {},
                |_| async move { Ok::<_, ()>(crate::registry::ConsentDecision::approve([grant])) },
                DEFAULT_CONSENT_TIMEOUT,
            )
            .await
            .unwrap();
    }
    let link = Arc::new(VoiceLink::default());
    vessel.links().connect(
        "kitchen",
        Arc::clone(&link) as Arc<dyn crate::link::DeviceLink>,
    );
    let browser = sign_in(&running).await;
    let mut live = Live::open(&running, &browser).await;
    assert_eq!(live.next("microphones").await["count"], json!(0));
    let pages = [
        "/",
        "/devices",
        "/devices/kitchen",
        "/agents",
        "/audit",
        "/status",
    ];
    for page in pages {
        let body = browser.get(page).await.body;
        assert!(
            body.contains("id=\"microphones\" class=\"microphones\" role=\"region\" aria-label=\"Microphones live\" aria-live=\"assertive\" hidden>"),
            "{page}: {body}"
        );
    }

    // A voice device says its microphone is live: the feed brings the
    // banner, every page shows it, and so does the status.
    vessel.publish_event(microphone_event(
        "kitchen",
        json!({"microphone": "live", "max_seconds": 12}),
    ));
    let banner = live.next("microphones").await;
    assert_eq!(banner["count"], json!(1));
    let stop_form = format!(
        "action=\"{}/microphones/kitchen/stop\" class=\"mic-stop\"",
        browser.prefix
    );
    let html = banner["html"].as_str().unwrap();
    assert!(
        html.contains(&stop_form) && html.contains(&browser.csrf),
        "{html}"
    );
    assert!(html.contains("(listen, at most 12 s, since "), "{html}");
    for page in pages {
        let body = browser.get(page).await.body;
        assert!(
            body.contains("aria-live=\"assertive\"><div class=\"mic\" data-device=\"kitchen\">"),
            "{page}: {body}"
        );
        assert!(body.contains(&stop_form), "{page}");
    }
    let status = raw(
        running.addr,
        "GET",
        "/v1/status",
        &[(
            "authorization",
            format!("Bearer {}", running.token.expose()),
        )],
        "",
    )
    .await;
    let status: Value = serde_json::from_str(&status.body).unwrap();
    assert_eq!(status["microphones"][0]["deviceId"], json!("kitchen"));
    assert_eq!(status["microphones"][0]["capability"], json!("listen"));
    assert_eq!(status["microphones"][0]["maxSeconds"], json!(12));
    // Another kind of device cannot say so.
    vessel.publish_event(microphone_event(
        "desk-lamp",
        json!({"microphone": "live", "max_seconds": 5}),
    ));
    assert_eq!(vessel.microphones().list().len(), 1);

    // The stop: only with the session's CSRF token, then straight to the
    // device.
    let path = format!("{}/microphones/kitchen/stop", browser.prefix);
    let forged = raw(
        running.addr,
        "POST",
        &path,
        &[
            ("cookie", browser.cookie.clone()),
            ("origin", browser.origin()),
            ("sec-fetch-site", "same-origin".to_owned()),
        ],
        "csrf=nope",
    )
    .await;
    assert_eq!(forged.status, 403);
    assert!(link.0.lock().unwrap().is_empty());
    let stopped = browser.post("/microphones/kitchen/stop", "").await;
    assert_eq!(stopped.status, 303, "{}", stopped.body);
    assert_eq!(
        stopped.header("location"),
        Some(format!("{}/devices/kitchen", browser.prefix).as_str())
    );
    assert_eq!(link.0.lock().unwrap().as_slice(), ["stop"]);
    // The device says it closed: the banner goes.
    vessel.publish_event(microphone_event(
        "kitchen",
        json!({"microphone": "off", "ended": "stopped", "duration_ms": 900}),
    ));
    assert_eq!(live.next("microphones").await["count"], json!(0));
    assert!(
        browser
            .get("/")
            .await
            .body
            .contains("aria-live=\"assertive\" hidden></div>")
    );

    // A stop that cannot be made says why.
    for (device, status, why) in [
        ("nobody", 404, "no paired device"),
        ("desk-lamp", 400, "is not a voice device"),
    ] {
        let answer = browser
            .post(&format!("/microphones/{device}/stop"), "")
            .await;
        assert_eq!(answer.status, status, "{device}");
        assert!(answer.body.contains(why), "{}", answer.body);
    }
    // The admin API's stop (`dk devices stop`) reaches it the same way.
    let bearer = [(
        "authorization",
        format!("Bearer {}", running.token.expose()),
    )];
    let api = raw(
        running.addr,
        "POST",
        "/v1/devices/kitchen/stop",
        &bearer,
        "",
    )
    .await;
    assert_eq!(api.status, 204, "{}", api.body);
    assert_eq!(link.0.lock().unwrap().as_slice(), ["stop", "stop"]);
    let api = raw(
        running.addr,
        "POST",
        "/v1/devices/desk-lamp/stop",
        &bearer,
        "",
    )
    .await;
    assert_eq!(api.status, 400, "{}", api.body);
    vessel.links().disconnect(
        "kitchen",
        &(Arc::clone(&link) as Arc<dyn crate::link::DeviceLink>),
    );
    let answer = browser.post("/microphones/kitchen/stop", "").await;
    assert_eq!(answer.status, 409);
    assert!(answer.body.contains("is not connected"), "{}", answer.body);

    // An approval to open it names the agent and for how long.
    let approval = ApprovalRequest {
        tool: "device__kitchen__listen".to_owned(),
        device_id: "kitchen".to_owned(),
        capability: "listen".to_owned(),
        input: json!({"max_seconds": 12}).as_object().unwrap().clone(),
        reason: "\"listen\" on Kitchen asks every time".to_owned(),
        agent_id: Some("helper".to_owned()),
        session_id: None,
        channel: dk_proto::Channel::Dk2,
        microphone: Some(dk_proto::admin::MicrophoneRequest {
            max_seconds: Some(12),
        }),
    };
    let person = Arc::clone(vessel.person());
    tokio::spawn(async move { person.approve(approval).await });
    let page = eventually_async("the approval on the page", || async {
        let page = browser.get("/").await;
        page.body.contains("approval").then_some(page)
    })
    .await;
    assert!(
        page.body
            .contains("Agent <strong>helper</strong> asks to use kitchen: listen"),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("<strong>opens the microphone for at most 12 s</strong>"),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("A yes to open a microphone is remembered only where one of your rules allows the call explicitly."),
        "{}",
        page.body
    );
}

#[tokio::test]
async fn the_audit_log_is_read_in_filtered_pages_and_verified() {
    let running = start().await;
    let browser = sign_in(&running).await;
    let events: Vec<AuditEvent> = (0..120)
        .map(|n| AuditEvent {
            at_ms: 1_800_000_000_000 + n,
            kind: "decision".to_owned(),
            entry: json!({
                "deviceId": if n % 2 == 0 { "lamp" } else { "lock" },
                "agentId": "kitchen", "allowed": n % 3 != 0, "tool": "t", "reason": "r",
            }),
        })
        .collect();
    running
        .vessel
        .registry()
        .store()
        .append_audit(&events)
        .unwrap();
    let page = browser.get("/audit").await;
    assert_eq!(page.body.matches("<tr><td class=\"seq\">").count(), 50);
    assert!(page.body.contains("<tr><td class=\"seq\">120</td>"));
    assert!(
        page.body.contains("before=71"),
        "the next page starts below 71"
    );
    let older = browser.get("/audit?before=71").await;
    assert!(older.body.contains("<tr><td class=\"seq\">70</td>"));
    assert!(!older.body.contains("<tr><td class=\"seq\">71</td>"));
    let lock = browser.get("/audit?device=lock&decision=refused").await;
    // Refused: n % 3 == 0, odd n: n = 3, 9, ..., 117 (seq n + 1).
    assert_eq!(lock.body.matches("<tr><td class=\"seq\">").count(), 20);
    assert!(!lock.body.contains("<code>lamp</code>"));
    let verified = browser.post("/audit/verify", "").await;
    assert_eq!(verified.status, 200);
    assert!(
        verified.body.contains("Verified: 120 entries"),
        "{}",
        verified.body
    );
    assert!(verified.body.contains("Head: entry 120"));
}

/// The session id a signed-in browser's Status page shows.
async fn session_id(browser: &Browser) -> String {
    let page = browser.get("/status").await;
    let at = page.body.find("<code id=\"session\">").unwrap() + 19;
    page.body[at..at + 16].to_owned()
}

#[tokio::test]
async fn changes_made_in_the_console_name_the_console_and_its_session() {
    let running = start().await;
    let browser = sign_in(&running).await;
    let other = sign_in(&running).await;
    let (mine, theirs) = (session_id(&browser).await, session_id(&other).await);
    assert_ne!(mine, theirs, "each session has its own id");
    // The id is not the cookie, nor part of it, nor the CSRF token.
    assert!(!browser.cookie.contains(&mine) && !browser.csrf.contains(&mine));

    // Every kind of change, from the first session's pages.
    let id = pairing(&running.vessel, lamp()).await;
    let paired = browser
        .post(&format!("/pairings/{id}"), "answer=pair&grant=read_light")
        .await;
    assert_eq!(paired.status, 303, "{}", paired.body);
    eventually("the lamp paired", || {
        !running.vessel.registry().list().is_empty()
    })
    .await;
    for (path, form) in [
        ("/devices/desk-lamp/grants/strobe", "allow=yes"),
        ("/devices/desk-lamp/grants/set_light", "allow=yes"),
        ("/devices/desk-lamp/grants/set_light", "allow=no"),
        ("/agents", "name=kitchen&scope=desk-lamp&role=user"),
        ("/agents/kitchen/scope", "scope=desk-lamp:read_light"),
        ("/agents/kitchen/remove", ""),
    ] {
        let answer = browser.post(path, form).await;
        assert!(answer.status < 400, "{path}: {}", answer.body);
    }
    // An approval answered, from the other session: a call of strobe
    // (a capability that asks every time).
    let vessel = Arc::clone(&running.vessel);
    let call = tokio::spawn(async move {
        let person = Arc::clone(vessel.person());
        let ctx = crate::adapter::CallContext {
            approver: Some(person.as_ref()),
            timeout: Some(Duration::from_secs(10)),
            ..crate::adapter::CallContext::default()
        };
        vessel
            .adapter()
            .execute("device__desk_lamp__strobe", json!({}), ctx)
            .await
    });
    let asked = eventually_some("the approval prompt", || {
        running
            .vessel
            .person()
            .pending()
            .first()
            .map(|prompt| prompt.id)
    })
    .await;
    let answered = other
        .post(&format!("/approvals/{asked}"), "answer=deny")
        .await;
    assert_eq!(answered.status, 303, "{}", answered.body);
    call.await.unwrap();
    let unpaired = browser.post("/devices/desk-lamp/unpair", "").await;
    assert_eq!(unpaired.status, 303);

    running.vessel.flush_audit().unwrap();
    let entries = running
        .vessel
        .registry()
        .store()
        .read_audit(0, 100)
        .unwrap();
    let by = |session: &str| json!({"frontEnd": "console", "session": session});
    // Decisions are written behind the changes: compared in kind order.
    let mut named: Vec<(String, Value)> = entries
        .iter()
        .filter(|e| e.kind != "decision" || e.entry.get("person").is_some())
        .map(|e| (e.kind.clone(), e.entry["by"].clone()))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        named,
        [
            ("agent".to_owned(), by(&mine)),
            ("agent".to_owned(), by(&mine)),
            ("agent".to_owned(), by(&mine)),
            ("decision".to_owned(), by(&theirs)),
            ("granted".to_owned(), by(&mine)),
            ("granted".to_owned(), by(&mine)),
            ("paired".to_owned(), by(&mine)),
            ("revoked".to_owned(), by(&mine)),
            ("unpaired".to_owned(), by(&mine)),
        ],
        "{entries:?}"
    );
    assert!(
        running
            .vessel
            .registry()
            .store()
            .verify_audit()
            .unwrap()
            .is_intact()
    );
}

/// Starts a dk/2 pairing of the lamp with `key` through the person
/// channel; the consent's id.
async fn pairing_with_key(vessel: &Arc<Vessel>, key: [u8; 32]) -> u64 {
    let v = Arc::clone(vessel);
    let seen: Vec<u64> = vessel.person().pending().iter().map(|p| p.id).collect();
    tokio::spawn(async move {
        let person = Arc::clone(v.person());
        let manifest = dk_proto::validate_manifest(&lamp()).unwrap();
        v.registry()
            .pair_with_key(
                manifest,
                "123456".to_owned(),
                key,
                |request| async move {
                    Ok::<_, ()>(person.ask_consent(request, DEFAULT_CONSENT_TIMEOUT).await)
                },
                DEFAULT_CONSENT_TIMEOUT,
            )
            .await
    });
    eventually_some("a new consent prompt", || {
        vessel
            .person()
            .pending()
            .iter()
            .find(|p| !seen.contains(&p.id))
            .map(|new| new.id)
    })
    .await
}

/// The key the lamp is paired with, once a pairing settled.
async fn paired_key(vessel: &Arc<Vessel>, expected: [u8; 32]) -> Option<[u8; 32]> {
    for _ in 0..200 {
        if vessel.person().pending().is_empty()
            && let Some(device) = vessel.registry().get("desk-lamp")
            && device.key() == Some(&expected)
        {
            return Some(expected);
        }
        // Looks every 5 ms for a second at most; the caller asserts on the key
        // it finds then.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    vessel
        .registry()
        .get("desk-lamp")
        .and_then(|d| d.key().copied())
}

#[tokio::test]
async fn a_changed_key_is_said_on_the_card_and_needs_its_own_tick() {
    let running = start().await;
    let browser = sign_in(&running).await;
    let first = pairing_with_key(&running.vessel, [1; 32]).await;
    let answered = browser
        .post(
            &format!("/pairings/{first}"),
            "answer=pair&grant=read_light",
        )
        .await;
    assert_eq!(answered.status, 303, "{}", answered.body);
    assert_eq!(paired_key(&running.vessel, [1; 32]).await, Some([1; 32]));

    // Another key for the same id: the card says so and has its own box.
    let id = pairing_with_key(&running.vessel, [2; 32]).await;
    let page = browser.get("/").await;
    assert!(page.body.contains("its key changed"), "{}", page.body);
    assert!(page.body.contains("name=\"credential_change\""));
    // A yes without the tick pairs nothing: the first key stays.
    let answered = browser
        .post(&format!("/pairings/{id}"), "answer=pair&grant=read_light")
        .await;
    assert_eq!(answered.status, 303);
    assert_eq!(paired_key(&running.vessel, [2; 32]).await, Some([1; 32]));
    // With it, the new key is paired.
    let id = pairing_with_key(&running.vessel, [2; 32]).await;
    let answered = browser
        .post(
            &format!("/pairings/{id}"),
            "answer=pair&grant=read_light&credential_change=yes",
        )
        .await;
    assert_eq!(answered.status, 303);
    assert_eq!(paired_key(&running.vessel, [2; 32]).await, Some([2; 32]));
}

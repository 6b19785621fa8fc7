//! The person's console in a real browser (headless Chromium over
//! WebDriver): signing in with the printed link, a lamp's pairing arriving
//! live with its code, pairing with two of three grants, an agent's call
//! to a confirm capability arriving live and allowed, revoking, the audit
//! page, the same at phone size by keyboard alone, a page of another
//! origin that tries to act with the person's cookie, and one that asks its
//! own server for every console path it could guess (sent no cookie).
//! Screenshots go to `target/console-screenshots/`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dk_device::ClientOptions;
use dk_device::samples::Lamp;
use dk_vessel::Limits;
use fantoccini::Locator;
use fantoccini::key::Key;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::browser::Browser;
use crate::net::{DeviceRun, start, temp_dir};

/// Presses `key` in the focused element.
async fn press(browser: &Browser, key: Key) {
    let focused = browser.client.active_element().await.unwrap();
    focused
        .send_keys(&char::from(key).to_string())
        .await
        .unwrap();
}

/// Tabs through the page until the focused element's text is `label`.
async fn tab_to(browser: &Browser, label: &str) {
    for _ in 0..80 {
        press(browser, Key::Tab).await;
        let text = browser
            .run("return document.activeElement.textContent;")
            .await;
        if text.as_str() == Some(label) {
            return;
        }
    }
    panic!("Tab never reached `{label}`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_pairs_a_lamp_and_answers_an_agent_from_the_console() {
    let running = start(Limits::default()).await;
    let browser = Browser::start(1280, 900).await;
    let c = &browser.client;
    // The console's pages, under its secret path.
    let home = running.console.home().unwrap();

    // The printed link signs in once; a second use is refused.
    let link = running.console.login_link().unwrap();
    c.goto(&link).await.unwrap();
    browser.wait_text("h1", "Waiting for you").await;
    assert_eq!(c.current_url().await.unwrap().as_str(), home);
    c.goto(&link).await.unwrap();
    browser.wait_text("h1", "This link does not work").await;
    // The address a notification gives holds no secret: it forwards this
    // browser, which signed in, to its console.
    c.goto(&running.console.url().unwrap()).await.unwrap();
    browser.wait_text("#none", "Nothing is waiting").await;
    assert_eq!(c.current_url().await.unwrap().as_str(), home);

    // A simulated lamp asks to pair: its card arrives without a reload.
    let dir = temp_dir();
    let shown = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&shown);
    let lamp = Lamp::new();
    let run = DeviceRun::spawn(
        lamp.device(),
        ClientOptions::new(&running.device_url)
            .key_file(dir.path().join("lamp.key"))
            .on_code(move |code| seen.lock().unwrap().push(code.to_owned())),
    );
    let card = browser.wait_text(".prompt.pairing", "Pair Desk lamp").await;
    let code = card
        .find(Locator::Css(".code"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        shown.lock().unwrap().as_slice(),
        std::slice::from_ref(&code)
    );
    assert!(card.text().await.unwrap().contains("encrypted (dk/2)"));
    assert!(c.title().await.unwrap().starts_with("(1) "), "title badge");
    browser.screenshot("desktop-pairing").await;

    // Two of three: read_light and strobe, not set_light.
    for capability in ["read_light", "strobe"] {
        card.find(Locator::Css(&format!("input[value=\"{capability}\"]")))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }
    card.find(Locator::Css("button[value=\"pair\"]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser.wait_gone(".prompt").await;
    running.wait_connected("desk-lamp").await;
    c.goto(&format!("{home}devices/desk-lamp")).await.unwrap();
    browser.wait_text("#device-state", "connected").await;
    let switches = c
        .find_all(Locator::Css("button[role=switch]"))
        .await
        .unwrap();
    let mut states = Vec::new();
    for switch in &switches {
        states.push(switch.attr("aria-label").await.unwrap().unwrap_or_default());
    }
    assert_eq!(
        states,
        [
            "Allowed, press to revoke: read_light",
            "Not allowed, press to allow: set_light",
            "Allowed, press to revoke: strobe",
        ]
    );
    browser.screenshot("desktop-device").await;

    // What a device sends is shown as text, its hidden characters marked:
    // an event whose data holds markup, a right-to-left override and an
    // escape. (A manifest cannot carry them: it is refused at pairing.)
    running.vessel.publish_event(dk_core::link::DeviceEvent {
        device_id: "desk-lamp".to_owned(),
        capability: "read_light".to_owned(),
        data: Some(
            serde_json::value::to_raw_value(&json!({"note": "<b>on</b>\u{202e}thgil\u{1b}[2J"}))
                .unwrap(),
        ),
    });
    c.refresh().await.unwrap();
    let event = browser.wait_text("ul.events li", "read_light").await;
    let shown = event.text().await.unwrap();
    // JSON itself writes the escape as `\u001b`; the override is marked.
    assert!(
        shown.contains("<b>on</b>\\u{202E}thgil\\u001b[2J"),
        "{shown}"
    );
    assert!(
        !shown.contains('\u{202e}') && !shown.contains('\u{1b}'),
        "{shown}"
    );
    let marks = event
        .find_all(Locator::Css("span.mark"))
        .await
        .unwrap()
        .len();
    assert_eq!(marks, 1);
    browser.screenshot("desktop-device-event").await;

    // An agent calls the confirm capability: the approval arrives live,
    // naming the agent; the person allows it once; the call succeeds.
    c.goto(&home).await.unwrap();
    browser.wait_text("#none", "Nothing is waiting").await;
    let call = running.agent_call(
        "device__desk_lamp__strobe",
        json!({}),
        Duration::from_secs(10),
    );
    let card = browser.wait_text(".prompt.approval", "kitchen").await;
    let text = card.text().await.unwrap();
    assert!(
        text.contains("Agent kitchen asks to use desk-lamp: strobe"),
        "{text}"
    );
    assert!(
        text.contains("session-7") && text.contains("No input."),
        "{text}"
    );
    browser.screenshot("desktop-approval").await;
    card.find(Locator::Css("button[value=\"once\"]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let outcome = call.await.unwrap();
    assert_eq!(outcome["ok"], json!(true), "{outcome}");
    assert_eq!(lamp.calls().last().unwrap().0, "strobe");

    // Revoke from the device's page.
    c.goto(&format!("{home}devices/desk-lamp")).await.unwrap();
    c.find(Locator::Css(
        "button[aria-label=\"Allowed, press to revoke: strobe\"]",
    ))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    // The page the revoke led to shows strobe's switch off (another
    // capability's switch may be off already).
    browser
        .wait_text(
            "button[aria-label=\"Not allowed, press to allow: strobe\"]",
            "off",
        )
        .await;
    assert_eq!(running.vessel.registry().list()[0].grants, ["read_light"]);

    // The audit page shows each step.
    running.vessel.flush_audit().unwrap();
    c.goto(&format!("{home}audit")).await.unwrap();
    let table = browser.wait_text("table.audit", "revoked").await;
    let text = table.text().await.unwrap();
    for step in ["paired", "allowed", "kitchen", "revoked"] {
        assert!(text.contains(step), "{step}: {text}");
    }
    browser.screenshot("desktop-audit").await;

    // At phone size, by keyboard alone: a refused call.
    browser.viewport(390, 844).await;
    c.goto(&home).await.unwrap();
    browser.wait_text("#none", "Nothing is waiting").await;
    let call = running.agent_call(
        "device__desk_lamp__read_light",
        json!({}),
        Duration::from_secs(10),
    );
    // read_light needs no yes: it is allowed at once.
    assert_eq!(call.await.unwrap()["ok"], json!(true));
    running
        .vessel
        .registry()
        .grant("desk-lamp", "strobe")
        .unwrap();
    let call = running.agent_call(
        "device__desk_lamp__strobe",
        json!({}),
        Duration::from_secs(10),
    );
    browser.wait_text(".prompt.approval", "kitchen").await;
    let width = browser
        .run("return document.documentElement.scrollWidth;")
        .await;
    assert!(
        width.as_u64().unwrap() <= 390,
        "no sideways scrolling: {width}"
    );
    browser.screenshot("phone-approval").await;
    tab_to(&browser, "Deny").await;
    press(&browser, Key::Enter).await;
    let outcome = call.await.unwrap();
    assert_eq!(outcome["ok"], json!(false), "{outcome}");
    browser.wait_gone(".prompt").await;
    browser.screenshot("phone-answered").await;

    run.stop().await.unwrap();
    browser.quit().await;
}

/// Serves one page at any path: `html`.
async fn serve_page(html: String) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let html = html.clone();
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                let _ = socket.read(&mut buffer).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
                    html.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_origin_cannot_act_or_read_with_the_persons_session() {
    let running = start(Limits::default()).await;
    let browser = Browser::start(1280, 900).await;
    let c = &browser.client;
    c.goto(&running.console.login_link().unwrap())
        .await
        .unwrap();
    browser.wait_text("h1", "Waiting for you").await;

    // Same site (127.0.0.1), another port: the cookie may even be sent.
    let console = running.console.home().unwrap();
    let page = format!(
        r#"<!doctype html><html><body>
<form id="f" method="post" action="{console}agents">
<input name="name" value="evil"><input name="scope" value=""><input name="role" value="admin"></form>
<script>
window.results = {{}};
fetch("{console}", {{credentials: "include"}})
  .then(r => r.text()).then(t => results.read = t)
  .catch(() => results.read = "blocked");
fetch("{console}agents", {{method: "POST", mode: "no-cors", credentials: "include",
  headers: {{"content-type": "application/x-www-form-urlencoded"}},
  body: "name=evil2&scope=&role=admin"}})
  .then(() => results.post = "sent").catch(() => results.post = "failed");
</script></body></html>"#
    );
    let (evil, server) = serve_page(page).await;
    c.goto(&format!("http://{evil}/")).await.unwrap();
    let results = dk_testkit::eventually_async("the page's results", || async {
        let results = browser.run("return window.results;").await;
        (results.get("read").is_some() && results.get("post").is_some()).then_some(results)
    })
    .await;
    assert_eq!(results["read"], json!("blocked"), "{results}");
    // The form, posted: refused by the console.
    browser
        .run("document.getElementById('f').submit(); return 1;")
        .await;
    browser.wait_text("h1", "Refused").await;
    assert!(
        running.vessel.agents().list().is_empty(),
        "nothing was added"
    );

    // Back in the console, the session still works and can add an agent.
    c.goto(&format!("{console}agents")).await.unwrap();
    c.find(Locator::Id("new-name"))
        .await
        .unwrap()
        .send_keys("helper")
        .await
        .unwrap();
    c.find(Locator::Css("form.add button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let credential = browser.wait_text("#credential", "dka_").await;
    assert!(credential.text().await.unwrap().starts_with("dka_"));
    // "Copy configuration" copies the block's text: JSON a client takes.
    let config = browser
        .run("return JSON.parse(document.getElementById('mcp-config').textContent);")
        .await;
    let bearer = config["mcpServers"]["dk"]["headers"]["Authorization"].as_str();
    assert!(
        bearer.is_some_and(|b| b.starts_with("Bearer dka_")),
        "{config}"
    );
    assert_eq!(running.vessel.agents().list().len(), 1);
    server.abort();
    browser.quit().await;
}

/// A neighbour on another loopback port: serves `page` at `/` and a 404
/// elsewhere, and keeps each request's line and `Cookie` header.
async fn serve_recording(
    page: String,
) -> (
    std::net::SocketAddr,
    Arc<Mutex<Vec<(String, String)>>>,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (page, kept) = (page.clone(), Arc::clone(&kept));
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request).to_string();
                let line = text.lines().next().unwrap_or_default().to_owned();
                let cookies: Vec<&str> = text
                    .lines()
                    .filter_map(|l| {
                        l.split_once(':')
                            .filter(|(n, _)| n.eq_ignore_ascii_case("cookie"))
                            .map(|(_, v)| v.trim())
                    })
                    .collect();
                kept.lock()
                    .unwrap()
                    .push((line.clone(), cookies.join("; ")));
                let (status, body) = if line.starts_with("GET / ") {
                    ("200 OK", page)
                } else {
                    ("404 Not Found", "nothing here".to_owned())
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, seen, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_port_is_sent_no_console_cookie_for_any_path_it_guesses() {
    let running = start(Limits::default()).await;
    let browser = Browser::start(1280, 900).await;
    let c = &browser.client;
    c.goto(&running.console.login_link().unwrap())
        .await
        .unwrap();
    browser.wait_text("h1", "Waiting for you").await;
    // The browser holds the session: its own pages work.
    c.goto(&format!("{}devices", running.console.home().unwrap()))
        .await
        .unwrap();
    browser.wait_text("h1", "Devices").await;

    // Another program's page on another loopback port asks its own server
    // for every console path it could guess, as the console's pages name
    // them, with and without a trailing slash, by GET and POST.
    let guesses = [
        "/console",
        "/console/",
        "/console/login",
        "/console/logout",
        "/console/live",
        "/console/devices",
        "/console/devices/desk-lamp",
        "/console/devices/desk-lamp/unpair",
        "/console/agents",
        "/console/agents/x/remove",
        "/console/audit",
        "/console/audit/verify",
        "/console/status",
        "/console/pairings/1",
        "/console/approvals/1",
        "/console/assets/console.css",
        "/console/assets/console.js",
        "/console/x/",
        "/console/00000000000000000000000000000000/",
        "/",
        "/v1/status",
    ];
    let list = serde_json::to_string(&guesses).unwrap();
    let page = format!(
        r#"<!doctype html><html><body><script>
const paths = {list};
const asked = [];
for (const path of paths) {{
  asked.push(fetch(path, {{credentials: "include"}}).catch(() => null));
  asked.push(fetch(path, {{method: "POST", credentials: "include", body: "x=1"}}).catch(() => null));
}}
Promise.all(asked).then(() => {{ window.done = true; }});
</script></body></html>"#
    );
    let (neighbour, seen, server) = serve_recording(page).await;
    c.goto(&format!("http://{neighbour}/")).await.unwrap();
    dk_testkit::eventually_async("the page's requests finished", || async {
        (browser.run("return window.done === true;").await == json!(true)).then_some(())
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    // Every guess reached the neighbour...
    for path in guesses {
        for method in ["GET", "POST"] {
            let line = format!("{method} {path} HTTP/1.1");
            assert!(seen.iter().any(|(l, _)| *l == line), "{line}: {seen:?}");
        }
    }
    // ...and not one carried the console's cookie.
    for (line, cookie) in &seen {
        assert!(!cookie.contains("dk_console"), "{line} carried `{cookie}`");
    }
    // The session is still there, for the console alone.
    c.goto(&format!("{}status", running.console.home().unwrap()))
        .await
        .unwrap();
    browser.wait_text("h1", "Status").await;
    server.abort();
    browser.quit().await;
}

/// The bottom edge of the first element `css` matches, and the viewport's
/// height, in CSS pixels, with the page scrolled to the top.
async fn bottom(browser: &Browser, css: &str) -> (f64, f64) {
    let found = browser
        .run(&format!(
            "window.scrollTo(0, 0); const e = document.querySelector({css:?}); \
             return [e.getBoundingClientRect().bottom, window.innerHeight];"
        ))
        .await;
    (found[0].as_f64().unwrap(), found[1].as_f64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_phone_a_prompt_fits_the_first_screen_and_an_audit_row_reads_in_a_few_lines() {
    use dk_core::adapter::Approver;
    let running = start(Limits::default()).await;
    let browser = Browser::start(390, 844).await;
    browser.viewport(390, 844).await;
    let c = &browser.client;
    c.goto(&running.console.login_link().unwrap())
        .await
        .unwrap();
    browser.wait_text("h1", "Waiting for you").await;
    // The navigation is one row at the top, every page's link in view;
    // Sign out is at the foot of the page.
    let (header, height) = bottom(&browser, "header").await;
    assert!(header <= 60.0, "the header ends {header} px down");
    let links = browser
        .run(
            "return [...document.querySelectorAll('header nav a')].map(function (a) { \
               const r = a.getBoundingClientRect(); return r.right <= window.innerWidth && r.bottom <= 60; });",
        )
        .await;
    assert_eq!(links, json!([true, true, true, true, true]));
    let sign_out = browser
        .run(
            "return [...document.querySelectorAll('form.signout button')].map(function (b) { \
               return b.offsetParent !== null && b.getBoundingClientRect().top > 60; });",
        )
        .await;
    assert_eq!(
        sign_out,
        json!([false, true]),
        "shown once, below the content"
    );

    // A call with a long reason and several inputs, one long: the question
    // and both answers are on the first screen.
    let person = Arc::clone(running.vessel.person());
    let mut input = serde_json::Map::new();
    input.insert("recipe".to_owned(), json!("double espresso, ".repeat(60)));
    input.insert("cups".to_owned(), json!(2));
    input.insert("strength".to_owned(), json!("strong"));
    input.insert("milk".to_owned(), json!({"kind": "oat", "foam": true}));
    let request = dk_core::adapter::ApprovalRequest {
        tool: "device__kitchen_coffee_machine__start_brew".to_owned(),
        device_id: "kitchen-coffee-machine".to_owned(),
        capability: "start_brew".to_owned(),
        input,
        reason: "rule `ask-before-heating`: anything that heats water asks first".to_owned(),
        agent_id: Some("kitchen-assistant".to_owned()),
        session_id: Some("session-7f3a9c".to_owned()),
        channel: dk_proto::Channel::Dk2,
        microphone: None,
    };
    let asked = tokio::spawn(async move { person.approve(request).await });
    browser
        .wait_text(".prompt.approval", "kitchen-assistant")
        .await;
    for part in [
        ".prompt.approval h2",
        ".prompt.approval button[value=\"once\"]",
        ".prompt.approval button[value=\"deny\"]",
    ] {
        let (at, screen) = bottom(&browser, part).await;
        assert!(
            at <= screen,
            "{part} ends at {at}, below the first {screen} px"
        );
    }
    assert_eq!(height, 844.0);
    browser.screenshot("phone-approval-long").await;
    c.find(Locator::Css(".prompt.approval button[value=\"deny\"]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(asked.await.unwrap(), Ok(false));

    // The audit page: a row per entry, its date and tool on one line each,
    // who decided in the row itself.
    let decision = |n: u64, extra: Value| {
        let mut entry = json!({
            "tool": "device__kitchen_coffee_machine__start_brew",
            "deviceId": "kitchen-coffee-machine", "capability": "start_brew",
            "agentId": "kitchen-assistant", "sessionId": "session-7f3a9c",
            "allowed": true, "reason": "allowed", "rule": null,
        });
        for (k, v) in extra.as_object().unwrap() {
            entry[k] = v.clone();
        }
        dk_store::AuditEvent {
            at_ms: 1_796_185_507_000 + n,
            kind: "decision".to_owned(),
            entry,
        }
    };
    let events = [
        decision(
            1,
            json!({"person": "approved", "by": {"frontEnd": "console", "session": "ab12cd34ef56ab78"}}),
        ),
        decision(2, json!({"person": "remembered", "allowance": {"id": 3}})),
        decision(
            3,
            json!({"allowed": false, "rule": "no-coffee-after-ten",
            "reason": "[policy] refused by rule `no-coffee-after-ten`: nothing that heats water after 22:00"}),
        ),
        decision(4, json!({})),
    ];
    running
        .vessel
        .registry()
        .store()
        .append_audit(&events)
        .unwrap();
    running.vessel.flush_audit().unwrap();
    c.goto(&format!("{}audit", running.console.home().unwrap()))
        .await
        .unwrap();
    let table = browser.wait_text("table.audit", "a remembered yes").await;
    let text = table.text().await.unwrap();
    for who in [
        "by the person, in the console",
        "by a remembered yes (allowance 3)",
        "by rule no-coffee-after-ten",
        "by the grants",
    ] {
        assert!(text.contains(who), "{who}: {text}");
    }
    browser.screenshot("phone-audit").await;
    // Heights in lines of the row's own text.
    let rows = browser
        .run(
            "return [...document.querySelectorAll('table.audit tbody tr')].map(function (row) { \
               const line = parseFloat(getComputedStyle(row).lineHeight); \
               const lines = function (css) { const e = row.querySelector(css); \
                 return e ? e.getBoundingClientRect().height / line : 0; }; \
               return [row.getBoundingClientRect().height / line, lines('td.when'), lines('.tool code'), lines('td.by')]; });",
        )
        .await;
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), events.len(), "{rows:?}");
    for row in rows {
        let [whole, when, tool, by] = [0, 1, 2, 3].map(|i| row[i].as_f64().unwrap());
        assert!(whole <= 6.0, "a row of {whole} lines: {rows:?}");
        assert!(when <= 1.2 && tool <= 1.2 && by <= 1.2, "{rows:?}");
    }
    let width = browser
        .run("return document.documentElement.scrollWidth;")
        .await;
    assert!(
        width.as_u64().unwrap() <= 390,
        "no sideways scrolling: {width}"
    );
    browser.quit().await;
}

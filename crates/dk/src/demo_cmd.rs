//! `dk demo`: the whole story in one process, narrated. A vessel listens on a
//! free loopback port; the 8DK reference lamp connects to it as a real
//! WebSocket client; a **demo approver** stands in for the person (this is
//! the only place in dk where anything answers for the person without
//! asking them). The lamp speaks dk/2, the encrypted channel: the demo
//! shows the code each side computed on its own from the handshake, the
//! approver pairs only when they match, and the lamp's key is pinned in
//! place of a token. Then it lists the tools, makes an allowed call, a
//! refused call, a call that asks every time, revokes a grant and calls
//! again, and prints the decision records.

use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dk_core::adapter::CallContext;
use dk_core::person::{PersonEvent, Prompt};
use dk_core::registry::ConsentDecision;
use dk_device::samples::Lamp;
use dk_device::{ClientOptions, Notice, ServeOptions, run_client};
use dk_http::serve_devices;
use dk_policy::PolicySet;
use dk_vessel::{Limits, Vessel};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::input::channel_words;
use crate::input::printable;

/// The code the lamp's display shows, once it has computed one.
type Shown = Arc<Mutex<Option<String>>>;

const SET: &str = "device__desk_lamp__set_light";
const STROBE: &str = "device__desk_lamp__strobe";
const AGENT: CallContext<'static> = CallContext {
    agent_id: Some("demo-agent"),
    session_id: Some("demo-session"),
    approver: None,
    timeout: None,
    agent_gate: None,
    by_person: false,
    run: None,
};

/// Runs the demo; exit 0 when every step went as told.
pub fn run() -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(demo()) {
        Ok(()) => {
            println!(
                "\nThe demo ran to the end. To pair by hand, run `dk vessel` and `dk device simulate lamp --vessel ws://127.0.0.1:7777/device` in two terminals; across a network, `dk vessel --listen 0.0.0.0:7777` on one machine and `dk device simulate lamp --vessel ws://<its address>:7777/device` on the other, and compare the codes."
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\ndemo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn step(title: &str) {
    println!("\n== {title}");
}

async fn demo() -> Result<(), String> {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let url = format!("ws://{addr}/device");
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    step("A vessel starts");
    println!("[vessel] devices connect to {url}; nothing is granted to anyone yet");
    if let Some(fingerprint) = vessel.fingerprint() {
        println!("[vessel] my dk/2 key's fingerprint: {fingerprint}");
    }

    let server = serve_devices(listener, Arc::clone(&vessel), stopped(stop_rx.clone()));
    let lamp = Lamp::new();
    let device = lamp.device();
    let shown: Shown = Arc::default();
    let display = Arc::clone(&shown);
    let options = ClientOptions::new(url)
        .on_code(move |code| {
            println!(
                "[lamp]   over dk/2 I computed the pairing code myself; my display shows {code}"
            );
            *display.lock().unwrap_or_else(PoisonError::into_inner) = Some(code.to_owned());
        })
        .on_vessel_pinned(|fingerprint| {
            println!("[lamp]   paired; the vessel's key is pinned: {fingerprint}");
        })
        .backoff(Duration::from_millis(100), Duration::from_millis(500))
        .serve(ServeOptions::new().on_notice(|notice| match notice {
            Notice::Invoked {
                capability, input, ..
            } => {
                println!(
                    "[lamp]   called: {capability} {}",
                    printable(&Value::Object(input).to_string())
                );
            }
            Notice::Revoked {
                capability: Some(c),
            } => println!("[lamp]   told by the vessel: `{c}` was revoked"),
            Notice::Revoked { capability: None } => {
                println!("[lamp]   told by the vessel: unpaired")
            }
            _ => {}
        }));
    let client = run_client(&device, options, stopped(stop_rx.clone()));
    let approver = demo_approver(Arc::clone(&vessel), shown, stopped(stop_rx.clone()));
    let story = async {
        let result = story(&vessel, &lamp).await;
        stop_tx.send_replace(true);
        result
    };
    let (served, client, (), result) = tokio::join!(server, client, approver, story);
    served.map_err(|e| format!("device route: {e}"))?;
    client.map_err(|e| format!("lamp: {e}"))?;
    result
}

/// Stands in for the person: answers every consent whose code is the one
/// the lamp shows (granting read_light and set_light; a consent whose codes
/// differ is refused) and every approval (yes), and says so.
async fn demo_approver(
    vessel: Arc<Vessel>,
    shown: Shown,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut events = vessel.person().subscribe();
    tokio::pin!(stop);
    loop {
        let event = tokio::select! {
            () = &mut stop => return,
            event = events.recv() => event,
        };
        let Ok(PersonEvent::Asked(prompt)) = event else {
            continue;
        };
        match &prompt.prompt {
            Prompt::Consent(request) => {
                println!(
                    "[vessel] asks the person: pair \"{}\" ({}), code {} (computed by the vessel)?",
                    printable(&request.name),
                    request.device_id,
                    request.code
                );
                println!("[vessel]   channel  {}", channel_words(request.channel));
                for cap in &request.capabilities {
                    let asks = if cap.confirm { ", asks every time" } else { "" };
                    println!(
                        "[vessel]   - {} ({}{asks}): {}",
                        cap.name,
                        cap.kind,
                        printable(&cap.description)
                    );
                }
                // A person reads the code on the lamp before answering.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let on_lamp = shown.lock().unwrap_or_else(PoisonError::into_inner).clone();
                if on_lamp.as_deref() == Some(request.code.as_str()) {
                    println!(
                        "[person: demo approver] the lamp shows {} too: the codes match; grant read_light and set_light, not strobe",
                        request.code
                    );
                    let _ = vessel.person().answer_consent(
                        prompt.id,
                        ConsentDecision::approve(["read_light", "set_light"]),
                    );
                } else {
                    println!(
                        "[person: demo approver] the lamp shows {}, not {}: someone may be in the middle; refused",
                        on_lamp.as_deref().unwrap_or("no code"),
                        request.code
                    );
                    let _ = vessel
                        .person()
                        .answer_consent(prompt.id, ConsentDecision::refuse());
                }
            }
            Prompt::Approval(request) => {
                println!(
                    "[vessel] asks the person: allow {} with {}? ({})",
                    request.tool,
                    printable(&Value::Object(request.input.clone()).to_string()),
                    printable(&request.reason)
                );
                println!("[person: demo approver] yes");
                let _ = vessel.person().answer_approval(prompt.id, true);
            }
        }
    }
}

async fn story(vessel: &Arc<Vessel>, lamp: &Lamp) -> Result<(), String> {
    step("The lamp connects and asks to pair");
    wait_for(
        || vessel.links().is_connected("desk-lamp"),
        "the lamp to pair and connect",
    )
    .await?;
    let channel = vessel
        .registry()
        .get("desk-lamp")
        .map(|paired| paired.channel());
    match channel {
        Some(dk_proto::Channel::Dk2) => println!(
            "[vessel] paired and connected over dk/2: desk-lamp; its key is pinned as its credential, no token crossed the wire"
        ),
        _ => println!("[vessel] paired and connected: desk-lamp; only a hash of its token is kept"),
    }

    step("The agent's tools: granted capabilities only");
    for tool in vessel.adapter().tool_definitions() {
        println!("[agent]  {}: {}", tool.name, printable(&tool.description));
    }

    step("An allowed call");
    let outcome = vessel
        .adapter()
        .execute(SET, json!({"on": true, "brightness": 70}), AGENT)
        .await;
    println!("[agent]  {SET} -> {}", json!(outcome));
    expect(outcome.is_ok() && lamp.state().on, "the lamp to turn on")?;

    step("A refused call: strobe was not granted");
    let outcome = vessel.adapter().execute(STROBE, json!({}), AGENT).await;
    println!("[agent]  {STROBE} -> {}", json!(outcome));
    expect(!outcome.is_ok(), "strobe to be refused")?;

    step("A refused call: bad input never reaches the device");
    let outcome = vessel
        .adapter()
        .execute(SET, json!({"on": "yes please"}), AGENT)
        .await;
    println!("[agent]  {SET} -> {}", json!(outcome));
    expect(!outcome.is_ok(), "bad input to be refused")?;

    step("The person grants strobe, which asks every time");
    vessel
        .registry()
        .grant("desk-lamp", "strobe")
        .map_err(|e| e.to_string())?;
    println!("[person] grants strobe");
    let person = Arc::clone(vessel.person());
    let ctx = CallContext {
        approver: Some(person.as_ref()),
        ..AGENT
    };
    let outcome = vessel.adapter().execute(STROBE, json!({}), ctx).await;
    println!("[agent]  {STROBE} -> {}", json!(outcome));
    expect(outcome.is_ok(), "strobe to run after the person's yes")?;

    step("The person revokes set_light; the next call is refused");
    vessel
        .registry()
        .revoke("desk-lamp", "set_light")
        .map_err(|e| e.to_string())?;
    println!("[person] revokes set_light");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let outcome = vessel
        .adapter()
        .execute(SET, json!({"on": false}), AGENT)
        .await;
    println!("[agent]  {SET} -> {}", json!(outcome));
    expect(
        !outcome.is_ok() && lamp.state().on,
        "the call after the revoke to be refused",
    )?;

    step("The decision records (one per call)");
    for record in vessel.recent_decisions() {
        println!("[audit]  {}", printable(&record.to_string()));
    }
    step("Shutting down");
    Ok(())
}

fn expect(condition: bool, what: &str) -> Result<(), String> {
    if condition {
        Ok(())
    } else {
        Err(format!("expected {what}"))
    }
}

async fn wait_for(condition: impl Fn() -> bool, what: &str) -> Result<(), String> {
    for _ in 0..500 {
        if condition() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("timed out waiting for {what}"))
}

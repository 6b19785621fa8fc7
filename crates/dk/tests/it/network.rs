//! The two-terminal run across a network: `dk vessel --listen 0.0.0.0:...`
//! and `dk device simulate lamp --vessel ws://<address>/device` pair over
//! dk/2 by comparing codes, the lamp pins the fingerprint the vessel
//! printed, and the lamp's second run reconnects by its key alone.

use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::process::{Killed, Running, Scratch, devices, eventually};

/// Starts the simulated lamp on `url` with its key in `key`, its standard
/// output in `out`.
fn lamp(url: &str, key: &std::path::Path, out: &std::path::Path) -> Killed {
    Killed(
        Command::new(env!("CARGO_BIN_EXE_dk"))
            .args(["device", "simulate", "lamp", "--vessel", url])
            .arg("--key-file")
            .arg(key)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// The text after `label` on the line of `text` that holds it.
fn after(text: &str, label: &str) -> Option<String> {
    let line = text.lines().find(|l| l.contains(label))?;
    let rest = line.split_once(label)?.1;
    Some(rest.split_whitespace().next()?.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_terminals_pair_over_dk2_beyond_loopback_by_comparing_codes() {
    let scratch = Scratch::new("network");
    let vessel = Running::start_with(
        &scratch,
        &["--listen", "0.0.0.0:0", "--mcp-listen", "127.0.0.1:0"],
    );
    let printed = vessel.said("vessel fingerprint");
    assert!(printed.contains("dk/2, encrypted"), "{printed}");
    let fingerprint = after(&printed, "vessel fingerprint").unwrap();
    let admin = vessel.admin(&scratch);
    // The listener is beyond loopback; the lamp reaches it by its port.
    let url = format!("ws://127.0.0.1:{}/device", vessel.devices.port());
    let key = scratch.root().join("lamp.key");
    let out = scratch.root().join("lamp.out");
    let first = lamp(&url, &key, &out);

    // The person compares the lamp's code with the prompt's, then pairs.
    let (id, code) = eventually("the lamp's pairing request", || async {
        let pending = admin.get("/v1/pending").await.ok()?;
        let prompt = pending.body.as_array()?.first()?.clone();
        Some((prompt["id"].as_u64()?, prompt["request"].clone()))
    })
    .await;
    assert_eq!(code["channel"], "dk/2", "{code}");
    let shown = eventually("the lamp's code", || async {
        after(&std::fs::read_to_string(&out).ok()?, "Pairing code:")
    })
    .await;
    assert_eq!(Value::from(shown), code["code"]);
    let answer = admin
        .post(
            &format!("/v1/pending/{id}/consent"),
            &json!({"approved": true, "grant": ["read_light"]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 204, "{answer:?}");
    let pinned = eventually("the lamp's pin", || async {
        after(
            &std::fs::read_to_string(&out).ok()?,
            "the vessel's key is pinned:",
        )
    })
    .await;
    assert_eq!(pinned, fingerprint);
    let listed = eventually("the lamp connected", || async {
        let list = devices(&admin).await;
        let lamp = list.first()?.clone();
        (lamp["connected"] == true).then_some(lamp)
    })
    .await;
    assert_eq!(listed["channel"], "dk/2", "{listed}");
    drop(first);

    // The second run reconnects by key: no prompt for the person.
    eventually("the lamp gone", || async {
        (devices(&admin).await.first()?["connected"] == false).then_some(())
    })
    .await;
    let _second = lamp(&url, &key, &scratch.root().join("lamp-2.out"));
    eventually("the lamp back", || async {
        (devices(&admin).await.first()?["connected"] == true).then_some(())
    })
    .await;
    let pending = admin.get("/v1/pending").await.unwrap().body;
    assert_eq!(pending, json!([]));
}

/// A TCP proxy to `target` whose first connection is cut once `cut`
/// resolves; every later one is forwarded for good.
async fn cutting_proxy(
    target: std::net::SocketAddr,
    cut: tokio::sync::oneshot::Receiver<()>,
) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut cut = Some(cut);
        while let Ok((mut inbound, _)) = listener.accept().await {
            let mut outbound = tokio::net::TcpStream::connect(target).await.unwrap();
            let cut = cut.take();
            tokio::spawn(async move {
                let forward = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                match cut {
                    Some(cut) => {
                        tokio::select! {
                            _ = forward => {}
                            _ = cut => {}
                        }
                    }
                    None => {
                        let _ = forward.await;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_says_when_it_disconnects_and_when_it_reconnects() {
    let scratch = Scratch::new("reconnect");
    // Beyond loopback, so that the proxy's Host is taken.
    let vessel = Running::start_with(
        &scratch,
        &["--listen", "0.0.0.0:0", "--mcp-listen", "127.0.0.1:0"],
    );
    let admin = vessel.admin(&scratch);
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], vessel.devices.port()));
    let (cut, when) = tokio::sync::oneshot::channel();
    let port = cutting_proxy(target, when).await;
    let url = format!("ws://127.0.0.1:{port}/device");
    let out = scratch.root().join("lamp.out");
    let _lamp = lamp(&url, &scratch.root().join("lamp.key"), &out);
    crate::process::approve_when_asked(&admin, "desk-lamp", &["read_light"]).await;
    let printed = || std::fs::read_to_string(&out).unwrap_or_default();
    eventually("the lamp says it connected", || async {
        printed().contains("connected to the vessel").then_some(())
    })
    .await;
    cut.send(()).unwrap();
    let said = eventually("the lamp says it reconnected", || async {
        let said = printed();
        said.contains("reconnected to the vessel").then_some(said)
    })
    .await;
    let line = said
        .lines()
        .find(|l| l.starts_with("disconnected: "))
        .unwrap_or_else(|| panic!("no disconnect line: {said}"));
    assert!(line.contains("trying again in"), "{line}");
    let at = |what: &str| said.find(what).unwrap();
    assert!(
        at("disconnected: ") < at("reconnected to the vessel"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dk_pairings_says_a_key_changed_and_approves_only_with_confirm_change() {
    let scratch = Scratch::new("key-changed");
    let vessel = Running::start(&scratch);
    let admin = vessel.admin(&scratch);
    let url = vessel.url();
    let first = lamp(
        &url,
        &scratch.root().join("first.key"),
        &scratch.root().join("first.out"),
    );
    crate::process::approve_when_asked(&admin, "desk-lamp", &["read_light"]).await;
    eventually("the lamp connected", || async {
        (devices(&admin).await.first()?["connected"] == true).then_some(())
    })
    .await;
    drop(first);

    // The same id with a key of its own.
    let _second = lamp(
        &url,
        &scratch.root().join("second.key"),
        &scratch.root().join("second.out"),
    );
    let id = eventually("the second lamp's request", || {
        crate::process::consent_id(&admin, "desk-lamp")
    })
    .await;
    let listed = scratch.run(&["pairings"]);
    let said = String::from_utf8(listed.stdout).unwrap();
    assert!(said.contains("its key changed"), "{said}");
    assert!(said.contains("--confirm-change"), "{said}");
    let plain = scratch.run(&[
        "pairings",
        "approve",
        &id.to_string(),
        "--grant",
        "read_light",
    ]);
    assert_eq!(plain.status.code(), Some(1), "{plain:?}");
    let refused = String::from_utf8(plain.stderr).unwrap();
    assert!(refused.contains("its key changed"), "{refused}");
    assert!(refused.contains("--confirm-change"), "{refused}");
    // Nothing was answered: the request still waits.
    assert_eq!(
        crate::process::consent_id(&admin, "desk-lamp").await,
        Some(id)
    );
    let confirmed = scratch.run(&[
        "pairings",
        "approve",
        &id.to_string(),
        "--grant",
        "read_light",
        "--confirm-change",
    ]);
    assert_eq!(confirmed.status.code(), Some(0), "{confirmed:?}");
    eventually("the second lamp connected", || async {
        (devices(&admin).await.first()?["connected"] == true).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dk_pairings_approves_a_device_without_a_screen_only_with_without_code() {
    let scratch = Scratch::new("no-screen");
    let vessel = Running::start(&scratch);
    let admin = vessel.admin(&scratch);
    let manifest = json!({
        "id": "hall-sensor",
        "name": "Hall sensor",
        "kind": "sensor",
        "version": "1.0.0",
        "noScreen": true,
        "capabilities": [
            {"name": "read_motion", "kind": "sensor", "description": "Whether something moves."}
        ]
    });
    // A raw v1 hello (dk-device's client leaves `noScreen` out of it).
    let mut socket = crate::process::hello(&vessel.url(), &manifest)
        .await
        .unwrap();

    let id = eventually("the sensor's request", || {
        crate::process::consent_id(&admin, "hall-sensor")
    })
    .await;
    // Without --without-code the command refuses and says why, answering
    // nothing (before, the vessel took the yes as no pairing, quietly).
    let plain = scratch.run(&[
        "pairings",
        "approve",
        &id.to_string(),
        "--grant",
        "read_motion",
    ]);
    assert_eq!(plain.status.code(), Some(1), "{plain:?}");
    let refused = String::from_utf8(plain.stderr).unwrap();
    assert!(refused.contains("cannot show a code"), "{refused}");
    assert!(refused.contains("--without-code"), "{refused}");
    assert_eq!(
        crate::process::consent_id(&admin, "hall-sensor").await,
        Some(id)
    );
    let knowingly = scratch.run(&[
        "pairings",
        "approve",
        &id.to_string(),
        "--grant",
        "read_motion",
        "--without-code",
    ]);
    assert_eq!(knowingly.status.code(), Some(0), "{knowingly:?}");
    crate::process::read_until(&mut socket, "device:paired")
        .await
        .unwrap();
}

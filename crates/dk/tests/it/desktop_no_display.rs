//! `dk device desktop` against a real `dk vessel` and an agent on `dk mcp`,
//! with no X server at all: the device pairs (its blackout list in the
//! prompt's capabilities), an agent's screenshot is refused naming the
//! display, and bad settings stop it before it connects.

use std::process::{Child, Stdio};

use serde_json::{Value, json};

use crate::approvals::Agent;
use crate::process::{Scratch, consent_id, devices, eventually};

/// The vessel's configuration: desktop-control admitted without asking
/// on each reconnect.
const CONFIG: &str = r#"
[streaming.desktop-control]
enabled = true
requireApproval = false
sandbox = "desktop-test"

[streaming.desktop-control.runLimits]
maxToolCalls = 64
maxTurns = 16
"#;

/// A display no server listens on.
const NO_DISPLAY: &str = ":59321";

struct Desktop(Child);

impl Drop for Desktop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_desktop_pairs_shows_its_blackout_list_and_says_when_its_display_is_away() {
    let scratch = Scratch::new("desktop");
    let config = scratch.root().join("vessel.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let (vessel, _) = crate::agents::start_with(&scratch, &["--config", config.to_str().unwrap()]);
    let admin = vessel.admin(&scratch);
    let out = scratch.root().join("desktop.out");
    let _desktop = Desktop(
        scratch
            .dk(&["device", "desktop", "--vessel", &vessel.url()])
            .args(["--display", NO_DISPLAY, "--id", "office"])
            .args([
                "--blackout-class",
                "KeePassXC",
                "--blackout-region",
                "0,0,200,100",
            ])
            .arg("--key-file")
            .arg(scratch.root().join("office.key"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    let id = eventually("the desktop's pairing request", || {
        consent_id(&admin, "office")
    })
    .await;
    let pending = admin.get("/v1/pending").await.unwrap().body;
    let prompt = pending
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .unwrap()
        .clone();
    assert_eq!(prompt["request"]["kind"], "desktop-control");
    let screenshot = prompt["request"]["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "screenshot")
        .unwrap()
        .clone();
    assert!(
        screenshot["description"].as_str().unwrap().ends_with(
            "Blacked out before any pixel leaves the device: windows of class KeePassXC; screen region 0,0 200x100."
        ),
        "{screenshot}"
    );
    // The device printed the code the person compares, as the simulator does.
    let code = prompt["request"]["code"].as_str().unwrap().to_owned();
    eventually("the device's code", || async {
        let printed = std::fs::read_to_string(&out).ok()?;
        printed
            .contains(&format!("Pairing code: {code}"))
            .then_some(())
    })
    .await;
    let answer = admin
        .post(
            &format!("/v1/pending/{id}/consent"),
            &json!({"approved": true, "grant": ["screenshot"]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 204, "{answer:?}");
    eventually("the desktop connected", || async {
        devices(&admin)
            .await
            .first()
            .is_some_and(|d| d["connected"] == true)
            .then_some(())
    })
    .await;

    let added = admin
        .post(
            "/v1/agents",
            &json!({"name": "looker", "scope": ["office"], "role": "user"}),
        )
        .await
        .unwrap();
    assert_eq!(added.status, 201, "{added:?}");
    let mut agent = Agent::start(&scratch, added.body["credential"].as_str().unwrap());
    agent.call(2, "device__office__screenshot", json!({}));
    let answer: Value = agent.answer(2);
    let text = answer.to_string();
    assert!(
        text.contains(&format!(
            "the X display {NO_DISPLAY} is not reachable; the device reconnects when it returns"
        )),
        "{answer}"
    );
    let printed = std::fs::read_to_string(&out).unwrap();
    assert!(printed.contains("call: screenshot {}"), "{printed}");
    drop(vessel);
}

#[test]
fn bad_settings_stop_the_desktop_before_it_connects() {
    let scratch = Scratch::new("desktop-settings");
    let file = scratch.root().join("desktop.toml");
    let run = |extra: &[&str]| {
        scratch
            .dk(&["device", "desktop", "--vessel", "ws://127.0.0.1:9/device"])
            .args(["--display", NO_DISPLAY])
            .args(extra)
            .output()
            .unwrap()
    };
    std::fs::write(&file, "size = \"800x600\"\ncolour = \"blue\"\n").unwrap();
    let out = run(&["--config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("colour"), "{said}");

    std::fs::write(&file, "[blackout]\nregions = [\"1,2,3\"]\n").unwrap();
    let out = run(&["--config", file.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("region `1,2,3` is not X,Y,W,H"), "{said}");

    let titles: Vec<String> = (0..40).map(|i| format!("*secret {i}*")).collect();
    let mut args = Vec::new();
    for title in &titles {
        args.extend(["--blackout-title", title.as_str()]);
    }
    let out = run(&args);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("the blackout list is too long"), "{said}");

    let out = run(&["--size", "0x0"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["--blackout-region", "a,b,c,d"]);
    assert_eq!(out.status.code(), Some(2));
}

//! `dk device desktop` end to end: a real `dk vessel`, the real device
//! process on an Xvfb of the test's own (1920x1200, screenshots fit to
//! 1280x800), test windows that record what they receive, and rmcp's
//! client as the agent. The person pairs by code, allows with
//! `dk approvals allow`, revokes with `dk devices revoke`; a rule file
//! refuses a word on `type`; a blacked-out window is black in every
//! screenshot and refuses clicks; bad input is refused with the desktop
//! untouched; the X server going away is said, and survived.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use dk_http::AdminClient;
use dk_testkit::x11::{Rect, Rgb, TestWindow, WindowSpec, Xvfb, screen_pixel};
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::process::{Killed, PATIENCE, Running, Scratch, devices, eventually, succeeded};

/// The screen and the screenshot: every coordinate scales by 2/3.
const SCREEN: (u16, u16) = (1920, 1200);
const SHOT: (u32, u32) = (1280, 800);

/// The window with the button, and the button inside it (screen pixels:
/// multiples of 3, so that the screenshot's edges fall on whole pixels).
const WINDOW: Rect = Rect::new(150, 150, 900, 600);
const BUTTON: Rect = Rect::new(300, 240, 240, 120);
const BACKGROUND: Rgb = Rgb(230, 200, 40);
const BUTTON_COLOUR: Rgb = Rgb(30, 90, 200);

/// The password manager of the test: blacked out by its class.
const VAULT: Rect = Rect::new(1200, 300, 600, 450);
const VAULT_COLOUR: Rgb = Rgb(200, 50, 60);

/// Everything the device declares: the person grants it all.
const CAPABILITIES: [&str; 14] = [
    "screenshot",
    "zoom",
    "cursor_position",
    "mouse_move",
    "left_click",
    "right_click",
    "middle_click",
    "double_click",
    "triple_click",
    "left_click_drag",
    "scroll",
    "key",
    "type",
    "wait",
];

/// The rule the person starts with: never type the launch codes.
const RULES: &str = "version: 1\npolicies:\n  - name: no-launch-codes\n    action: device_use\n    condition: \"deviceId equals desktop and capability equals type and input.text contains launch-codes\"\n    decision: block\n    message: Never type the launch codes\n";

/// The vessel's configuration: desktop-control admitted (deny by default),
/// without asking on each reconnect; no rate limit on the agent, which
/// calls faster than an agent would.
const CONFIG: &str = r#"
[rateLimits]
callsPerMinute = 0
perDeviceCallsPerMinute = 0

[streaming.desktop-control]
enabled = true
requireApproval = false
sandbox = "desktop-test"

[streaming.desktop-control.runLimits]
maxToolCalls = 64
maxTurns = 16
"#;

fn tool(capability: &str) -> String {
    format!("device__desktop__{capability}")
}

/// A `dk device desktop` process, killed on drop; its standard output
/// and error go to files.
struct DeviceProcess {
    child: Killed,
    stdout: PathBuf,
}

impl DeviceProcess {
    fn start(scratch: &Scratch, vessel: &Running, display: &str) -> DeviceProcess {
        let stdout = scratch.root().join("desktop.out");
        let child = scratch
            .dk(&["device", "desktop", "--vessel", &vessel.url()])
            .arg("--key-file")
            .arg(scratch.root().join("desktop.key"))
            .args(["--display", display, "--size", "1280x800"])
            .args(["--blackout-class", "vault"])
            .env_remove("DISPLAY")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(stdout.with_extension("err")).unwrap())
            .spawn()
            .unwrap();
        DeviceProcess {
            child: Killed(child),
            stdout,
        }
    }

    /// What it printed and logged so far.
    fn said(&self) -> String {
        let out = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        let err = std::fs::read_to_string(self.stdout.with_extension("err")).unwrap_or_default();
        format!("{out}{err}")
    }

    /// Fails the test, with what it said, if it exited.
    #[track_caller]
    fn check_running(&mut self) {
        if let Some(status) = self.child.0.try_wait().unwrap() {
            panic!("dk device desktop exited ({status}): {}", self.said());
        }
    }

    /// The pairing code it printed, once it did.
    async fn code(&mut self) -> String {
        dk_testkit::eventually_some("dk device desktop's pairing code", || {
            self.check_running();
            self.said()
                .lines()
                .find_map(|l| l.trim().strip_prefix("Pairing code: "))
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_owned)
        })
        .await
    }
}

type Client = RunningService<RoleClient, ()>;

/// The vessel, the device paired with everything granted, and an agent
/// on MCP; the X server and the scratch home they run on. Dropped in
/// this order: the agent, the device, the vessel, the X server, the
/// files.
struct Desk {
    client: Client,
    device: DeviceProcess,
    admin: AdminClient,
    _vessel: Running,
    xvfb: Xvfb,
    scratch: Scratch,
}

impl Desk {
    async fn start(name: &str, xvfb: Xvfb) -> Desk {
        let scratch = Scratch::new(name);
        let rules = scratch.root().join("rules.yaml");
        std::fs::write(&rules, RULES).unwrap();
        let config = scratch.root().join("vessel.toml");
        std::fs::write(&config, CONFIG).unwrap();
        let (vessel, mcp) = crate::agents::start_with(
            &scratch,
            &[
                "--policies",
                rules.to_str().unwrap(),
                "--config",
                config.to_str().unwrap(),
            ],
        );
        let admin = vessel.admin(&scratch);
        let mut device = DeviceProcess::start(&scratch, &vessel, &xvfb.display());

        // The person checks the code the device shows against the
        // vessel's prompt, reads the blackout list in it, and grants.
        let shown = device.code().await;
        let prompt = eventually("the desktop's pairing request", || async {
            let pending = admin.get("/v1/pending").await.ok()?.body;
            pending.as_array()?.iter().find_map(|p| {
                (p["kind"] == "consent" && p["request"]["deviceId"] == "desktop").then(|| p.clone())
            })
        })
        .await;
        assert_eq!(prompt["request"]["code"].as_str(), Some(shown.as_str()));
        assert_eq!(prompt["request"]["kind"], "desktop-control");
        let asked = prompt["request"].to_string();
        assert!(
            asked
                .contains("Blacked out before any pixel leaves the device: windows of class vault"),
            "{asked}"
        );
        let answer = admin
            .post(
                &format!("/v1/pending/{}/consent", prompt["id"]),
                &json!({"approved": true, "grant": CAPABILITIES}),
            )
            .await
            .unwrap();
        assert_eq!(answer.status, 204, "{answer:?}");
        eventually("the desktop connected", || async {
            devices(&admin)
                .await
                .iter()
                .any(|d| d["id"] == "desktop" && d["connected"] == true)
                .then_some(())
        })
        .await;

        let added = admin
            .post(
                "/v1/agents",
                &json!({"name": "operator", "scope": ["desktop"], "role": "user"}),
            )
            .await
            .unwrap();
        assert_eq!(added.status, 201, "{added:?}");
        let credential = added.body["credential"].as_str().unwrap().to_owned();
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("http://{mcp}/mcp"))
                .auth_header(credential),
        );
        let client = ().serve(transport).await.unwrap();
        Desk {
            client,
            device,
            admin,
            _vessel: vessel,
            xvfb,
            scratch,
        }
    }

    /// Calls `capability` with `input` and answers no prompt: the answer
    /// as JSON (`content`, `isError`), a refusal of the call itself as an
    /// error with its text.
    async fn call(&self, capability: &str, input: Value) -> Value {
        call(&self.client, capability, input).await
    }

    /// Calls `capability`, allowing with `dk approvals allow` the person's
    /// prompt if one comes; the answer, and whether the person was asked.
    async fn call_allowing(&self, capability: &str, input: Value) -> (Value, bool) {
        let peer = self.client.peer().clone();
        let capability = capability.to_owned();
        let mut call = tokio::spawn(async move { call(&peer, &capability, input).await });
        let mut asked = false;
        let waiting = async {
            loop {
                tokio::select! {
                    answer = &mut call => return answer.unwrap(),
                    // Looks for the person's prompt every 20 ms meanwhile.
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
                if asked {
                    continue;
                }
                let pending = self.admin.get("/v1/pending").await.unwrap().body;
                let approval = pending.as_array().and_then(|list| {
                    list.iter()
                        .find(|p| p["kind"] == "approval")
                        .and_then(|p| p["id"].as_u64())
                });
                if let Some(id) = approval {
                    succeeded(&self.scratch.run(&["approvals", "allow", &id.to_string()]));
                    asked = true;
                }
            }
        };
        let answer = tokio::time::timeout(PATIENCE * 3, waiting)
            .await
            .expect("the call never ended");
        (answer, asked)
    }
}

async fn call(client: &rmcp::Peer<RoleClient>, capability: &str, input: Value) -> Value {
    let Value::Object(arguments) = input else {
        panic!("input must be an object: {input}");
    };
    match client
        .call_tool(CallToolRequestParams::new(tool(capability)).with_arguments(arguments))
        .await
    {
        Ok(result) => serde_json::to_value(result).unwrap(),
        Err(e) => json!({"isError": true, "content": [{"type": "text", "text": e.to_string()}]}),
    }
}

/// The text of an answer's content.
fn text(answer: &Value) -> String {
    answer["content"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// The reason of a refused call; fails the test if it was not refused.
#[track_caller]
fn refused(answer: &Value) -> String {
    assert_eq!(answer["isError"], true, "not refused: {answer}");
    let reason = text(answer);
    assert!(!reason.is_empty(), "refused without a reason: {answer}");
    reason
}

/// The answer of a call that succeeded; fails the test otherwise.
#[track_caller]
fn answered(answer: &Value) -> &Value {
    assert_ne!(answer["isError"], true, "refused: {answer}");
    answer
}

/// A screenshot as MCP image content: its width, height and RGB pixels.
struct Shot {
    width: u32,
    height: u32,
    rgb: Vec<u8>,
}

impl Shot {
    fn from_answer(answer: &Value) -> Shot {
        let answer = answered(answer);
        let image = answer["content"]
            .as_array()
            .and_then(|items| items.iter().find(|item| item["type"] == "image"))
            .unwrap_or_else(|| panic!("no image content in {}", short(answer)));
        assert_eq!(image["mimeType"], "image/png");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(image["data"].as_str().unwrap())
            .unwrap();
        Shot::decode(&bytes)
    }

    fn decode(png_bytes: &[u8]) -> Shot {
        let mut decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
        decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
        let mut reader = decoder.read_info().unwrap();
        let mut buffer = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buffer).unwrap();
        let channels = match info.color_type {
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            other => panic!("a screenshot in {other:?}"),
        };
        let rgb = buffer[..info.buffer_size()]
            .chunks(channels)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect();
        Shot {
            width: info.width,
            height: info.height,
            rgb,
        }
    }

    fn pixel(&self, x: u32, y: u32) -> Rgb {
        let i = usize::try_from((y * self.width + x) * 3).unwrap();
        Rgb(self.rgb[i], self.rgb[i + 1], self.rgb[i + 2])
    }
}

/// An answer cut short for a message (an image is long).
fn short(answer: &Value) -> String {
    let text = answer.to_string();
    text.chars().take(600).collect()
}

/// The colour the screenshot must show where the screen shows (`x`,
/// `y`): the windows', black in the vault and on the bare root.
fn expected_at(window: &WindowSpec, x: i32, y: i32) -> Rgb {
    if VAULT.contains(x, y) {
        return Rgb::BLACK;
    }
    window.colour_at(x, y).unwrap_or(Rgb::BLACK)
}

/// Every screenshot pixel whose source on the screen is all one colour
/// (more than two screen pixels from any edge) is that colour; returns the
/// pixels that are not, at most ten.
fn mismatches(shot: &Shot, window: &WindowSpec) -> Vec<String> {
    let (sw, sh) = (f64::from(SCREEN.0), f64::from(SCREEN.1));
    let (scale_x, scale_y) = (sw / f64::from(shot.width), sh / f64::from(shot.height));
    let mut found = Vec::new();
    for y in 0..shot.height {
        for x in 0..shot.width {
            #[expect(clippy::cast_possible_truncation, reason = "screen pixels")]
            let corners = [
                (
                    (f64::from(x) * scale_x) as i32 - 2,
                    (f64::from(y) * scale_y) as i32 - 2,
                ),
                (
                    (f64::from(x + 1) * scale_x) as i32 + 2,
                    (f64::from(y) * scale_y) as i32 - 2,
                ),
                (
                    (f64::from(x) * scale_x) as i32 - 2,
                    (f64::from(y + 1) * scale_y) as i32 + 2,
                ),
                (
                    (f64::from(x + 1) * scale_x) as i32 + 2,
                    (f64::from(y + 1) * scale_y) as i32 + 2,
                ),
            ];
            let colours: Vec<Rgb> = corners
                .iter()
                .map(|&(cx, cy)| expected_at(window, cx, cy))
                .collect();
            if colours.iter().any(|c| *c != colours[0]) {
                continue;
            }
            let got = shot.pixel(x, y);
            if !got.near(colours[0], 6) && found.len() < 10 {
                found.push(format!("({x}, {y}): {got:?}, expected {:?}", colours[0]));
            }
        }
    }
    found
}

/// The screenshot point of a screen point (exact: both are multiples of 3).
fn to_shot(x: i32, y: i32) -> (i32, i32) {
    (x * 2 / 3, y * 2 / 3)
}

fn open_windows(xvfb: &Xvfb) -> (TestWindow, TestWindow) {
    let spec = WindowSpec::new("Form — test", WINDOW)
        .class("form", "Form")
        .background(BACKGROUND)
        .button(BUTTON, BUTTON_COLOUR);
    let window = TestWindow::open(&xvfb.display(), spec).unwrap();
    let vault = TestWindow::open(
        &xvfb.display(),
        WindowSpec::new("Secret vault", VAULT)
            .class("vault", "Vault")
            .background(VAULT_COLOUR),
    )
    .unwrap();
    (window, vault)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_sees_the_screen_clicks_and_types_as_the_person_allows() {
    let xvfb = Xvfb::start(SCREEN.0, SCREEN.1);
    let (window, vault) = open_windows(&xvfb);
    let desk = Desk::start("desktop", xvfb).await;
    let display = desk.xvfb.display();

    // The screenshot: a PNG of 1280x800, the windows' colours where
    // they are, black over the vault (which the screen does show).
    let answer = desk.call("screenshot", json!({})).await;
    let shot = Shot::from_answer(&answer);
    assert_eq!((shot.width, shot.height), SHOT);
    let (vx, vy) = VAULT.centre();
    assert_eq!(
        screen_pixel(
            &display,
            i16::try_from(vx).unwrap(),
            i16::try_from(vy).unwrap()
        )
        .unwrap(),
        VAULT_COLOUR
    );
    let wrong = mismatches(&shot, window.spec());
    assert!(wrong.is_empty(), "the screenshot differs: {wrong:?}");
    let (bx, by) = to_shot(BUTTON.centre().0 + 150, BUTTON.centre().1 + 150);
    assert_eq!(shot.pixel(380, 300), BUTTON_COLOUR);
    assert_eq!((bx, by), (380, 300));
    let (sx, sy) = to_shot(vx, vy);
    assert_eq!(
        shot.pixel(u32::try_from(sx).unwrap(), u32::try_from(sy).unwrap()),
        Rgb::BLACK
    );
    // The result's JSON beside the image says so too.
    let json_part: Value = answer["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|item| item["text"].as_str())
        .find_map(|text| serde_json::from_str(text).ok())
        .unwrap_or_else(|| panic!("no JSON beside the image: {}", short(&answer)));
    assert_eq!(
        (
            &json_part["width"],
            &json_part["height"],
            &json_part["blacked_out"]
        ),
        (&json!(1280), &json!(800), &json!(true)),
        "{json_part}"
    );

    // A click on the button lands where it is on the screen.
    let answer = desk.call("left_click", json!({"x": bx, "y": by})).await;
    answered(&answer);
    let clicks = window.wait_for_clicks(1);
    let click = clicks[0];
    assert_eq!(click.button, 1);
    assert!(click.on_button, "{click:?}");
    assert!(
        (i32::from(click.root_x) - 570).abs() <= 1 && (i32::from(click.root_y) - 450).abs() <= 1,
        "{click:?}"
    );
    let position = desk.call("cursor_position", json!({})).await;
    let position: Value = serde_json::from_str(&text(answered(&position))).unwrap();
    assert_eq!(
        (position["x"].as_f64(), position["y"].as_f64()),
        (Some(380.0), Some(300.0))
    );

    // Typing asks the person every time; once allowed, the window
    // receives exactly the text.
    window.focus().unwrap();
    window.clear();
    let typed = "héllo wörld ✓ 日本 ok";
    let (answer, asked) = desk.call_allowing("type", json!({"text": typed})).await;
    answered(&answer);
    assert!(asked, "type did not ask the person");
    assert_eq!(window.wait_for_text(typed), typed);
    window.sync();
    assert_eq!(window.text(), typed);

    // A new line presses Return and a tab Tab, in the same call: the
    // vessel's input check lets exactly these two through.
    window.clear();
    let lines = "line\n\tindented\n";
    let (answer, asked) = desk.call_allowing("type", json!({"text": lines})).await;
    answered(&answer);
    assert!(asked, "type did not ask the person");
    assert_eq!(window.wait_for_text(lines), lines);
    let (answer, asked) = desk.call_allowing("type", json!({"text": "a\rb"})).await;
    assert!(refused(&answer).contains("[8dk-deny]"));
    assert!(!asked);

    // The most a call types, all of it characters the keyboard lacks,
    // arrives whole within the call's time.
    window.clear();
    let most = "äöüßéèêçñ€".repeat(100);
    let (answer, _) = desk.call_allowing("type", json!({"text": most})).await;
    let answer = answered(&answer);
    assert!(text(answer).contains("\"typed\":1000"), "{}", short(answer));
    assert_eq!(window.wait_for_text(&most), most);
    // A combination arrives as one.
    window.clear();
    let (answer, asked) = desk.call_allowing("key", json!({"text": "ctrl+s"})).await;
    answered(&answer);
    assert!(asked, "key did not ask the person");
    let _ = window.wait_for_keys(1);
    window.sync();
    let keys: Vec<String> = window.keys().iter().map(|k| k.combo()).collect();
    assert_eq!(keys, ["ctrl+s"]);
    assert_eq!(window.text(), "");

    // The vault refuses clicks, drags into it and scrolls over it.
    window.clear();
    let (qx, qy) = to_shot(vx, vy);
    let reason = refused(&desk.call("left_click", json!({"x": qx, "y": qy})).await);
    assert!(
        reason.contains(&format!("the point ({qx}, {qy}) is in a blacked-out area")),
        "{reason}"
    );
    let reason = refused(
        &desk
            .call(
                "left_click_drag",
                json!({"start_x": bx, "start_y": by, "x": qx, "y": qy}),
            )
            .await,
    );
    assert!(reason.contains("is in a blacked-out area"), "{reason}");
    let reason = refused(
        &desk
            .call(
                "scroll",
                json!({"direction": "down", "amount": 3, "x": qx, "y": qy}),
            )
            .await,
    );
    assert!(reason.contains("is in a blacked-out area"), "{reason}");

    // Bad input: a clear refusal, and nothing reaches a window. Numbers
    // out of the manifest's bounds are the vessel's to refuse, naming the
    // bound, before any rule or person.
    let reason = refused(&desk.call("left_click", json!({"x": 1500, "y": 10})).await);
    assert!(
        reason.contains("[8dk-deny] \"x\" must be at most 1279"),
        "{reason}"
    );
    let reason = refused(&desk.call("mouse_move", json!({"x": 10, "y": -1})).await);
    assert!(reason.contains("\"y\" must be at least 0"), "{reason}");
    for amount in [-1, 1000] {
        let answer = desk
            .call(
                "scroll",
                json!({"direction": "down", "amount": amount, "x": bx, "y": by}),
            )
            .await;
        let reason = refused(&answer);
        assert!(reason.contains("amount"), "{amount}: {reason}");
    }
    let reason = refused(
        &desk
            .call("scroll", json!({"direction": "sideways", "amount": 1}))
            .await,
    );
    assert!(reason.contains("direction"), "{reason}");
    let (answer, _) = desk
        .call_allowing("key", json!({"text": "Hyperspace"}))
        .await;
    let reason = refused(&answer);
    assert!(
        reason.contains("\"Hyperspace\" is not a key name"),
        "{reason}"
    );
    let megabyte = "a".repeat(1 << 20);
    let (answer, _) = desk.call_allowing("type", json!({"text": megabyte})).await;
    refused(&answer);
    let reason = refused(&desk.call("wait", json!({"duration": 60})).await);
    assert!(reason.contains("duration"), "{reason}");

    // The person's rule refuses a word before anyone is asked.
    let (answer, asked) = desk
        .call_allowing("type", json!({"text": "the launch-codes are 0000"}))
        .await;
    let reason = refused(&answer);
    assert!(reason.contains("Never type the launch codes"), "{reason}");
    assert!(!asked);

    window.sync();
    vault.sync();
    assert!(
        window.received_nothing(),
        "{:?} {:?}",
        window.clicks(),
        window.keys()
    );
    assert!(
        vault.received_nothing(),
        "{:?} {:?}",
        vault.clicks(),
        vault.keys()
    );

    // Revoked: every call to it is refused, and nothing reaches the window.
    succeeded(
        &desk
            .scratch
            .run(&["devices", "revoke", "desktop", "left_click"]),
    );
    for input in [
        json!({"x": bx, "y": by}),
        json!({}),
        json!({"x": 1, "y": 1}),
    ] {
        let reason = refused(&desk.call("left_click", input).await);
        assert!(reason.contains("[8dk-deny]"), "{reason}");
    }
    window.sync();
    assert!(window.received_nothing(), "{:?}", window.clicks());
    // What is still granted still works.
    answered(&desk.call("double_click", json!({"x": bx, "y": by})).await);
    assert_eq!(window.wait_for_clicks(2).len(), 2);
    drop(window);
    drop(vault);
    drop(desk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_display_going_away_is_said_and_the_device_comes_back_with_it() {
    let xvfb = Xvfb::start(SCREEN.0, SCREEN.1);
    let mut desk = Desk::start("desktop-display", xvfb).await;
    let display = desk.xvfb.display();
    let pid = desk.device.child.0.id();
    let shot = Shot::from_answer(&desk.call("screenshot", json!({})).await);
    assert_eq!((shot.width, shot.height), SHOT);

    desk.xvfb.stop();
    let expected =
        format!("the X display {display} is not reachable; the device reconnects when it returns");
    dk_testkit::eventually_async(
        "a screenshot refused saying the display is gone",
        || async {
            let answer = desk.call("screenshot", json!({})).await;
            (answer["isError"] == true && text(&answer).contains(&expected)).then_some(())
        },
    )
    .await;
    let reason = refused(&desk.call("left_click", json!({"x": 10, "y": 10})).await);
    assert!(reason.contains(&expected), "{reason}");
    desk.device.check_running();
    // It says so in its log, naming the display.
    let said = desk.device.said();
    let logged = said
        .lines()
        .any(|line| line.contains("X display") && line.contains(&display));
    assert!(logged, "the device did not log it: {said}");

    // Back on the same display: the same process serves again.
    desk.xvfb.restart();
    let answer = dk_testkit::eventually_async("the device serving again", || async {
        let answer = desk.call("screenshot", json!({})).await;
        (answer["isError"] != true).then_some(answer)
    })
    .await;
    let shot = Shot::from_answer(&answer);
    assert_eq!((shot.width, shot.height), SHOT);
    let window = TestWindow::open(
        &display,
        WindowSpec::new("Again", WINDOW).background(BACKGROUND),
    )
    .unwrap();
    answered(&desk.call("left_click", json!({"x": 200, "y": 200})).await);
    let click = window.wait_for_clicks(1)[0];
    assert_eq!((click.root_x, click.root_y), (300, 300));
    desk.device.check_running();
    assert_eq!(desk.device.child.0.id(), pid);
    drop(window);
    drop(desk);
}

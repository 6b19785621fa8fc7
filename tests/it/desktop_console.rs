//! The person's console in a real browser with the X11 desktop device on
//! an Xvfb of its own: the agent's screenshot is black over the vault
//! window the device blacks out, and an agent's `type` waits on the
//! console's approval card, which shows the text, until the person allows
//! it; then the focused window receives exactly that text. Screenshots go
//! to `target/console-screenshots/`: `x11-type-approval.png` (the card),
//! `x11-agent-view.png` (what the agent got) and
//! `x11-type-approval-beside-agent-view.png` (the two side by side).

use std::time::Duration;

use base64::Engine as _;
use dk_desktop::{Blackout, Desktop, DesktopConfig};
use dk_device::ClientOptions;
use dk_testkit::x11::{Rect, Rgb, TestWindow, WindowSpec, Xvfb};
use dk_vessel::{Limits, config::VesselConfig};
use fantoccini::Locator;
use serde_json::json;

use crate::browser::{Browser, screenshots};
use crate::net::{DeviceRun, start, temp_dir};

/// The vessel admits desktop-control devices (a streaming kind).
const CONFIG: &str = "[streaming.desktop-control]\nenabled = true\nrequireApproval = false\n\
                      sandbox = \"vm\"\n[streaming.desktop-control.limits]\n\
                      maxChunkBytes = 1048576\n";

/// How long an agent's call waits for the device.
const PATIENCE: Duration = Duration::from_secs(20);

/// What the agent types.
const TEXT: &str = "Meeting notes: ship on Friday ✓";

/// The notes window the agent may see and type into.
const NOTES: Rect = Rect::new(60, 80, 560, 400);
/// The vault the person blacked out.
const VAULT: Rect = Rect::new(700, 160, 460, 360);
const VAULT_RED: Rgb = Rgb(200, 30, 40);
const GREY: Rgb = Rgb(120, 128, 136);

/// Decodes a PNG to its size and RGBA pixels.
fn rgba(png: &[u8]) -> (u32, u32, Vec<u8>) {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(png));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::ALPHA);
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut pixels).unwrap();
    pixels.truncate(info.buffer_size());
    assert_eq!(info.color_type, png::ColorType::Rgba, "{info:?}");
    (info.width, info.height, pixels)
}

/// `left` and `right` side by side on white, top-aligned, as a PNG.
fn beside(left: &[u8], right: &[u8]) -> Vec<u8> {
    let (lw, lh, lp) = rgba(left);
    let (rw, rh, rp) = rgba(right);
    let gap = 24;
    let (width, height) = (lw + gap + rw, lh.max(rh));
    let mut out = vec![255u8; (width * height * 4) as usize];
    let mut put = |x0: u32, w: u32, h: u32, pixels: &[u8]| {
        for y in 0..h {
            let from = (y * w * 4) as usize;
            let to = ((y * width + x0) * 4) as usize;
            out[to..to + (w * 4) as usize].copy_from_slice(&pixels[from..from + (w * 4) as usize]);
        }
    };
    put(0, lw, lh, &lp);
    put(lw + gap, rw, rh, &rp);
    let mut png = Vec::new();
    let mut encoder = png::Encoder::new(&mut png, width, height);
    encoder.set_color(png::ColorType::Rgba);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().unwrap();
    writer.write_image_data(&out).unwrap();
    writer.finish().unwrap();
    png
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desktop_type_waits_on_the_console_while_the_agent_sees_no_vault() {
    let xvfb = Xvfb::start(1280, 800);
    let display = xvfb.display();
    // A grey desktop under the windows, so the vault's black shows.
    let _wallpaper = TestWindow::open(
        &display,
        WindowSpec::new("Wallpaper", Rect::new(0, 0, 1280, 800))
            .class("wallpaper", "Wallpaper")
            .background(GREY),
    )
    .unwrap();
    let notes = TestWindow::open(
        &display,
        WindowSpec::new("Notes", NOTES)
            .class("notes", "Notes")
            .background(Rgb(246, 244, 236))
            .button(Rect::new(24, 330, 160, 44), Rgb(40, 110, 220)),
    )
    .unwrap();
    let vault = TestWindow::open(
        &display,
        WindowSpec::new("Secret vault", VAULT)
            .class("vault", "Vault")
            .background(VAULT_RED),
    )
    .unwrap();
    notes.focus().unwrap();

    let running = start(Limits::default()).await;
    running
        .vessel
        .set_streaming(VesselConfig::parse(CONFIG).unwrap().streaming);
    let config = DesktopConfig {
        display: Some(display.clone()),
        blackout: Blackout::new().class("vault").unwrap(),
        ..DesktopConfig::default()
    };
    let desktop = Desktop::new(&config, None).unwrap();
    let dir = temp_dir();
    let run = DeviceRun::spawn(
        desktop.device().clone(),
        ClientOptions::new(&running.device_url).key_file(dir.path().join("desktop.key")),
    );
    // The pairing prompt names what is blacked out.
    let consent = running.approve_next(&["screenshot", "type"]).await;
    assert!(consent.to_string().contains("vault"), "{consent}");
    running.wait_connected("desktop").await;

    // The agent's view: the notes as painted, the vault black, no red
    // anywhere.
    let shot = running
        .agent_call("device__desktop__screenshot", json!({}), PATIENCE)
        .await
        .unwrap();
    assert_eq!(shot["ok"], json!(true), "{shot}");
    let data = shot["result"]["image"]["data"].as_str().unwrap();
    let agent_view = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    let (width, height, pixels) = rgba(&agent_view);
    assert_eq!((width, height), (1280, 800));
    let at = |x: i32, y: i32| {
        let i = ((y as u32 * width + x as u32) * 4) as usize;
        Rgb(pixels[i], pixels[i + 1], pixels[i + 2])
    };
    let (vx, vy) = VAULT.centre();
    assert_eq!(at(vx, vy), Rgb(0, 0, 0));
    assert_eq!(at(vx, 60), GREY);
    assert_eq!(
        at(NOTES.x as i32 + 10, NOTES.y as i32 + 10),
        Rgb(246, 244, 236)
    );
    let red = pixels
        .chunks_exact(4)
        .filter(|p| Rgb(p[0], p[1], p[2]).near(VAULT_RED, 8))
        .count();
    assert_eq!(red, 0, "vault pixels left the device");
    std::fs::write(screenshots().join("x11-agent-view.png"), &agent_view).unwrap();

    // The agent types: the console shows the card with the text; the
    // window receives nothing until the person allows it once.
    let browser = Browser::start(1280, 900).await;
    let c = &browser.client;
    c.goto(&running.console.login_link().unwrap())
        .await
        .unwrap();
    browser.wait_text("#none", "Nothing is waiting").await;
    let call = running.agent_call("device__desktop__type", json!({"text": TEXT}), PATIENCE);
    let card = browser.wait_text(".prompt.approval", "kitchen").await;
    let text = card.text().await.unwrap();
    assert!(
        text.contains("Agent kitchen asks to use desktop: type") && text.contains(TEXT),
        "{text}"
    );
    let card_png = browser.screenshot("x11-type-approval").await;
    assert!(notes.text().is_empty(), "typed before the person's yes");
    card.find(Locator::Css("button[value=\"once\"]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let outcome = call.await.unwrap();
    assert_eq!(outcome["ok"], json!(true), "{outcome}");
    assert_eq!(notes.wait_for_text(TEXT), TEXT);
    assert!(vault.received_nothing());

    let card_png = std::fs::read(card_png).unwrap();
    std::fs::write(
        screenshots().join("x11-type-approval-beside-agent-view.png"),
        beside(&card_png, &agent_view),
    )
    .unwrap();
    browser.quit().await;
    run.stop().await.unwrap();
    running.stop().await;
    drop(xvfb);
}

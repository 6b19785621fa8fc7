//! The desktop device against a real X server (Xvfb started by each test):
//! screenshots match the windows drawn, blacked-out windows are black and
//! refuse the pointer and the keyboard, clicks land at the scaled-back
//! points, keys and Unicode text reach the focused window, bad input is
//! refused with the desktop untouched, and the display going away and
//! coming back is survived. Without an `Xvfb` binary the tests fail saying
//! how to install it, unless `DK_SKIP_X11=1`.

// Test code throughout: the lint wall's test allowances apply to all of it.
#![cfg(test)]

use base64::Engine as _;
use dk_desktop::{Blackout, Desktop, DesktopConfig, Region};
use dk_testkit::x11::{Rect, Rgb, TestWindow, WindowSpec, Xvfb};
use serde_json::{Map, Value, json};
use x11rb::connection::Connection as _;
use x11rb::protocol::xproto::{ConnectionExt as _, CreateWindowAux, WindowClass};
use x11rb::rust_connection::RustConnection;

/// The screen: 1.5 times the default screenshot size.
const SCREEN: (u16, u16) = (1920, 1200);

const RED: u32 = 0xdd2211;
const GREEN: u32 = 0x22cc44;
const BLUE: u32 = 0x1133ee;
const GREY: u32 = 0x808080;

fn rgb(colour: u32) -> Rgb {
    Rgb((colour >> 16) as u8, (colour >> 8) as u8, colour as u8)
}

/// Starts Xvfb, unless the X11 tests are skipped (`DK_SKIP_X11=1`).
fn xvfb() -> Option<Xvfb> {
    if std::env::var("DK_SKIP_X11").is_ok_and(|v| v == "1") {
        return None;
    }
    Some(Xvfb::start(SCREEN.0, SCREEN.1))
}

/// The plain window: at (300, 300), 600x300, red, a green button at
/// (150, 150) of it, 150x60 (screen 450..600, 450..510).
fn plain(xvfb: &Xvfb) -> TestWindow {
    TestWindow::open(
        &xvfb.display(),
        WindowSpec::new("Notes - shopping", Rect::new(300, 300, 600, 300))
            .class("notes", "Notes")
            .background(rgb(RED))
            .button(Rect::new(150, 150, 150, 60), rgb(GREEN)),
    )
    .unwrap()
}

/// The password manager: at (1200, 600), 400x300, blue, put in a frame as
/// a reparenting window manager does, whose grey title bar is 30 pixels
/// high and has no class or title (the frame is at (1200, 570), 400x330).
fn secret(xvfb: &Xvfb) -> (TestWindow, RustConnection) {
    let window = TestWindow::open(
        &xvfb.display(),
        WindowSpec::new("Vault - KeePassXC", Rect::new(1200, 600, 400, 300))
            .class("keepassxc", "KeePassXC")
            .background(rgb(BLUE)),
    )
    .unwrap();
    let (conn, screen) = RustConnection::connect(Some(&xvfb.display())).unwrap();
    let root = conn.setup().roots[screen].root;
    let frame = conn.generate_id().unwrap();
    conn.create_window(
        x11rb::COPY_DEPTH_FROM_PARENT,
        frame,
        root,
        1200,
        570,
        400,
        330,
        0,
        WindowClass::INPUT_OUTPUT,
        x11rb::COPY_FROM_PARENT,
        &CreateWindowAux::new().background_pixel(GREY),
    )
    .unwrap();
    conn.map_window(frame).unwrap();
    conn.reparent_window(window.id(), frame, 0, 30).unwrap();
    conn.get_input_focus().unwrap().reply().unwrap();
    dk_testkit::eventually_blocking("the frame is painted", || {
        dk_testkit::x11::screen_pixel(&xvfb.display(), 1300, 580).is_ok_and(|p| p == rgb(GREY))
            && dk_testkit::x11::screen_pixel(&xvfb.display(), 1300, 700)
                .is_ok_and(|p| p == rgb(BLUE))
    });
    (window, conn)
}

struct Desk {
    desktop: Desktop,
    runtime: tokio::runtime::Runtime,
}

impl Desk {
    fn new(xvfb: &Xvfb, blackout: Blackout) -> Desk {
        Desk::with_config(
            xvfb,
            DesktopConfig {
                blackout,
                ..DesktopConfig::default()
            },
        )
    }

    /// The device of `config`, on `xvfb`'s display.
    fn with_config(xvfb: &Xvfb, config: DesktopConfig) -> Desk {
        let config = DesktopConfig {
            display: Some(xvfb.display()),
            ..config
        };
        Desk {
            desktop: Desktop::new(&config, None).unwrap(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        }
    }

    fn call(&self, capability: &str, input: Value) -> Result<Value, String> {
        let input: Map<String, Value> = match input {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        self.runtime
            .block_on(self.desktop.device().invoke(capability, input))
            .map_err(|e| e.to_string())
    }
}

/// A decoded screenshot: width, height, RGB rows.
struct Shot {
    width: u32,
    height: u32,
    rgb: Vec<u8>,
    blacked_out: bool,
}

impl Shot {
    fn read(result: &Value) -> Shot {
        assert_eq!(result["image"]["type"], "image");
        assert_eq!(result["image"]["mimeType"], "image/png");
        let data = result["image"]["data"].as_str().unwrap();
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(png));
        let mut reader = decoder.read_info().unwrap();
        let mut rgb = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut rgb).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert_eq!(result["width"], info.width);
        assert_eq!(result["height"], info.height);
        Shot {
            width: info.width,
            height: info.height,
            rgb,
            blacked_out: result["blacked_out"].as_bool().unwrap(),
        }
    }

    fn at(&self, x: u32, y: u32) -> u32 {
        let i = ((y * self.width + x) * 3) as usize;
        u32::from(self.rgb[i]) << 16 | u32::from(self.rgb[i + 1]) << 8 | u32::from(self.rgb[i + 2])
    }

    /// How many pixels have exactly `colour`.
    fn count(&self, colour: u32) -> usize {
        (0..self.height)
            .flat_map(|y| (0..self.width).map(move |x| (x, y)))
            .filter(|&(x, y)| self.at(x, y) == colour)
            .count()
    }

    /// Every pixel of the rectangle has `colour`.
    #[track_caller]
    fn assert_all(&self, (x, y, w, h): (u32, u32, u32, u32), colour: u32) {
        for yy in y..y + h {
            for xx in x..x + w {
                assert_eq!(self.at(xx, yy), colour, "pixel ({xx}, {yy})");
            }
        }
    }
}

macro_rules! needs_x11 {
    () => {
        match crate::xvfb() {
            Some(xvfb) => xvfb,
            None => return,
        }
    };
}

mod reach;

#[test]
fn screenshots_show_the_windows_and_black_out_what_is_listed() {
    let xvfb = needs_x11!();
    let _plain = plain(&xvfb);
    let _secret = secret(&xvfb);
    let blackout = Blackout::new().class("KEEPASSXC").unwrap().region(Region {
        x: 300,
        y: 300,
        width: 150,
        height: 90,
    });
    let desk = Desk::new(&xvfb, blackout);
    let shot = Shot::read(&desk.call("screenshot", json!({})).unwrap());
    assert_eq!((shot.width, shot.height), (1280, 800));
    assert!(shot.blacked_out);
    // The plain window (screen 300..900 x 300..600 is shot 200..600 x
    // 200..400), its button (shot 300..400 x 300..340), inner pixels only.
    shot.assert_all((420, 210, 150, 80), RED);
    shot.assert_all((302, 302, 96, 36), GREEN);
    // The password manager and its frame (shot 800..1067 x 380..600) are
    // black, all of them.
    shot.assert_all((800, 380, 266, 220), 0);
    // So is the region (screen 300..450 x 300..390, the plain window's
    // corner: shot 200..300 x 200..260), and the window beside it is not.
    shot.assert_all((200, 200, 100, 60), 0);
    shot.assert_all((301, 200, 10, 60), RED);
    shot.assert_all((200, 261, 100, 10), RED);

    // A zoom on the button is at the screen's own resolution.
    let zoom = Shot::read(
        &desk
            .call(
                "zoom",
                json!({"x": 300, "y": 300, "width": 100, "height": 40}),
            )
            .unwrap(),
    );
    assert_eq!((zoom.width, zoom.height), (150, 60));
    zoom.assert_all((0, 0, 150, 60), GREEN);
    assert!(!zoom.blacked_out);
    // A zoom over the password manager is black there too.
    let zoom = Shot::read(
        &desk
            .call(
                "zoom",
                json!({"x": 700, "y": 350, "width": 400, "height": 300}),
            )
            .unwrap(),
    );
    assert_eq!((zoom.width, zoom.height), (600, 450));
    assert!(zoom.blacked_out);
    zoom.assert_all((150, 75, 400, 300), 0);
    assert!(
        desk.call(
            "zoom",
            json!({"x": 1300, "y": 0, "width": 10, "height": 10})
        )
        .unwrap_err()
        .contains("x 1300 is outside the screenshot (0 to 1279)")
    );
}

#[test]
fn clicks_land_at_the_scaled_back_points_and_never_in_a_blackout() {
    let xvfb = needs_x11!();
    let plain = plain(&xvfb);
    let (secret, _frame) = secret(&xvfb);
    let desk = Desk::new(&xvfb, Blackout::new().title("*keepass*").unwrap());

    desk.call("left_click", json!({"x": 310, "y": 310}))
        .unwrap();
    let press = plain.wait_for_clicks(1)[0];
    assert_eq!(
        (
            press.button,
            press.on_button,
            (press.root_x, press.root_y),
            (press.x, press.y)
        ),
        (1, true, (465, 465), (165, 165))
    );
    desk.call("right_click", json!({"x": 210, "y": 210}))
        .unwrap();
    desk.call("double_click", json!({"x": 211, "y": 210}))
        .unwrap();
    desk.call("middle_click", json!({})).unwrap();
    desk.call("scroll", json!({"direction": "down", "amount": 3}))
        .unwrap();
    let buttons: Vec<(u8, (i16, i16))> = plain
        .wait_for_clicks(8)
        .iter()
        .map(|p| (p.button, (p.root_x, p.root_y)))
        .collect();
    assert_eq!(
        buttons[1..],
        [
            (3, (315, 315)),
            (1, (317, 315)),
            (1, (317, 315)),
            (2, (317, 315)),
            (5, (317, 315)),
            (5, (317, 315)),
            (5, (317, 315)),
        ]
    );
    desk.call("mouse_move", json!({"x": 100, "y": 700}))
        .unwrap();
    assert_eq!(
        desk.call("cursor_position", json!({})).unwrap(),
        json!({"x": 100, "y": 700})
    );

    // The password manager is at shot 800..1067 x 400..600.
    let refused = [
        ("left_click", json!({"x": 900, "y": 500})),
        ("double_click", json!({"x": 800, "y": 400})),
        ("mouse_move", json!({"x": 1000, "y": 599})),
        (
            "scroll",
            json!({"direction": "up", "amount": 1, "x": 900, "y": 500}),
        ),
        (
            "left_click_drag",
            json!({"start_x": 250, "start_y": 250, "x": 900, "y": 500}),
        ),
    ];
    for (capability, input) in refused {
        let why = desk.call(capability, input.clone()).unwrap_err();
        assert!(
            why.contains("is in a blacked-out area"),
            "{capability} {input}: {why}"
        );
    }
    assert_eq!(
        desk.call("left_click", json!({"x": 900, "y": 500}))
            .unwrap_err(),
        "the point (900, 500) is in a blacked-out area"
    );
    // The pointer did not move there.
    assert_eq!(
        desk.call("cursor_position", json!({})).unwrap(),
        json!({"x": 100, "y": 700})
    );

    // Bad input: refused, nothing sent.
    let bad = [
        (
            "left_click",
            json!({"x": 1500, "y": 10}),
            "x 1500 is outside the screenshot (0 to 1279)",
        ),
        (
            "left_click",
            json!({"x": 10, "y": -1}),
            "y -1 is outside the screenshot (0 to 799)",
        ),
        (
            "left_click",
            json!({"x": 10}),
            "give both x and y, or neither",
        ),
        (
            "scroll",
            json!({"direction": "down", "amount": -3}),
            "amount must be a whole number of wheel clicks from 1 to 30, not -3",
        ),
        (
            "scroll",
            json!({"direction": "down", "amount": 1e9}),
            "amount must be a whole number of wheel clicks from 1 to 30, not 1000000000",
        ),
        (
            "scroll",
            json!({"direction": "down", "amount": 2.5}),
            "amount must be a whole number of wheel clicks from 1 to 30, not 2.5",
        ),
        (
            "scroll",
            json!({"direction": "sideways", "amount": 1}),
            "direction must be up, down, left or right, not \"sideways\"",
        ),
        (
            "key",
            json!({"text": "Hyperspace"}),
            "\"Hyperspace\" is not a key name",
        ),
        (
            "left_click",
            json!({"x": 1e300, "y": 10}),
            "x 1e300 is outside the screenshot (0 to 1279)",
        ),
        (
            "type",
            json!({"text": "a".repeat(1 << 20)}),
            "the text is 1048576 characters; at most 1000 are typed at once",
        ),
        (
            "wait",
            json!({"duration": 10}),
            "duration must be more than 0 and at most 5 seconds, not 10",
        ),
        (
            "left_click",
            json!({"x": 10, "y": 10, "modifiers": "hyper"}),
            "\"hyper\" is not a modifier",
        ),
    ];
    for (capability, input, expected) in bad {
        assert_eq!(
            desk.call(capability, input).unwrap_err(),
            expected,
            "{capability}"
        );
    }
    desk.call(
        "left_click_drag",
        json!({"start_x": 210, "start_y": 210, "x": 500, "y": 350}),
    )
    .unwrap();
    desk.call("wait", json!({"duration": 0.05})).unwrap();
    let drag = plain.wait_for_clicks(9)[8];
    assert_eq!((drag.button, drag.root_x, drag.root_y), (1, 315, 315));
    let release = plain.wait_for_releases(9)[8];
    assert_eq!((release.root_x, release.root_y), (750, 525));
    // Nothing else arrived anywhere.
    plain.sync();
    secret.sync();
    assert_eq!(plain.clicks().len(), 9);
    assert!(secret.received_nothing());
    assert!(plain.keys().is_empty());
}

#[test]
fn keys_and_unicode_text_reach_the_focused_window_unless_it_is_blacked_out() {
    let xvfb = needs_x11!();
    let plain = plain(&xvfb);
    let (secret, _frame) = secret(&xvfb);
    let desk = Desk::new(&xvfb, Blackout::new().class("KeePassXC").unwrap());
    plain.focus().unwrap();

    desk.call("key", json!({"text": "ctrl+s"})).unwrap();
    assert_eq!(plain.wait_for_keys(1)[0].combo(), "ctrl+s");

    let text = "Héllo, wörld! ✓ 😀 ﷽ Ω\nnext\tline ~`{}";
    desk.call("type", json!({"text": text})).unwrap();
    assert_eq!(plain.wait_for_text(text), text);
    desk.call("key", json!({"text": "Return shift+a"})).unwrap();
    let expected = format!("{text}\nA");
    assert_eq!(plain.wait_for_text(&expected), expected);

    // The focus in the password manager (inside its frame): nothing is
    // typed.
    secret.focus().unwrap();
    for (capability, text) in [("type", "hunter2"), ("key", "ctrl+a")] {
        assert_eq!(
            desk.call(capability, json!({"text": text})).unwrap_err(),
            "keys would go to a blacked-out window"
        );
    }
    secret.sync();
    plain.sync();
    assert!(secret.received_nothing());
    assert_eq!(plain.text(), expected);
}

#[test]
fn the_display_going_away_is_said_and_survived() {
    if std::env::var("DK_SKIP_X11").is_ok_and(|v| v == "1") {
        return;
    }
    let mut xvfb = Xvfb::start(640, 480);
    let desk = Desk::new(&xvfb, Blackout::new());
    let shot = Shot::read(&desk.call("screenshot", json!({})).unwrap());
    assert_eq!((shot.width, shot.height), (640, 480));

    xvfb.stop();
    let gone = format!(
        "the X display {} is not reachable; the device reconnects when it returns",
        xvfb.display()
    );
    for (capability, input) in [
        ("screenshot", json!({})),
        ("left_click", json!({"x": 1, "y": 1})),
        ("type", json!({"text": "a"})),
    ] {
        assert_eq!(desk.call(capability, input).unwrap_err(), gone);
    }

    xvfb.restart();
    dk_testkit::eventually_blocking("the device is back", || {
        desk.call("screenshot", json!({})).is_ok()
    });
    desk.call("mouse_move", json!({"x": 1, "y": 1})).unwrap();
}

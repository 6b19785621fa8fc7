//! The test support itself, on a real Xvfb: the window paints what it
//! says, and records clicks and keys sent to the server with XTest.

use x11rb::connection::Connection;
use x11rb::protocol::xproto::{
    BUTTON_PRESS_EVENT, BUTTON_RELEASE_EVENT, ConnectionExt as _, KEY_PRESS_EVENT,
    KEY_RELEASE_EVENT, MOTION_NOTIFY_EVENT,
};
use x11rb::protocol::xtest::ConnectionExt as _;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

use super::*;

const RED: Rgb = Rgb(200, 30, 40);
const BLUE: Rgb = Rgb(20, 60, 220);

fn spec() -> WindowSpec {
    WindowSpec::new("Test — window", Rect::new(20, 30, 200, 100))
        .class("probe", "Probe")
        .background(RED)
        .button(Rect::new(10, 20, 60, 30), BLUE)
}

/// An XTest client: moves, clicks and types as a device would.
struct Fake {
    connection: RustConnection,
    root: u32,
}

impl Fake {
    fn connect(display: &str) -> Fake {
        let (connection, screen) = RustConnection::connect(Some(display)).unwrap();
        let root = connection.setup().roots[screen].root;
        Fake { connection, root }
    }

    fn input(&self, kind: u8, detail: u8, x: i16, y: i16) {
        self.connection
            .xtest_fake_input(kind, detail, 0, self.root, x, y, 0)
            .unwrap();
    }

    fn click(&self, x: i16, y: i16, button: u8) {
        self.input(MOTION_NOTIFY_EVENT, 0, x, y);
        self.input(BUTTON_PRESS_EVENT, button, 0, 0);
        self.input(BUTTON_RELEASE_EVENT, button, 0, 0);
        self.connection.sync().unwrap();
    }

    /// The keycode and whether Shift is needed for `keysym`, in the
    /// current mapping.
    fn find(&self, keysym: u32) -> Option<(u8, bool)> {
        let setup = self.connection.setup();
        let (min, max) = (setup.min_keycode, setup.max_keycode);
        let map = self
            .connection
            .get_keyboard_mapping(min, max - min + 1)
            .unwrap()
            .reply()
            .unwrap();
        let per = usize::from(map.keysyms_per_keycode);
        map.keysyms.chunks(per).enumerate().find_map(|(i, row)| {
            let code = min + u8::try_from(i).unwrap();
            match row.iter().position(|k| *k == keysym) {
                Some(0) => Some((code, false)),
                Some(1) => Some((code, true)),
                _ => None,
            }
        })
    }

    /// A keycode with no keysym, to map an unmapped character on.
    fn spare(&self) -> u8 {
        let setup = self.connection.setup();
        let (min, max) = (setup.min_keycode, setup.max_keycode);
        let map = self
            .connection
            .get_keyboard_mapping(min, max - min + 1)
            .unwrap()
            .reply()
            .unwrap();
        let per = usize::from(map.keysyms_per_keycode);
        let index = map
            .keysyms
            .chunks(per)
            .rposition(|row| row.iter().all(|k| *k == 0))
            .unwrap();
        min + u8::try_from(index).unwrap()
    }

    fn tap(&self, code: u8, shift: bool) {
        let shift_code = self.find(0xffe1).unwrap().0;
        if shift {
            self.input(KEY_PRESS_EVENT, shift_code, 0, 0);
        }
        self.input(KEY_PRESS_EVENT, code, 0, 0);
        self.input(KEY_RELEASE_EVENT, code, 0, 0);
        if shift {
            self.input(KEY_RELEASE_EVENT, shift_code, 0, 0);
        }
        self.connection.sync().unwrap();
    }

    /// Types `text` into `window`, mapping each character missing from
    /// the keyboard on a spare keycode first (and the mapping back
    /// afterwards), as xdotool does. A client reads the new mapping only
    /// once told it changed, so each change waits until the window has
    /// read it, and the mapping goes back only once the key arrived.
    fn type_text(&self, window: &TestWindow, text: &str) {
        for c in text.chars() {
            let keysym = match c {
                '\n' => 0xff0d,
                '\t' => 0xff09,
                c if (' '..='~').contains(&c) || ('\u{a0}'..='ÿ').contains(&c) => u32::from(c),
                c => 0x100_0000 + u32::from(c),
            };
            if let Some((code, shift)) = self.find(keysym) {
                self.tap(code, shift);
                continue;
            }
            let spare = self.spare();
            let per = self
                .connection
                .get_keyboard_mapping(spare, 1)
                .unwrap()
                .reply()
                .unwrap()
                .keysyms_per_keycode;
            let mut row = vec![0u32; usize::from(per)];
            row[0] = keysym;
            row[1] = keysym;
            self.connection
                .change_keyboard_mapping(1, spare, per, &row)
                .unwrap();
            self.connection.sync().unwrap();
            window.sync();
            self.tap(spare, false);
            window.sync();
            let blank = vec![0u32; usize::from(per)];
            self.connection
                .change_keyboard_mapping(1, spare, per, &blank)
                .unwrap();
            self.connection.sync().unwrap();
        }
    }

    fn combo(&self, modifier: u32, key: u32) {
        let (modifier, _) = self.find(modifier).unwrap();
        let (key, _) = self.find(key).unwrap();
        self.input(KEY_PRESS_EVENT, modifier, 0, 0);
        self.input(KEY_PRESS_EVENT, key, 0, 0);
        self.input(KEY_RELEASE_EVENT, key, 0, 0);
        self.input(KEY_RELEASE_EVENT, modifier, 0, 0);
        self.connection.sync().unwrap();
    }
}

#[test]
fn the_window_paints_its_colours_and_says_where() {
    let xvfb = Xvfb::start(320, 240);
    let window = TestWindow::open(&xvfb.display(), spec()).unwrap();
    let area = Rect::new(0, 0, 320, 240);
    let pixels = screen_pixels(&xvfb.display(), area).unwrap();
    assert_eq!(pixels.len(), 320 * 240);
    for y in 0..240 {
        for x in 0..320 {
            let got = pixels[usize::try_from(y * 320 + x).unwrap()];
            match window.spec().colour_at(x, y) {
                Some(colour) => assert_eq!(got, colour, "({x}, {y})"),
                // Xvfb's root is black.
                None => assert_eq!(got, Rgb::BLACK, "({x}, {y})"),
            }
        }
    }
    assert_eq!(screen_pixel(&xvfb.display(), 30, 50).unwrap(), BLUE);
    // A picture painted over it.
    let picture: Vec<Rgb> = (0..40 * 30u32)
        .map(|i| {
            let i = u8::try_from(i % 256).unwrap();
            Rgb(i.wrapping_mul(7), i.wrapping_mul(13), 255 - i)
        })
        .collect();
    let area = Rect::new(100, 50, 40, 30);
    window.paint(area, &picture).unwrap();
    let read = screen_pixels(&xvfb.display(), Rect::new(120, 80, 40, 30)).unwrap();
    assert_eq!(read, picture);
    assert!(window.paint(area, &picture[1..]).is_err());
    assert_eq!(
        window.spec().button_on_screen(),
        Some(Rect::new(30, 50, 60, 30))
    );
}

#[test]
fn the_window_records_clicks_sent_with_xtest() {
    let xvfb = Xvfb::start(320, 240);
    let window = TestWindow::open(&xvfb.display(), spec()).unwrap();
    let fake = Fake::connect(&xvfb.display());
    let before = std::time::Instant::now();
    fake.click(60, 65, 1);
    fake.click(200, 100, 3);
    // Outside the window: not its click.
    fake.click(300, 200, 1);
    let clicks = window.wait_for_clicks(2);
    window.sync();
    let clicks: Vec<_> = clicks
        .iter()
        .map(|c| (c.button, c.x, c.y, c.root_x, c.root_y, c.on_button))
        .collect();
    assert_eq!(
        clicks,
        [(1, 40, 35, 60, 65, true), (3, 180, 70, 200, 100, false)]
    );
    assert_eq!(window.clicks().len(), 2);
    assert_eq!(window.wait_for_releases(2).len(), 2);
    assert!(window.clicks()[0].at >= before);
    window.clear();
    window.sync();
    assert!(window.received_nothing());
}

#[test]
fn the_window_reads_typed_text_and_combinations_through_the_mapping() {
    let xvfb = Xvfb::start(320, 240);
    let window = TestWindow::open(&xvfb.display(), spec()).unwrap();
    window.focus().unwrap();
    let fake = Fake::connect(&xvfb.display());
    let text = "Héllo wörld ✓ 日本 ok!\n\tend";
    fake.type_text(&window, text);
    assert_eq!(window.wait_for_text(text), text);
    fake.combo(0xffe3, 0x73);
    let keys = window.wait_for_keys(text.chars().count() + 1);
    let last = keys.last().unwrap();
    assert_eq!((last.combo(), last.text), ("ctrl+s".to_owned(), None));
    assert_eq!(window.text(), text);
    assert_eq!(keys[0].combo(), "H");
    assert_eq!(keys[1].name, "é");
}

#[test]
fn a_server_stopped_and_restarted_keeps_its_display_and_cleans_up() {
    let mut xvfb = Xvfb::start(64, 48);
    let display = xvfb.display();
    let number = xvfb.number();
    assert!(xvfb.is_running());
    assert_eq!(xvfb.size(), (64, 48));
    let window = TestWindow::open(&display, WindowSpec::new("w", Rect::new(0, 0, 8, 8))).unwrap();
    xvfb.stop();
    assert!(!xvfb.is_running());
    // The window's loop sees the display go.
    drop(window);
    assert!(RustConnection::connect(Some(&display)).is_err());
    // While stopped, another server does not take its number.
    let other = Xvfb::start(64, 48);
    assert_ne!(other.number(), number);
    xvfb.restart();
    assert_eq!(xvfb.number(), number);
    assert!(RustConnection::connect(Some(&display)).is_ok());
    let pid = xvfb.pid().unwrap();
    drop(xvfb);
    // Nothing stale is left (another test's server may have the number
    // by now: its socket answers, its lock names it).
    let socket = std::path::PathBuf::from(format!("/tmp/.X11-unix/X{number}"));
    assert!(
        !socket.exists() || std::os::unix::net::UnixStream::connect(&socket).is_ok(),
        "{} is left",
        socket.display()
    );
    let lock = std::fs::read_to_string(format!("/tmp/.X{number}-lock")).unwrap_or_default();
    assert_ne!(lock.trim(), pid.to_string());
}

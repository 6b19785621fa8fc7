//! A window written for the tests: mapped at a given place with a class and
//! a title, painted a background colour with a "button" of another colour,
//! recording the button presses it receives and the text its key presses
//! make (keysyms looked up through the keyboard mapping, read again when
//! the server says it changed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use x11rb::connection::Connection as _;
use x11rb::protocol::Event;
use x11rb::protocol::xproto::{
    AtomEnum, ClientMessageEvent, ConnectionExt as _, CreateWindowAux, EventMask, InputFocus,
    MapState, PropMode, Window, WindowClass,
};
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

/// A button press the window received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Press {
    /// The button (1 left, 2 middle, 3 right, 4-7 the wheel).
    pub button: u8,
    /// The window it went to (the window or its button).
    pub window: Window,
    /// Where, in that window's pixels.
    pub at: (i16, i16),
    /// Where, in screen pixels.
    pub root: (i16, i16),
}

/// A key pressed: its keysym and the modifier state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// The keysym the mapping gives for the keycode and state.
    pub keysym: u32,
    /// The modifier mask at the press.
    pub state: u16,
}

#[derive(Default)]
struct Seen {
    presses: Vec<Press>,
    keys: Vec<Key>,
    text: String,
}

/// Where a test window is and what it looks like.
pub struct Spec<'a> {
    /// Left, top, width, height in screen pixels.
    pub rect: (i16, i16, u16, u16),
    /// WM_CLASS instance and class.
    pub class: (&'a str, &'a str),
    /// WM_NAME and _NET_WM_NAME.
    pub title: &'a str,
    /// The background, 0xRRGGBB.
    pub colour: u32,
    /// The button: left, top, width, height inside the window, and its
    /// colour.
    pub button: (i16, i16, u16, u16, u32),
    /// A frame around the window, as a reparenting window manager makes:
    /// a title bar this high above it, of this colour, with no class or
    /// title of its own.
    pub frame: Option<(u16, u32)>,
}

/// A mapped test window and the thread recording what it receives.
pub struct TestWindow {
    conn: Arc<RustConnection>,
    /// The window.
    pub window: Window,
    /// Its button, a child window.
    pub button: Window,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestWindow {
    /// Maps a window as `spec` says on `conn`'s display and waits until it
    /// is viewable.
    pub fn open(conn: RustConnection, spec: &Spec<'_>) -> TestWindow {
        let conn = Arc::new(conn);
        let screen = &conn.setup().roots[0];
        let (root, depth, visual) = (screen.root, screen.root_depth, screen.root_visual);
        let window = conn.generate_id().unwrap();
        let (x, y, w, h) = spec.rect;
        let events = EventMask::BUTTON_PRESS | EventMask::KEY_PRESS | EventMask::STRUCTURE_NOTIFY;
        let (parent, x, y) = match spec.frame {
            Some((bar, colour)) => {
                let frame = conn.generate_id().unwrap();
                conn.create_window(
                    depth,
                    frame,
                    root,
                    x,
                    y - bar as i16,
                    w,
                    h + bar,
                    0,
                    WindowClass::INPUT_OUTPUT,
                    visual,
                    &CreateWindowAux::new().background_pixel(colour),
                )
                .unwrap();
                conn.map_window(frame).unwrap();
                (frame, 0, bar as i16)
            }
            None => (root, x, y),
        };
        conn.create_window(
            depth,
            window,
            parent,
            x,
            y,
            w,
            h,
            0,
            WindowClass::INPUT_OUTPUT,
            visual,
            &CreateWindowAux::new()
                .background_pixel(spec.colour)
                .event_mask(events),
        )
        .unwrap();
        let button = conn.generate_id().unwrap();
        let (bx, by, bw, bh, bc) = spec.button;
        conn.create_window(
            depth,
            button,
            window,
            bx,
            by,
            bw,
            bh,
            0,
            WindowClass::INPUT_OUTPUT,
            visual,
            &CreateWindowAux::new()
                .background_pixel(bc)
                .event_mask(EventMask::BUTTON_PRESS | EventMask::KEY_PRESS),
        )
        .unwrap();
        let class = format!("{}\0{}\0", spec.class.0, spec.class.1);
        conn.change_property8(
            PropMode::REPLACE,
            window,
            AtomEnum::WM_CLASS,
            AtomEnum::STRING,
            class.as_bytes(),
        )
        .unwrap();
        conn.change_property8(
            PropMode::REPLACE,
            window,
            AtomEnum::WM_NAME,
            AtomEnum::STRING,
            spec.title.as_bytes(),
        )
        .unwrap();
        let net_wm_name = conn
            .intern_atom(false, b"_NET_WM_NAME")
            .unwrap()
            .reply()
            .unwrap()
            .atom;
        let utf8 = conn
            .intern_atom(false, b"UTF8_STRING")
            .unwrap()
            .reply()
            .unwrap()
            .atom;
        conn.change_property8(
            PropMode::REPLACE,
            window,
            net_wm_name,
            utf8,
            spec.title.as_bytes(),
        )
        .unwrap();
        conn.map_window(button).unwrap();
        conn.map_window(window).unwrap();
        conn.flush().unwrap();
        crate::eventually("the test window is viewable", || {
            conn.get_window_attributes(window)
                .ok()
                .and_then(|c| c.reply().ok())
                .is_some_and(|a| a.map_state == MapState::VIEWABLE)
        });
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (conn, seen, stop) = (Arc::clone(&conn), Arc::clone(&seen), Arc::clone(&stop));
            std::thread::spawn(move || record(&conn, &seen, &stop))
        };
        TestWindow {
            conn,
            window,
            button,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// Gives the window the keyboard focus.
    pub fn focus(&self) {
        self.conn
            .set_input_focus(InputFocus::PARENT, self.window, x11rb::CURRENT_TIME)
            .unwrap();
        self.conn.get_input_focus().unwrap().reply().unwrap();
    }

    /// The button presses received so far.
    pub fn presses(&self) -> Vec<Press> {
        self.seen.lock().unwrap().presses.clone()
    }

    /// The keys received so far.
    pub fn keys(&self) -> Vec<Key> {
        self.seen.lock().unwrap().keys.clone()
    }

    /// The text the keys received so far make.
    pub fn text(&self) -> String {
        self.seen.lock().unwrap().text.clone()
    }
}

impl Drop for TestWindow {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the recording thread with a message to the window itself.
        let event = ClientMessageEvent::new(32, self.window, AtomEnum::WM_NAME, [0u32; 5]);
        let _ = self
            .conn
            .send_event(false, self.window, EventMask::STRUCTURE_NOTIFY, event);
        let _ = self.conn.flush();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The keyboard mapping: keysyms per keycode from the first keycode.
struct Mapping {
    first: u8,
    per: usize,
    syms: Vec<u32>,
}

fn mapping(conn: &RustConnection) -> Option<Mapping> {
    let setup = conn.setup();
    let (first, last) = (setup.min_keycode, setup.max_keycode);
    let reply = conn
        .get_keyboard_mapping(first, last - first + 1)
        .ok()?
        .reply()
        .ok()?;
    Some(Mapping {
        first,
        per: usize::from(reply.keysyms_per_keycode),
        syms: reply.keysyms,
    })
}

/// The text a keysym makes: Latin-1 as itself, Unicode keysyms as their
/// code point, Return a new line, Tab a tab.
fn text_of(keysym: u32) -> Option<char> {
    match keysym {
        0xff0d => Some('\n'),
        0xff09 => Some('\t'),
        0x20..=0x7e | 0xa0..=0xff => char::from_u32(keysym),
        0x0100_0000..=0x0110_ffff => char::from_u32(keysym - 0x0100_0000),
        _ => None,
    }
}

fn record(conn: &RustConnection, seen: &Mutex<Seen>, stop: &AtomicBool) {
    let mut keyboard = mapping(conn);
    while !stop.load(Ordering::Relaxed) {
        let Ok(event) = conn.wait_for_event() else {
            return;
        };
        match event {
            Event::ButtonPress(e) => seen.lock().unwrap().presses.push(Press {
                button: e.detail,
                window: e.event,
                at: (e.event_x, e.event_y),
                root: (e.root_x, e.root_y),
            }),
            Event::MappingNotify(_) => keyboard = mapping(conn),
            Event::KeyPress(e) => {
                // Read the mapping now if it changed since (the event may
                // come before the server's word that it changed).
                let Some(map) = &keyboard else { continue };
                let at = usize::from(e.detail - map.first) * map.per;
                let syms = &map.syms[at..at + map.per];
                let state = u16::from(e.state);
                let shifted = state & 1 != 0 && syms.get(1).is_some_and(|&s| s != 0);
                let keysym = if shifted { syms[1] } else { syms[0] };
                let mut seen = seen.lock().unwrap();
                seen.keys.push(Key { keysym, state });
                // Control (4), Mod1 (8) and Mod4 (64) make commands, not text.
                if state & (4 | 8 | 64) == 0
                    && let Some(c) = text_of(keysym)
                {
                    seen.text.push(c);
                }
            }
            _ => {}
        }
    }
}

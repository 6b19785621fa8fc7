//! One connection to an X display, on x11rb's pure-Rust connection: the
//! screen's size, its pixels (GetImage, ZPixmap), the windows to black out
//! (the window tree walked from the root), the pointer, where keys would go,
//! and input through XTest. What must not change between a check and the
//! act it allows runs with the server grabbed ([`Session::grabbed`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use x11rb::connection::{Connection as _, RequestConnection as _};
use x11rb::errors::{ConnectionError, ReplyError};
use x11rb::protocol::xproto::{
    AtomEnum, BUTTON_PRESS_EVENT, ConnectionExt as _, GetPropertyReply, ImageFormat, ImageOrder,
    InputFocus, KEY_PRESS_EVENT, MOTION_NOTIFY_EVENT, MapState, VisualClass, Window,
};
use x11rb::protocol::xtest::{self, ConnectionExt as _};
use x11rb::rust_connection::RustConnection;

use crate::config::{Blackout, WindowNames};
use crate::image::{PixelFormat, Rgb};
use crate::keys::{Combo, Keysym, sym};

/// Most windows the blackout walk visits; a tree larger than this is
/// treated as all blacked out rather than half read.
const MAX_WINDOWS: usize = 20_000;
/// Bytes of a window property read (class and titles), in 4-byte units: a
/// longer one is not read, and matches every pattern.
const PROPERTY_LONGS: u32 = 1024;
/// How long a spare keycode keeps the character it was given after its
/// last press before it may be given another. Many programs (Tk, Xlib's
/// own lookup) read a changed mapping only when they handle the key, which
/// may be a while after it was pressed.
pub const REUSE_AFTER: Duration = Duration::from_millis(250);
/// How long programs are given to read a changed keyboard mapping before
/// a key typed with it arrives: Tk, for one, looks a key up as soon as it
/// reads it, before it handles the mapping's change that came just before.
pub const SETTLE: Duration = Duration::from_millis(100);
/// How long after the last key typed with them the spare keycodes are
/// given back (no keysym on them again).
pub const GIVE_BACK_AFTER: Duration = Duration::from_secs(3);
/// Longest a screenshot or a zoom holds the display grabbed while it
/// reads the window tree and the pixels; past it, it gives up.
pub const GRAB_LIMIT: Duration = Duration::from_secs(1);
/// How long the window tree read for keys is trusted: a call that types
/// longer reads it again.
const TREE_FRESH: Duration = Duration::from_millis(250);
/// About how many bytes of the server's image one GetImage reads.
const STRIP_BYTES: usize = 1 << 20;
/// Motions between the press and the release of a drag.
pub const DRAG_STEPS: i32 = 8;
/// The pause between the motions of a drag.
const DRAG_PAUSE: Duration = Duration::from_millis(5);

/// Why an X request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XError {
    /// The connection is gone (the server exited, the socket closed).
    Gone(String),
    /// The server answered with an error, or something it sent cannot be
    /// used; the connection is fine.
    Failed(String),
}

impl From<ConnectionError> for XError {
    fn from(e: ConnectionError) -> Self {
        XError::Gone(e.to_string())
    }
}

impl From<ReplyError> for XError {
    fn from(e: ReplyError) -> Self {
        match e {
            ReplyError::ConnectionError(e) => XError::Gone(e.to_string()),
            ReplyError::X11Error(e) => XError::Failed(format!(
                "the X server refused a request: {:?}",
                e.error_kind
            )),
        }
    }
}

/// A rectangle of the screen, in screen pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    /// Left edge.
    pub x: i64,
    /// Top edge.
    pub y: i64,
    /// Width.
    pub width: i64,
    /// Height.
    pub height: i64,
}

impl Rect {
    /// True when the screen pixel (`x`, `y`) is inside.
    pub fn contains(&self, x: i64, y: i64) -> bool {
        x >= self.x && y >= self.y && x < self.x + self.width && y < self.y + self.height
    }
}

/// What is blacked out right now: the rectangles (windows and regions) and
/// the windows matched, with the parents seen on the way.
#[derive(Debug, Clone)]
pub struct Blacked {
    /// Every rectangle filled with black.
    pub rects: Vec<Rect>,
    matched: Vec<Window>,
    parents: HashMap<Window, Window>,
    /// The tree was too large to read: everything is blacked out.
    everything: bool,
    /// When it was read.
    read_at: Instant,
}

impl Blacked {
    fn new(rects: Vec<Rect>) -> Self {
        Blacked {
            rects,
            matched: Vec::new(),
            parents: HashMap::new(),
            everything: false,
            read_at: Instant::now(),
        }
    }

    /// True when the screen pixel is in a blacked-out rectangle.
    pub fn covers(&self, x: i64, y: i64) -> bool {
        self.rects.iter().any(|r| r.contains(x, y))
    }

    /// True when a blacked-out rectangle meets the screen rectangle at
    /// (`x`, `y`), `width` x `height`.
    pub fn meets(&self, (x, y, width, height): (u32, u32, u32, u32)) -> bool {
        let (x, y) = (i64::from(x), i64::from(y));
        let (width, height) = (i64::from(width), i64::from(height));
        self.rects
            .iter()
            .any(|r| r.x < x + width && r.y < y + height && r.x + r.width > x && r.y + r.height > y)
    }

    /// True when `top`, a child of the root, is a matched window or holds
    /// one (as a window manager's frame holds its client).
    fn holds_top(&self, top: Window, root: Window) -> bool {
        self.everything || self.matched.iter().any(|&m| self.top_level(m, root) == top)
    }

    /// The ancestor of `window` that is a child of the root (the window
    /// itself when it is one).
    fn top_level(&self, window: Window, root: Window) -> Window {
        let mut top = window;
        for _ in 0..MAX_WINDOWS {
            match self.parents.get(&top) {
                Some(&p) if p != root => top = p,
                _ => break,
            }
        }
        top
    }
}

/// Where keys pressed now would go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeysGo {
    /// To this window or one inside it (a child of the root, a window
    /// manager's frame or a client without one), which is not blacked out.
    To(Window),
    /// Into a blacked-out window.
    Blacked,
    /// To the root window itself, or nowhere (no focus).
    Desktop,
    /// To a window whose place in the tree cannot be read.
    Unknown,
}

impl KeysGo {
    /// Why keys are refused, unless they go to a window.
    pub fn refusal(self) -> Option<&'static str> {
        match self {
            KeysGo::To(_) => None,
            KeysGo::Blacked => Some("keys would go to a blacked-out window"),
            KeysGo::Desktop => {
                Some("keys would go to the desktop itself (no window has the keyboard's focus)")
            }
            KeysGo::Unknown => {
                Some("keys would go to a window the device cannot place, so none are pressed")
            }
        }
    }
}

/// How a run of key combinations ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pressed {
    /// All of them were pressed.
    All,
    /// The first `done` were pressed, then the rest were refused: `why`.
    Stopped {
        /// How many were pressed.
        done: usize,
        /// Why the next one was not.
        why: &'static str,
    },
    /// The first `done` were pressed before the call's time ran out.
    OutOfTime {
        /// How many were pressed.
        done: usize,
    },
}

/// One connection to a display.
pub struct Session {
    conn: RustConnection,
    root: Window,
    screen: usize,
    net_wm_name: u32,
    utf8_string: u32,
    compound_text: u32,
    /// Spare keycodes the device put characters on, kept between calls.
    spares: RefCell<Spares>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// Buttons and keys pressed by an action and not yet released.
#[derive(Default)]
struct Held {
    buttons: Vec<u8>,
    keys: Vec<u8>,
}

impl Session {
    /// Connects to `display` (XAUTHORITY is honoured as Xlib does) and
    /// checks it has XTest.
    pub fn connect(display: &str) -> Result<Self, XError> {
        let (conn, screen) =
            RustConnection::connect(Some(display)).map_err(|e| XError::Gone(e.to_string()))?;
        let root = conn
            .setup()
            .roots
            .get(screen)
            .map(|s| s.root)
            .ok_or_else(|| XError::Failed(format!("the display has no screen {screen}")))?;
        if conn
            .extension_information(xtest::X11_EXTENSION_NAME)?
            .is_none()
        {
            return Err(XError::Failed(
                "the X server has no XTEST extension, which input needs".to_owned(),
            ));
        }
        let net_wm_name = conn.intern_atom(false, b"_NET_WM_NAME")?;
        let utf8_string = conn.intern_atom(false, b"UTF8_STRING")?;
        let compound_text = conn.intern_atom(false, b"COMPOUND_TEXT")?;
        let (net_wm_name, utf8_string, compound_text) = (
            net_wm_name.reply()?.atom,
            utf8_string.reply()?.atom,
            compound_text.reply()?.atom,
        );
        Ok(Session {
            conn,
            root,
            screen,
            net_wm_name,
            utf8_string,
            compound_text,
            spares: RefCell::new(Spares::default()),
        })
    }

    /// Runs `act` with the server grabbed: no other client's request is
    /// served meanwhile, so no window moves, opens, closes or takes the
    /// focus between what `act` reads and what it does. Released after,
    /// even when `act` failed.
    pub fn grabbed<T>(&self, act: impl FnOnce() -> Result<T, XError>) -> Result<T, XError> {
        self.conn.grab_server()?;
        let result = act();
        let released = self
            .conn
            .ungrab_server()
            .and_then(|_| self.conn.flush())
            .map_err(XError::from);
        let value = result?;
        released?;
        Ok(value)
    }

    /// Reads and drops what the server sent unasked (errors of requests
    /// without replies, MappingNotify); fails when the connection is gone.
    pub fn drain(&self) -> Result<(), XError> {
        while self.conn.poll_for_event()?.is_some() {}
        Ok(())
    }

    /// The screen's size now, from the root window.
    pub fn size(&self) -> Result<(u32, u32), XError> {
        let geometry = self.conn.get_geometry(self.root)?.reply()?;
        Ok((
            u32::from(geometry.width).max(1),
            u32::from(geometry.height).max(1),
        ))
    }

    /// The pixels of the screen rectangle at (`x`, `y`), `width` x `height`
    /// (inside the screen), as RGB. Read in strips of about
    /// [`STRIP_BYTES`], so the server's image is never held whole.
    /// Fails once `until` passed, so that a capture under a grab of the
    /// server holds it a bounded time.
    pub fn capture(
        &self,
        (x, y, width, height): (u32, u32, u32, u32),
        until: Instant,
    ) -> Result<Rgb, XError> {
        let to16 = |v: u32| i16::try_from(v).map_err(|_| XError::Failed("off the screen".into()));
        let tou16 = |v: u32| u16::try_from(v).map_err(|_| XError::Failed("off the screen".into()));
        let strip = u32::try_from(STRIP_BYTES / (width.max(1) as usize * 4))
            .unwrap_or(1)
            .clamp(1, height.max(1));
        let mut image = Rgb::black(width, height);
        let mut format = None;
        let mut top = 0;
        while top < height {
            let rows = strip.min(height - top);
            let reply = self
                .conn
                .get_image(
                    ImageFormat::Z_PIXMAP,
                    self.root,
                    to16(x)?,
                    to16(y + top)?,
                    tou16(width)?,
                    tou16(rows)?,
                    u32::MAX,
                )?
                .reply()?;
            let format = match format {
                Some(format) => format,
                None => *format.insert(self.pixel_format(reply.depth, reply.visual)?),
            };
            format
                .decode_rows(&reply.data, &mut image, top, rows)
                .map_err(|e| XError::Failed(e.to_string()))?;
            top += rows;
            if top < height && Instant::now() > until {
                return Err(too_long());
            }
        }
        Ok(image)
    }

    fn pixel_format(&self, depth: u8, visual: u32) -> Result<PixelFormat, XError> {
        let setup = self.conn.setup();
        let bad = |what: &str| XError::Failed(format!("the screen's {what} cannot be read"));
        let pixmap = setup
            .pixmap_formats
            .iter()
            .find(|f| f.depth == depth)
            .ok_or_else(|| bad("pixel format"))?;
        let screen = setup.roots.get(self.screen).ok_or_else(|| bad("screen"))?;
        let visual = if visual == x11rb::NONE {
            screen.root_visual
        } else {
            visual
        };
        let visual = screen
            .allowed_depths
            .iter()
            .flat_map(|d| &d.visuals)
            .find(|v| v.visual_id == visual)
            .ok_or_else(|| bad("visual"))?;
        if visual.class != VisualClass::TRUE_COLOR && visual.class != VisualClass::DIRECT_COLOR {
            return Err(XError::Failed(
                "the screen's visual is not TrueColor or DirectColor, which this device does not read"
                    .to_owned(),
            ));
        }
        PixelFormat::new(
            pixmap.bits_per_pixel,
            pixmap.scanline_pad,
            setup.image_byte_order == ImageOrder::MSB_FIRST,
            [visual.red_mask, visual.green_mask, visual.blue_mask],
        )
        .map_err(|e| XError::Failed(e.to_string()))
    }

    /// What `blackout` covers now: its regions, and the viewable windows
    /// whose class or title it names (found from the root down, so a
    /// client window inside a window manager's frame is found too).
    ///
    /// Meant to run with the server grabbed, with what it allows: the tree
    /// may change between two requests otherwise. Fails once `until`
    /// passed.
    pub fn blacked(&self, blackout: &Blackout, until: Instant) -> Result<Blacked, XError> {
        let mut blacked = Blacked::new(
            blackout
                .regions()
                .iter()
                .map(|r| Rect {
                    x: i64::from(r.x),
                    y: i64::from(r.y),
                    width: i64::from(r.width),
                    height: i64::from(r.height),
                })
                .collect(),
        );
        if blackout.classes().is_empty() && blackout.titles().is_empty() {
            return Ok(blacked);
        }
        let mut level = vec![self.root];
        let mut seen = 0usize;
        // The outer rectangle of every viewable window met, to black out a
        // matched client's whole top-level window (a window manager's
        // frame, title bar included).
        let mut outer: HashMap<Window, Rect> = HashMap::new();
        while !level.is_empty() {
            if Instant::now() > until {
                return Err(too_long());
            }
            let trees = level
                .iter()
                .map(|&w| self.conn.query_tree(w).map(|c| (w, c)))
                .collect::<Result<Vec<_>, _>>()?;
            let mut children = Vec::new();
            for (parent, cookie) in trees {
                match cookie.reply() {
                    Ok(tree) => {
                        for child in tree.children {
                            blacked.parents.insert(child, parent);
                            children.push(child);
                        }
                    }
                    // The window went away meanwhile.
                    Err(ReplyError::X11Error(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            seen += children.len();
            if seen > MAX_WINDOWS {
                let (width, height) = self.size()?;
                blacked.rects.push(Rect {
                    x: 0,
                    y: 0,
                    width: i64::from(width),
                    height: i64::from(height),
                });
                blacked.everything = true;
                return Ok(blacked);
            }
            let attributes = children
                .iter()
                .map(|&w| self.conn.get_window_attributes(w).map(|c| (w, c)))
                .collect::<Result<Vec<_>, _>>()?;
            let mut viewable = Vec::new();
            for (window, cookie) in attributes {
                match cookie.reply() {
                    Ok(a) if a.map_state == MapState::VIEWABLE => viewable.push(window),
                    Ok(_) | Err(ReplyError::X11Error(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let mut next = Vec::new();
            let probes = viewable
                .iter()
                .map(|&w| self.probe(w).map(|p| (w, p)))
                .collect::<Result<Vec<_>, _>>()?;
            for (window, probe) in probes {
                match self.read_probe(probe) {
                    Ok(Some((rect, names))) => {
                        outer.insert(window, rect);
                        if blackout.matches_window(&names) {
                            let top = blacked.top_level(window, self.root);
                            blacked.rects.push(outer.get(&top).copied().unwrap_or(rect));
                            blacked.matched.push(window);
                        } else {
                            next.push(window);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => return Err(e),
                }
            }
            level = next;
        }
        Ok(blacked)
    }

    /// Sends the requests that tell where a window is and what it is called.
    fn probe(&self, window: Window) -> Result<Probe<'_>, ConnectionError> {
        let property = |atom: u32| {
            self.conn
                .get_property(false, window, atom, AtomEnum::ANY, 0, PROPERTY_LONGS)
        };
        Ok(Probe {
            geometry: self.conn.get_geometry(window)?,
            origin: self.conn.translate_coordinates(window, self.root, 0, 0)?,
            class: property(AtomEnum::WM_CLASS.into())?,
            name: property(AtomEnum::WM_NAME.into())?,
            net_name: property(self.net_wm_name)?,
        })
    }

    /// A window's outer rectangle on the screen and what it is called;
    /// `None` when it went away meanwhile.
    fn read_probe(&self, probe: Probe<'_>) -> Result<Option<(Rect, WindowNames)>, XError> {
        let gone = |r: &ReplyError| matches!(r, ReplyError::X11Error(_));
        let geometry = match probe.geometry.reply() {
            Ok(g) => g,
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let origin = match probe.origin.reply() {
            Ok(o) => o,
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let border = i64::from(geometry.border_width);
        let rect = Rect {
            x: i64::from(origin.dst_x) - border,
            y: i64::from(origin.dst_y) - border,
            width: i64::from(geometry.width) + 2 * border,
            height: i64::from(geometry.height) + 2 * border,
        };
        let mut names = WindowNames::default();
        for (cookie, is_class) in [
            (probe.class, true),
            (probe.name, false),
            (probe.net_name, false),
        ] {
            let reply = match cookie.reply() {
                Ok(reply) => reply,
                Err(e) if gone(&e) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            match self.text_of(&reply) {
                Text::Absent => {}
                Text::Unread if is_class => names.class_unread = true,
                Text::Unread => names.title_unread = true,
                Text::Read(text) if is_class => names.class.extend(
                    text.split('\0')
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned),
                ),
                Text::Read(text) => names.titles.push(text),
            }
        }
        Ok(Some((rect, names)))
    }

    /// A text property as read: absent, text, or something that cannot be
    /// read as text whole (longer than the device reads, in a format or
    /// encoding it does not decode), which a blackout counts as matching.
    fn text_of(&self, reply: &GetPropertyReply) -> Text {
        if reply.type_ == x11rb::NONE {
            return Text::Absent;
        }
        if reply.bytes_after > 0 || reply.format != 8 {
            return Text::Unread;
        }
        let value = &reply.value;
        if reply.type_ == u32::from(AtomEnum::STRING) {
            Text::Read(latin1(value))
        } else if reply.type_ == self.utf8_string {
            match String::from_utf8(value.clone()) {
                Ok(text) => Text::Read(text),
                Err(_) => Text::Unread,
            }
        } else if reply.type_ == self.compound_text
            && value
                .iter()
                .all(|&b| matches!(b, 0 | b'\t' | b'\n' | 0x20..=0x7e | 0xa0..=0xff))
        {
            // Compound text without an escape sequence is Latin-1.
            Text::Read(latin1(value))
        } else {
            Text::Unread
        }
    }

    /// Where keys pressed now would go, as the server decides it: to the
    /// focus window (or the window under the pointer inside it), or, when
    /// the focus is the root window or follows the pointer, to the window
    /// under the pointer. Meant to run with the server grabbed, with the
    /// keys it allows.
    pub fn keys_go(&self, blacked: &Blacked) -> Result<KeysGo, XError> {
        let focus = self.conn.get_input_focus()?;
        let pointer = self.conn.query_pointer(self.root)?;
        let (focus, pointer) = (focus.reply()?.focus, pointer.reply()?);
        if focus == u32::from(InputFocus::NONE) {
            return Ok(KeysGo::Desktop);
        }
        let top = if focus == u32::from(InputFocus::POINTER_ROOT) || focus == self.root {
            if blacked.everything
                || blacked.covers(i64::from(pointer.root_x), i64::from(pointer.root_y))
            {
                return Ok(KeysGo::Blacked);
            }
            if pointer.child == x11rb::NONE {
                return Ok(KeysGo::Desktop);
            }
            pointer.child
        } else {
            match self.top_of(focus, blacked)? {
                Some(top) => top,
                None => return Ok(KeysGo::Unknown),
            }
        };
        Ok(if blacked.holds_top(top, self.root) {
            KeysGo::Blacked
        } else {
            KeysGo::To(top)
        })
    }

    /// The child of the root that holds `window` (the window itself when
    /// it is one); `None` when the tree above it cannot be read.
    fn top_of(&self, window: Window, blacked: &Blacked) -> Result<Option<Window>, XError> {
        let mut window = window;
        for _ in 0..64 {
            let parent = match blacked.parents.get(&window) {
                Some(&parent) => parent,
                None => match self.conn.query_tree(window)?.reply() {
                    Ok(tree) => tree.parent,
                    Err(ReplyError::X11Error(_)) => return Ok(None),
                    Err(e) => return Err(e.into()),
                },
            };
            if parent == self.root {
                return Ok(Some(window));
            }
            if parent == x11rb::NONE {
                return Ok(None);
            }
            window = parent;
        }
        Ok(None)
    }

    /// The child of the root at the screen pixel (`x`, `y`), the window a
    /// click there lands in; `None` on the bare desktop.
    pub fn top_at(&self, x: i64, y: i64) -> Result<Option<Window>, XError> {
        let clamp = |v: i64| v.clamp(0, i64::from(i16::MAX)) as i16;
        let reply = self
            .conn
            .translate_coordinates(self.root, self.root, clamp(x), clamp(y))?
            .reply()?;
        Ok((reply.child != x11rb::NONE).then_some(reply.child))
    }

    /// The child of the root the pointer is over; `None` on the bare
    /// desktop.
    pub fn top_under_pointer(&self) -> Result<Option<Window>, XError> {
        let reply = self.conn.query_pointer(self.root)?.reply()?;
        Ok((reply.child != x11rb::NONE).then_some(reply.child))
    }

    /// Where the pointer is, in screen pixels.
    pub fn pointer(&self) -> Result<(i64, i64), XError> {
        let reply = self.conn.query_pointer(self.root)?.reply()?;
        Ok((i64::from(reply.root_x), i64::from(reply.root_y)))
    }

    fn fake(&self, kind: u8, detail: u8, x: i64, y: i64) -> Result<(), XError> {
        let clamp = |v: i64| v.clamp(0, i64::from(i16::MAX)) as i16;
        self.conn
            .xtest_fake_input(kind, detail, 0, self.root, clamp(x), clamp(y), 0)?;
        Ok(())
    }

    /// Moves the pointer to the screen pixel (`x`, `y`).
    pub fn move_to(&self, x: i64, y: i64) -> Result<(), XError> {
        self.fake(MOTION_NOTIFY_EVENT, 0, x, y)?;
        self.finish()
    }

    /// Waits until the server has done every request sent.
    fn finish(&self) -> Result<(), XError> {
        use x11rb::wrapper::ConnectionExt as _;
        self.conn.sync()?;
        self.drain()
    }

    /// Runs `act` with the keys and buttons it presses recorded, and
    /// releases whatever it left pressed, even when it failed.
    fn holding(&self, act: impl FnOnce(&mut Held) -> Result<(), XError>) -> Result<(), XError> {
        let mut held = Held::default();
        let result = act(&mut held);
        for &button in held.buttons.iter().rev() {
            let _ = self.fake(BUTTON_PRESS_EVENT + 1, button, 0, 0);
        }
        for &key in held.keys.iter().rev() {
            let _ = self.fake(KEY_PRESS_EVENT + 1, key, 0, 0);
        }
        result?;
        self.finish()
    }

    fn press_button(&self, held: &mut Held, button: u8) -> Result<(), XError> {
        self.fake(BUTTON_PRESS_EVENT, button, 0, 0)?;
        held.buttons.push(button);
        Ok(())
    }

    fn release_button(&self, held: &mut Held, button: u8) -> Result<(), XError> {
        if let Some(at) = held.buttons.iter().rposition(|&b| b == button) {
            held.buttons.remove(at);
        }
        self.fake(BUTTON_PRESS_EVENT + 1, button, 0, 0)
    }

    fn press_key(&self, held: &mut Held, keycode: u8) -> Result<(), XError> {
        self.fake(KEY_PRESS_EVENT, keycode, 0, 0)?;
        held.keys.push(keycode);
        Ok(())
    }

    fn release_key(&self, held: &mut Held, keycode: u8) -> Result<(), XError> {
        if let Some(at) = held.keys.iter().rposition(|&k| k == keycode) {
            held.keys.remove(at);
        }
        self.fake(KEY_PRESS_EVENT + 1, keycode, 0, 0)
    }

    /// Clicks `button` `count` times at (`x`, `y`) (or where the pointer
    /// is), holding the `modifiers` keysyms meanwhile.
    pub fn click(
        &self,
        at: Option<(i64, i64)>,
        button: u8,
        count: u8,
        modifiers: &[Keysym],
    ) -> Result<(), XError> {
        let keyboard = if modifiers.is_empty() {
            None
        } else {
            Some(Keyboard::read(&self.conn)?)
        };
        let codes = modifiers
            .iter()
            .map(|&m| {
                keyboard
                    .as_ref()
                    .and_then(|k| k.find(m))
                    .map(|(code, _)| code)
                    .ok_or_else(|| no_key(m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.holding(|held| {
            if let Some((x, y)) = at {
                self.fake(MOTION_NOTIFY_EVENT, 0, x, y)?;
            }
            for &code in &codes {
                self.press_key(held, code)?;
            }
            for _ in 0..count {
                self.press_button(held, button)?;
                self.release_button(held, button)?;
            }
            for &code in codes.iter().rev() {
                self.release_key(held, code)?;
            }
            Ok(())
        })
    }

    /// Presses the left button at `from`, moves in steps to `to`, releases
    /// there. `may_press` runs with the server grabbed before the pointer
    /// goes to `from` and presses, `may_release` likewise before the
    /// pointer reaches `to` and releases; when the second refuses, the
    /// button is released back at `from`. The steps between run without
    /// the grab, so that programs follow the drag as it happens.
    pub fn drag(
        &self,
        from: (i64, i64),
        to: (i64, i64),
        may_press: impl FnOnce() -> Result<Result<(), String>, XError>,
        may_release: impl FnOnce() -> Result<Result<(), String>, XError>,
    ) -> Result<Result<(), String>, XError> {
        let mut outcome = Ok(());
        self.holding(|held| {
            let pressed = self.grabbed(|| {
                if let Err(why) = may_press()? {
                    return Ok(Err(why));
                }
                self.fake(MOTION_NOTIFY_EVENT, 0, from.0, from.1)?;
                self.press_button(held, 1)?;
                Ok(Ok(()))
            })?;
            if let Err(why) = pressed {
                outcome = Err(why);
                return Ok(());
            }
            self.finish()?;
            for step in 1..DRAG_STEPS {
                let along = |a: i64, b: i64| a + (b - a) * i64::from(step) / i64::from(DRAG_STEPS);
                self.fake(
                    MOTION_NOTIFY_EVENT,
                    0,
                    along(from.0, to.0),
                    along(from.1, to.1),
                )?;
                self.finish()?;
                std::thread::sleep(DRAG_PAUSE);
            }
            self.grabbed(|| {
                let end = match may_release()? {
                    Ok(()) => to,
                    Err(why) => {
                        outcome = Err(why);
                        from
                    }
                };
                self.fake(MOTION_NOTIFY_EVENT, 0, end.0, end.1)?;
                self.release_button(held, 1)
            })
        })?;
        Ok(outcome)
    }

    /// Turns the wheel: `button` 4 up, 5 down, 6 left, 7 right, `clicks`
    /// times, at (`x`, `y`) or where the pointer is.
    pub fn scroll(&self, at: Option<(i64, i64)>, button: u8, clicks: u8) -> Result<(), XError> {
        self.holding(|held| {
            if let Some((x, y)) = at {
                self.fake(MOTION_NOTIFY_EVENT, 0, x, y)?;
            }
            for _ in 0..clicks {
                self.press_button(held, button)?;
                self.release_button(held, button)?;
            }
            Ok(())
        })
    }

    /// Presses each combination in turn: its modifiers, then its key, then
    /// all released in reverse. Each runs with the server grabbed, after
    /// checking where its keys go ([`Session::keys_go`], the window tree
    /// read again when older than [`TREE_FRESH`] or when the keys' window
    /// changed): nothing can move the focus or the pointer between the
    /// check and the keys. Keys the keyboard lacks are put on spare
    /// keycodes ([`Spares`]). Stops at the first combination refused, or
    /// once `until` passed.
    pub fn press_combos(
        &self,
        combos: &[Combo],
        blackout: &Blackout,
        until: Instant,
    ) -> Result<Pressed, XError> {
        let mut keyboard = Keyboard::read(&self.conn)?;
        let mut spares = self.spares.borrow_mut();
        spares.meet(&keyboard);
        let mut blacked: Option<Blacked> = None;
        let mut window = None;
        let mut outcome = Pressed::All;
        let result = self.holding(|held| {
            for (done, combo) in combos.iter().enumerate() {
                if Instant::now() > until {
                    outcome = Pressed::OutOfTime { done };
                    return Ok(());
                }
                let modifiers = combo
                    .modifiers
                    .iter()
                    .map(|&m| {
                        keyboard
                            .find(m)
                            .map(|(code, _)| code)
                            .ok_or_else(|| no_key(m))
                    })
                    .collect::<Result<Vec<u8>, XError>>()?;
                if keyboard.find(combo.key).is_none() {
                    let upcoming: Vec<Keysym> = combos
                        .get(done..)
                        .unwrap_or(&[])
                        .iter()
                        .map(|c| c.key)
                        .collect();
                    if !spares.prepare(self, &mut keyboard, &upcoming, until)? {
                        outcome = Pressed::OutOfTime { done };
                        return Ok(());
                    }
                }
                let (code, level) = keyboard.find(combo.key).ok_or_else(|| no_key(combo.key))?;
                let shift = if level == 1 && !combo.modifiers.contains(&sym::SHIFT) {
                    Some(
                        keyboard
                            .find(sym::SHIFT)
                            .ok_or_else(|| no_key(sym::SHIFT))?
                            .0,
                    )
                } else {
                    None
                };
                let refused = self.grabbed(|| {
                    let mut goes = None;
                    for fresh in [false, true] {
                        let stale = blacked
                            .as_ref()
                            .is_none_or(|b| b.read_at.elapsed() > TREE_FRESH);
                        if fresh || stale {
                            blacked = Some(self.blacked(blackout, until + GRAB_SLACK)?);
                        }
                        let Some(tree) = &blacked else { continue };
                        let now = self.keys_go(tree)?;
                        goes = Some(now);
                        // The same window as the last combination, checked
                        // on a tree read since: no need to read it again.
                        if fresh || stale || matches!(now, KeysGo::To(w) if Some(w) == window) {
                            break;
                        }
                    }
                    let goes = goes.unwrap_or(KeysGo::Unknown);
                    if let Some(why) = goes.refusal() {
                        return Ok(Some(why));
                    }
                    if let KeysGo::To(w) = goes {
                        window = Some(w);
                    }
                    let mut pressed = Vec::with_capacity(modifiers.len() + 1);
                    for &m in modifiers.iter().chain(&shift) {
                        self.press_key(held, m)?;
                        pressed.push(m);
                    }
                    self.press_key(held, code)?;
                    self.release_key(held, code)?;
                    for m in pressed.into_iter().rev() {
                        self.release_key(held, m)?;
                    }
                    Ok(None)
                })?;
                if let Some(why) = refused {
                    outcome = Pressed::Stopped { done, why };
                    return Ok(());
                }
                spares.pressed(code);
            }
            Ok(())
        });
        result.map(|()| outcome)
    }

    /// Gives the spare keycodes back (no keysym on them) once no key was
    /// typed with them for [`GIVE_BACK_AFTER`], or now when `now`.
    pub fn give_back_spares(&self, now: bool) -> Result<(), XError> {
        let mut spares = self.spares.borrow_mut();
        if !spares.codes.iter().any(|s| s.keysym != 0)
            || (!now && spares.idle_for() < GIVE_BACK_AFTER)
        {
            return Ok(());
        }
        spares.give_back(self)
    }
}

/// Slack beyond a call's time given to reading the tree for its last keys.
const GRAB_SLACK: Duration = Duration::from_millis(500);

/// Why a read under a grab of the server gave up.
fn too_long() -> XError {
    XError::Failed(format!(
        "reading the screen held the display for more than {} ms; zoom on a smaller region",
        GRAB_LIMIT.as_millis()
    ))
}

/// What a text property holds.
enum Text {
    Absent,
    Read(String),
    Unread,
}

fn no_key(keysym: Keysym) -> XError {
    XError::Failed(format!(
        "the keyboard has no key for keysym 0x{keysym:x}, which this needs"
    ))
}

fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

/// The replies a window's probe waits for.
struct Probe<'c> {
    geometry: x11rb::cookie::Cookie<'c, RustConnection, x11rb::protocol::xproto::GetGeometryReply>,
    origin: x11rb::cookie::Cookie<
        'c,
        RustConnection,
        x11rb::protocol::xproto::TranslateCoordinatesReply,
    >,
    class: x11rb::cookie::Cookie<'c, RustConnection, x11rb::protocol::xproto::GetPropertyReply>,
    name: x11rb::cookie::Cookie<'c, RustConnection, x11rb::protocol::xproto::GetPropertyReply>,
    net_name: x11rb::cookie::Cookie<'c, RustConnection, x11rb::protocol::xproto::GetPropertyReply>,
}

/// The keyboard mapping as the server has it.
struct Keyboard {
    first: u8,
    per_keycode: usize,
    keysyms: Vec<Keysym>,
}

impl Keyboard {
    fn read(conn: &RustConnection) -> Result<Self, XError> {
        let setup = conn.setup();
        let (first, last) = (setup.min_keycode, setup.max_keycode);
        let count = last.saturating_sub(first).saturating_add(1);
        let reply = conn.get_keyboard_mapping(first, count)?.reply()?;
        Ok(Keyboard {
            first,
            per_keycode: usize::from(reply.keysyms_per_keycode).max(1),
            keysyms: reply.keysyms,
        })
    }

    fn codes(&self) -> impl Iterator<Item = (u8, &[Keysym])> {
        self.keysyms
            .chunks(self.per_keycode)
            .enumerate()
            .filter_map(|(i, syms)| {
                u8::try_from(usize::from(self.first) + i)
                    .ok()
                    .map(|c| (c, syms))
            })
    }

    /// The keycode that gives `keysym` and the level it is on (0 plain, 1
    /// with shift); lower keycodes first.
    fn find(&self, keysym: Keysym) -> Option<(u8, u8)> {
        for level in 0..2u8 {
            if let Some((code, _)) = self
                .codes()
                .find(|(_, syms)| syms.get(usize::from(level)) == Some(&keysym))
            {
                return Some((code, level));
            }
        }
        None
    }

    /// The keysyms of `code`.
    fn syms(&self, code: u8) -> &[Keysym] {
        let at = usize::from(code.saturating_sub(self.first)) * self.per_keycode;
        self.keysyms.get(at..at + self.per_keycode).unwrap_or(&[])
    }

    /// Keycodes with no keysym at all.
    fn spares(&self) -> Vec<u8> {
        self.codes()
            .filter(|&(code, _)| code > 8)
            .filter(|(_, syms)| syms.iter().all(|&s| s == 0))
            .map(|(c, _)| c)
            .collect()
    }

    fn set(&mut self, code: u8, keysym: Keysym) {
        let at = usize::from(code.saturating_sub(self.first)) * self.per_keycode;
        if let Some(syms) = self.keysyms.get_mut(at..at + self.per_keycode) {
            syms.fill(0);
            if let Some(s) = syms.get_mut(0..2.min(syms.len())) {
                s.fill(keysym);
            }
        }
    }
}

/// Spare keycodes (none of the keyboard's keys on them) the device puts
/// characters on, kept for the connection's life: a keycode keeps its
/// character while programs may still be reading the keys typed with it
/// (at least [`REUSE_AFTER`] after its last press, so a call's keycodes
/// never change under it unless it types more distinct characters than
/// there are spares), and all are given back once unused for
/// [`GIVE_BACK_AFTER`].
#[derive(Debug, Default)]
struct Spares {
    codes: Vec<Spare>,
    last_press: Option<Instant>,
}

/// A spare keycode and what the device put on it.
#[derive(Debug, Clone, Copy)]
struct Spare {
    code: u8,
    /// The keysym on it (0: none).
    keysym: Keysym,
    /// When it was last pressed.
    pressed: Option<Instant>,
}

impl Spares {
    /// Takes the keyboard as it is now: keycodes the device put a keysym on
    /// that no longer hold it were changed by someone else and are no
    /// longer spares; keycodes with no keysym are.
    fn meet(&mut self, keyboard: &Keyboard) {
        self.codes.retain(|spare| {
            let syms = keyboard.syms(spare.code);
            if spare.keysym == 0 {
                syms.iter().all(|&s| s == 0)
            } else {
                syms.contains(&spare.keysym) && syms.iter().all(|&s| s == 0 || s == spare.keysym)
            }
        });
        for code in keyboard.spares() {
            if !self.codes.iter().any(|s| s.code == code) {
                self.codes.push(Spare {
                    code,
                    keysym: 0,
                    pressed: None,
                });
            }
        }
    }

    /// Puts on spare keycodes, all at once, the keysyms the keyboard
    /// lacks among the next of `upcoming` (as many different ones as there
    /// are spares), then lets programs read the new mapping ([`SETTLE`])
    /// before any key typed with it arrives. A spare is given a new keysym
    /// only when it holds none of those, empty ones first, then the one
    /// pressed longest ago, once that was [`REUSE_AFTER`] ago. False when
    /// that wait would pass `until`.
    fn prepare(
        &mut self,
        session: &Session,
        keyboard: &mut Keyboard,
        upcoming: &[Keysym],
        until: Instant,
    ) -> Result<bool, XError> {
        let on_spare = |k: Keysym| self.codes.iter().any(|s| s.keysym == k);
        // The keysyms the next keys need on spares, up to as many as there
        // are spares: those there already stay.
        let mut keep: Vec<Keysym> = Vec::new();
        for &k in upcoming {
            if keep.contains(&k) || (keyboard.find(k).is_some() && !on_spare(k)) {
                continue;
            }
            if keep.len() == self.codes.len() {
                break;
            }
            keep.push(k);
        }
        let wanted: Vec<Keysym> = keep.iter().copied().filter(|&k| !on_spare(k)).collect();
        if wanted.is_empty() {
            return Ok(true);
        }
        if self.codes.is_empty() {
            return Err(XError::Failed(
                "the keyboard has no spare keycode to put the characters it lacks on".to_owned(),
            ));
        }
        let mut free: Vec<usize> = (0..self.codes.len())
            .filter(|&i| self.codes.get(i).is_some_and(|s| !keep.contains(&s.keysym)))
            .collect();
        free.sort_by_key(|&i| self.codes.get(i).map(|s| (s.keysym != 0, s.pressed)));
        let per_keycode = keyboard.per_keycode;
        for (&keysym, &at) in wanted.iter().zip(&free) {
            let Some(spare) = self.codes.get_mut(at) else {
                continue;
            };
            if let Some(pressed) = spare.pressed {
                let ready = pressed + REUSE_AFTER;
                if ready > until {
                    return Ok(false);
                }
                let now = Instant::now();
                if ready > now {
                    std::thread::sleep(ready - now);
                }
            }
            let mut syms = vec![0; per_keycode];
            if let Some(s) = syms.get_mut(0..2.min(per_keycode)) {
                s.fill(keysym);
            }
            session.conn.change_keyboard_mapping(
                1,
                spare.code,
                u8::try_from(per_keycode).unwrap_or(1),
                &syms,
            )?;
            keyboard.set(spare.code, keysym);
            spare.keysym = keysym;
            spare.pressed = None;
        }
        session.finish()?;
        std::thread::sleep(SETTLE);
        Ok(true)
    }

    /// Notes that `code` was pressed now.
    fn pressed(&mut self, code: u8) {
        let now = Instant::now();
        if let Some(spare) = self.codes.iter_mut().find(|s| s.code == code) {
            spare.pressed = Some(now);
        }
        self.last_press = Some(now);
    }

    /// How long since a key was typed with a spare keycode; zero while one
    /// holds a keysym that was never pressed (being typed now).
    fn idle_for(&self) -> Duration {
        if !self.codes.iter().any(|s| s.keysym != 0) {
            return Duration::ZERO;
        }
        self.last_press.map_or(Duration::MAX, |at| at.elapsed())
    }

    /// Puts every spare keycode back to no keysym.
    fn give_back(&mut self, session: &Session) -> Result<(), XError> {
        let per_keycode = session
            .conn
            .get_keyboard_mapping(session.conn.setup().min_keycode, 1)?
            .reply()?
            .keysyms_per_keycode;
        let none = vec![0; usize::from(per_keycode).max(1)];
        for spare in &mut self.codes {
            if spare.keysym != 0 {
                session
                    .conn
                    .change_keyboard_mapping(1, spare.code, per_keycode.max(1), &none)?;
                spare.keysym = 0;
                spare.pressed = None;
            }
        }
        session.finish()
    }
}

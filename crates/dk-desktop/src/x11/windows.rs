//! The windows of the display as the device reads them: what a blackout
//! covers ([`Blacked`], the window tree walked from the root), where keys
//! would go ([`KeysGo`]) and which window is at a point.

use std::collections::HashMap;
use std::time::Instant;

use x11rb::errors::{ConnectionError, ReplyError};
use x11rb::protocol::xproto::{
    AtomEnum, ConnectionExt as _, GetPropertyReply, InputFocus, MapState, Window,
};
use x11rb::rust_connection::RustConnection;

use super::link::XError;
use super::session::{Session, too_long};
use crate::config::{Blackout, WindowNames};

/// Most windows the blackout walk visits; a tree larger than this is
/// treated as all blacked out rather than half read.
const MAX_WINDOWS: usize = 20_000;
/// Bytes of a window property read (class and titles), in 4-byte units: a
/// longer one is not read, and matches every pattern.
const PROPERTY_LONGS: u32 = 1024;

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
    pub(super) read_at: Instant,
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

impl Session {
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
}

/// What a text property holds.
enum Text {
    Absent,
    Read(String),
    Unread,
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

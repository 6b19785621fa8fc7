//! One connection to an X display, on x11rb's pure-Rust connection: the
//! screen's size, its pixels (GetImage, ZPixmap), the windows to black out
//! (the window tree walked from the root), the pointer, the input focus,
//! and input through XTest.

use std::collections::HashMap;
use std::time::Duration;

use x11rb::connection::{Connection as _, RequestConnection as _};
use x11rb::errors::{ConnectionError, ReplyError};
use x11rb::protocol::xproto::{
    AtomEnum, BUTTON_PRESS_EVENT, ConnectionExt as _, ImageFormat, ImageOrder, KEY_PRESS_EVENT,
    MOTION_NOTIFY_EVENT, MapState, VisualClass, Window,
};
use x11rb::protocol::xtest::{self, ConnectionExt as _};
use x11rb::rust_connection::RustConnection;

use crate::config::Blackout;
use crate::image::{PixelFormat, Rgb};
use crate::keys::{Combo, Keysym, sym};

/// Most windows the blackout walk visits; a tree larger than this is
/// treated as all blacked out rather than half read.
const MAX_WINDOWS: usize = 20_000;
/// Bytes of a window property read (class and titles).
const PROPERTY_LONGS: u32 = 256;
/// How long a keycode remapped for typing is left alone before it is
/// changed again: clients re-read the mapping when told it changed.
pub const REMAP_PAUSE: Duration = Duration::from_millis(40);
/// About how many bytes of the server's image one GetImage reads.
const STRIP_BYTES: usize = 1 << 20;
/// Motions between the press and the release of a drag.
const DRAG_STEPS: i32 = 8;
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
#[derive(Debug, Clone, Default)]
pub struct Blacked {
    /// Every rectangle filled with black.
    pub rects: Vec<Rect>,
    matched: Vec<Window>,
    parents: HashMap<Window, Window>,
}

impl Blacked {
    /// True when the screen pixel is in a blacked-out rectangle.
    pub fn covers(&self, x: i64, y: i64) -> bool {
        self.rects.iter().any(|r| r.contains(x, y))
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

    /// True when `window` is a matched window, inside one, or a window
    /// (other than the root) holding one, as a window manager's frame
    /// holds its client.
    fn holds(&self, window: Window, root: Window) -> bool {
        if window == root || window == x11rb::NONE {
            return false;
        }
        let up = |mut w: Window| {
            let mut chain = vec![w];
            while let Some(&p) = self.parents.get(&w) {
                if p == root || chain.len() > MAX_WINDOWS {
                    break;
                }
                chain.push(p);
                w = p;
            }
            chain
        };
        let above = up(window);
        self.matched
            .iter()
            .any(|m| above.contains(m) || up(*m).contains(&window))
    }
}

/// One connection to a display.
pub struct Session {
    conn: RustConnection,
    root: Window,
    screen: usize,
    net_wm_name: u32,
    utf8_string: u32,
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
        let (net_wm_name, utf8_string) = (net_wm_name.reply()?.atom, utf8_string.reply()?.atom);
        Ok(Session {
            conn,
            root,
            screen,
            net_wm_name,
            utf8_string,
        })
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
    pub fn capture(&self, x: u32, y: u32, width: u32, height: u32) -> Result<Rgb, XError> {
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
    pub fn blacked(&self, blackout: &Blackout) -> Result<Blacked, XError> {
        let mut blacked = Blacked {
            rects: blackout
                .regions()
                .iter()
                .map(|r| Rect {
                    x: i64::from(r.x),
                    y: i64::from(r.y),
                    width: i64::from(r.width),
                    height: i64::from(r.height),
                })
                .collect(),
            ..Blacked::default()
        };
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
                    Ok(Some((rect, class, titles))) => {
                        outer.insert(window, rect);
                        if blackout.matches_window(&class, &titles) {
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

    /// A window's outer rectangle on the screen, its class names and its
    /// titles; `None` when it went away meanwhile.
    #[expect(
        clippy::type_complexity,
        reason = "a private step of one walk, named by its use"
    )]
    fn read_probe(
        &self,
        probe: Probe<'_>,
    ) -> Result<Option<(Rect, Vec<String>, Vec<String>)>, XError> {
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
        let text = |cookie: x11rb::cookie::Cookie<
            '_,
            RustConnection,
            x11rb::protocol::xproto::GetPropertyReply,
        >|
         -> Result<Option<(u32, Vec<u8>)>, XError> {
            match cookie.reply() {
                Ok(p) if p.format == 8 && !p.value.is_empty() => Ok(Some((p.type_, p.value))),
                Ok(_) => Ok(None),
                Err(e) if gone(&e) => Ok(None),
                Err(e) => Err(e.into()),
            }
        };
        let class = text(probe.class)?
            .map(|(_, v)| {
                v.split(|&b| b == 0)
                    .filter(|s| !s.is_empty())
                    .map(latin1)
                    .collect()
            })
            .unwrap_or_default();
        let mut titles = Vec::new();
        for (ty, value) in [text(probe.name)?, text(probe.net_name)?]
            .into_iter()
            .flatten()
        {
            titles.push(
                if ty == self.utf8_string || ty != u32::from(AtomEnum::STRING) {
                    String::from_utf8_lossy(&value).into_owned()
                } else {
                    latin1(&value)
                },
            );
        }
        Ok(Some((rect, class, titles)))
    }

    /// True when the keyboard's input focus is in a blacked-out window
    /// (or, when the focus follows the pointer, the pointer is in a
    /// blacked-out area).
    pub fn focus_blacked(&self, blacked: &Blacked) -> Result<bool, XError> {
        let focus = self.conn.get_input_focus()?.reply()?.focus;
        if focus == u32::from(x11rb::protocol::xproto::InputFocus::POINTER_ROOT) {
            let (x, y) = self.pointer()?;
            return Ok(blacked.covers(x, y));
        }
        if blacked.holds(focus, self.root) {
            return Ok(true);
        }
        // A focus window the walk did not see (inside a matched window, or
        // unviewable): walk up from it.
        let mut window = focus;
        for _ in 0..64 {
            if window == self.root || window == x11rb::NONE {
                return Ok(false);
            }
            if blacked.matched.contains(&window) {
                return Ok(true);
            }
            window = match self.conn.query_tree(window)?.reply() {
                Ok(tree) => tree.parent,
                Err(ReplyError::X11Error(_)) => return Ok(false),
                Err(e) => return Err(e.into()),
            };
        }
        Ok(false)
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

    /// Presses the left button at `from`, moves in steps to `to`, releases.
    pub fn drag(&self, from: (i64, i64), to: (i64, i64)) -> Result<(), XError> {
        self.holding(|held| {
            self.fake(MOTION_NOTIFY_EVENT, 0, from.0, from.1)?;
            self.press_button(held, 1)?;
            self.finish()?;
            for step in 1..=DRAG_STEPS {
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
            self.release_button(held, 1)
        })
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
    /// all released in reverse. Keys the keyboard lacks are put on spare
    /// keycodes for the while.
    pub fn press_combos(&self, combos: &[Combo]) -> Result<(), XError> {
        let mut typist = Typist::new(&self.conn)?;
        let result = self.holding(|held| {
            for combo in combos {
                let mut pressed = Vec::new();
                for &m in &combo.modifiers {
                    let (code, _) = typist.keyboard.find(m).ok_or_else(|| no_key(m))?;
                    self.press_key(held, code)?;
                    pressed.push(code);
                }
                let (code, level) = typist.keycode(self, combo.key)?;
                let shift = if level == 1 && !combo.modifiers.contains(&sym::SHIFT) {
                    Some(
                        typist
                            .keyboard
                            .find(sym::SHIFT)
                            .ok_or_else(|| no_key(sym::SHIFT))?
                            .0,
                    )
                } else {
                    None
                };
                if let Some(shift) = shift {
                    self.press_key(held, shift)?;
                    pressed.push(shift);
                }
                self.press_key(held, code)?;
                self.release_key(held, code)?;
                for code in pressed.into_iter().rev() {
                    self.release_key(held, code)?;
                }
                typist.pressed(code);
            }
            Ok(())
        });
        let restored = typist.restore(self);
        result.and(restored)
    }
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

    /// Keycodes with no keysym at all.
    fn spares(&self) -> Vec<u8> {
        self.codes()
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

/// Types keysyms the keyboard lacks on spare keycodes, each changed only
/// after the server (and, after a pause, its clients) saw the last use,
/// and every spare put back to no keysym at the end.
struct Typist {
    keyboard: Keyboard,
    spares: Vec<u8>,
    next: usize,
    /// Spare keycodes changed, and whether each was pressed since.
    changed: Vec<(u8, bool)>,
}

impl Typist {
    fn new(conn: &RustConnection) -> Result<Self, XError> {
        let keyboard = Keyboard::read(conn)?;
        let spares = keyboard.spares();
        Ok(Typist {
            keyboard,
            spares,
            next: 0,
            changed: Vec::new(),
        })
    }

    fn keycode(&mut self, session: &Session, keysym: Keysym) -> Result<(u8, u8), XError> {
        if let Some(found) = self.keyboard.find(keysym) {
            return Ok(found);
        }
        if self.spares.is_empty() {
            return Err(XError::Failed(format!(
                "the keyboard has no key for keysym 0x{keysym:x} and no spare keycode to put it on"
            )));
        }
        let code = self
            .spares
            .get(self.next % self.spares.len())
            .copied()
            .unwrap_or(0);
        self.next += 1;
        if let Some(entry) = self.changed.iter_mut().find(|(c, _)| *c == code) {
            if entry.1 {
                // Used since it was last changed: let the server and the
                // clients catch up before it means something else.
                session.finish()?;
                std::thread::sleep(REMAP_PAUSE);
            }
            entry.1 = false;
        } else {
            self.changed.push((code, false));
        }
        let mut syms = vec![0; self.keyboard.per_keycode];
        if let Some(s) = syms.get_mut(0..2.min(self.keyboard.per_keycode)) {
            s.fill(keysym);
        }
        session.conn.change_keyboard_mapping(
            1,
            code,
            u8::try_from(self.keyboard.per_keycode).unwrap_or(1),
            &syms,
        )?;
        self.keyboard.set(code, keysym);
        Ok((code, 0))
    }

    fn pressed(&mut self, code: u8) {
        if let Some(entry) = self.changed.iter_mut().find(|(c, _)| *c == code) {
            entry.1 = true;
        }
    }

    /// Puts every changed spare keycode back to no keysym, once clients had
    /// time to read the keys typed with them.
    fn restore(&mut self, session: &Session) -> Result<(), XError> {
        if self.changed.is_empty() {
            return Ok(());
        }
        session.finish()?;
        std::thread::sleep(REMAP_PAUSE);
        let none = vec![0; self.keyboard.per_keycode];
        for (code, _) in self.changed.drain(..) {
            session.conn.change_keyboard_mapping(
                1,
                code,
                u8::try_from(self.keyboard.per_keycode).unwrap_or(1),
                &none,
            )?;
        }
        session.finish()
    }
}

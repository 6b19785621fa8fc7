//! A window for a test to drive: mapped where it is told, painted in
//! known colours, recording every button and key press it receives.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use x11rb::connection::Connection;
use x11rb::protocol::Event;
use x11rb::protocol::xproto::{
    AtomEnum, ClientMessageEvent, ConnectionExt as _, CreateWindowAux, EventMask, InputFocus,
    PropMode, WindowClass,
};
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

use super::keys::{Keymap, is_modifier_key, name_of, text_of};
use super::pixels::{Rect, Rgb, X11Error, colour_masks, fail, pixel_value, value_of};
use crate::PATIENCE;

/// What a [`TestWindow`] looks like: where it is, its class and title,
/// its background and a "button" drawn in another colour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowSpec {
    /// Its position and size on the screen.
    pub frame: Rect,
    /// Its WM_CLASS instance name.
    pub instance: String,
    /// Its WM_CLASS class name.
    pub class: String,
    /// Its title (WM_NAME and _NET_WM_NAME).
    pub title: String,
    /// The colour of all of it but the button.
    pub background: Rgb,
    /// The button: where it is inside the window, and its colour.
    pub button: Option<(Rect, Rgb)>,
}

impl WindowSpec {
    /// A window titled `title` at `frame`, of class `test-window` /
    /// `TestWindow`, white, without a button.
    #[must_use]
    pub fn new(title: &str, frame: Rect) -> WindowSpec {
        WindowSpec {
            frame,
            instance: "test-window".to_owned(),
            class: "TestWindow".to_owned(),
            title: title.to_owned(),
            background: Rgb(255, 255, 255),
            button: None,
        }
    }

    /// The same with WM_CLASS `instance` / `class`.
    #[must_use]
    pub fn class(mut self, instance: &str, class: &str) -> WindowSpec {
        instance.clone_into(&mut self.instance);
        class.clone_into(&mut self.class);
        self
    }

    /// The same with its background in `colour`.
    #[must_use]
    pub fn background(mut self, colour: Rgb) -> WindowSpec {
        self.background = colour;
        self
    }

    /// The same with a button at `at` (inside the window) in `colour`.
    #[must_use]
    pub fn button(mut self, at: Rect, colour: Rgb) -> WindowSpec {
        self.button = Some((at, colour));
        self
    }

    /// The button's rectangle on the screen, if it has one.
    #[must_use]
    pub fn button_on_screen(&self) -> Option<Rect> {
        self.button.map(|(at, _)| Rect {
            x: self.frame.x.saturating_add(at.x),
            y: self.frame.y.saturating_add(at.y),
            ..at
        })
    }

    /// The colour it paints at screen pixel (`x`, `y`), if that pixel is
    /// inside it.
    #[must_use]
    pub fn colour_at(&self, x: i32, y: i32) -> Option<Rgb> {
        if !self.frame.contains(x, y) {
            return None;
        }
        match (self.button_on_screen(), self.button) {
            (Some(button), Some((_, colour))) if button.contains(x, y) => Some(colour),
            _ => Some(self.background),
        }
    }
}

/// A button press or release the window received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Click {
    /// The button: 1 left, 2 middle, 3 right, 4 to 7 the wheel.
    pub button: u8,
    /// Where, in the window's coordinates.
    pub x: i16,
    /// Where, in the window's coordinates.
    pub y: i16,
    /// Where, on the screen.
    pub root_x: i16,
    /// Where, on the screen.
    pub root_y: i16,
    /// Whether it was on the button.
    pub on_button: bool,
    /// The modifier state (Shift 0x1, Control 0x4, Mod1 0x8, ...).
    pub state: u16,
    /// When the window's event loop received it.
    pub at: Instant,
}

/// A key press the window received, modifier keys left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPress {
    /// The keysym it means under the keyboard mapping of the moment.
    pub keysym: u32,
    /// The keysym's name as xdotool spells it (`s`, `Return`, `U+2713`).
    pub name: String,
    /// The modifiers that make it a combination (`ctrl`, `alt`,
    /// `super`, then `shift` with one of them), in that order.
    pub modifiers: Vec<&'static str>,
    /// The text it typed: none for a combination or a key that types
    /// nothing.
    pub text: Option<char>,
    /// When the window's event loop received it.
    pub at: Instant,
}

impl KeyPress {
    /// The press as xdotool writes it: `ctrl+s`, `Return`, `alt+shift+Tab`.
    #[must_use]
    pub fn combo(&self) -> String {
        let mut parts: Vec<&str> = self.modifiers.clone();
        parts.push(&self.name);
        parts.join("+")
    }
}

/// What the window received so far.
#[derive(Debug, Default)]
struct Recorded {
    presses: Vec<Click>,
    releases: Vec<Click>,
    keys: Vec<KeyPress>,
    text: String,
    /// The last sync message the event loop reached.
    synced: u32,
    /// Why the event loop ended, once it did.
    ended: Option<String>,
}

/// What the event loop and the test share.
#[derive(Debug, Default)]
struct Shared {
    recorded: Mutex<Recorded>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Recorded> {
        self.recorded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `check` gives a value, failing the test after
    /// [`PATIENCE`] naming `what`.
    fn wait<T>(&self, what: &str, mut check: impl FnMut(&Recorded) -> Option<T>) -> T {
        let deadline = Instant::now() + PATIENCE;
        let mut recorded = self.lock();
        loop {
            if let Some(value) = check(&recorded) {
                return value;
            }
            let now = Instant::now();
            if now >= deadline {
                fail(&format!(
                    "timed out waiting for {what}; the window has {:?}",
                    *recorded
                ));
            }
            if let Some(why) = &recorded.ended {
                fail(&format!(
                    "the window's event loop ended ({why}) while waiting for {what}"
                ));
            }
            recorded = self
                .changed
                .wait_timeout(recorded, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// A top-level window on an X display, with its own connection and an
/// event loop on its own thread recording what it receives: button
/// presses and releases with their window and screen coordinates, key
/// presses with the text they type (through the keyboard mapping, read
/// again whenever it changes).
///
/// Without a window manager it sits exactly where its [`WindowSpec`]
/// says. Dropped, it is destroyed and its thread ends.
///
/// Like every X client, it reads a changed keyboard mapping only once the
/// server tells it of the change: a sender that maps a character on a
/// spare keycode must give clients a moment to read the new mapping
/// before pressing that key, and keep it until they had the press.
#[derive(Debug)]
pub struct TestWindow {
    connection: Arc<RustConnection>,
    screen: usize,
    window: u32,
    sync_atom: u32,
    spec: WindowSpec,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The last sync message sent.
    sync_sent: Mutex<u32>,
}

impl TestWindow {
    /// Maps a window as `spec` says on `display` (such as `:3`) and waits
    /// until it is on the screen, painted.
    ///
    /// # Errors
    ///
    /// When the display cannot be reached or refuses a request.
    pub fn open(display: &str, spec: WindowSpec) -> Result<TestWindow, X11Error> {
        let (connection, screen) = RustConnection::connect(Some(display))?;
        let connection = Arc::new(connection);
        let window = create_window(&connection, display, screen, &spec)?;
        name_window(&connection, window, &spec)?;
        let sync_atom = intern(&connection, b"DK_TESTKIT_SYNC")?;
        let button_window = match spec.button {
            Some((at, colour)) => Some(create_button(&connection, screen, window, at, colour)?),
            None => None,
        };
        let keymap = read_keymap(&connection)?;
        map_and_wait(&connection, window)?;
        let shared = Arc::new(Shared::default());
        let thread = start_event_loop(
            &connection,
            &shared,
            window,
            button_window,
            sync_atom,
            keymap,
        );
        Ok(TestWindow {
            connection,
            screen,
            window,
            sync_atom,
            spec,
            shared,
            thread: Some(thread),
            sync_sent: Mutex::new(0),
        })
    }

    /// Its window id.
    #[must_use]
    pub fn id(&self) -> u32 {
        self.window
    }

    /// What it looks like.
    #[must_use]
    pub fn spec(&self) -> &WindowSpec {
        &self.spec
    }

    /// Gives it the input focus: key presses come to it wherever the
    /// pointer is.
    ///
    /// # Errors
    ///
    /// When the display cannot be reached.
    pub fn focus(&self) -> Result<(), X11Error> {
        self.connection
            .set_input_focus(InputFocus::PARENT, self.window, x11rb::CURRENT_TIME)?;
        self.connection.get_input_focus()?.reply()?;
        Ok(())
    }

    /// Raises it above every other window.
    ///
    /// # Errors
    ///
    /// When the display cannot be reached.
    pub fn raise(&self) -> Result<(), X11Error> {
        use x11rb::protocol::xproto::{ConfigureWindowAux, StackMode};
        self.connection.configure_window(
            self.window,
            &ConfigureWindowAux::new().stack_mode(StackMode::ABOVE),
        )?;
        self.connection.get_input_focus()?.reply()?;
        Ok(())
    }

    /// Paints `pixels` (row by row, `area.width` to a row) at `area`, in
    /// the window's coordinates: a picture busier than its flat colours.
    /// The window keeps no copy: what covers it and goes away erases it.
    ///
    /// # Errors
    ///
    /// When `pixels` does not fill `area`, the display stores pixels in
    /// another way than 32 bits in its byte order, or cannot be reached.
    pub fn paint(&self, area: Rect, pixels: &[Rgb]) -> Result<(), X11Error> {
        use x11rb::protocol::xproto::{CreateGCAux, ImageFormat, ImageOrder};
        let width = usize::from(area.width);
        if width == 0 || pixels.len() != width * usize::from(area.height) {
            return Err(X11Error(format!(
                "{} pixels do not fill {}x{}",
                pixels.len(),
                area.width,
                area.height
            )));
        }
        let setup = self.connection.setup();
        let depth = setup
            .roots
            .get(self.screen)
            .map(|screen| screen.root_depth)
            .unwrap_or_default();
        let format = setup
            .pixmap_formats
            .iter()
            .find(|format| format.depth == depth);
        if format.is_none_or(|format| format.bits_per_pixel != 32) {
            return Err(X11Error(format!(
                "a display of depth {depth} is not painted"
            )));
        }
        let little = setup.image_byte_order == ImageOrder::LSB_FIRST;
        let masks = colour_masks(&self.connection, self.screen)?;
        let gc = self.connection.generate_id()?;
        self.connection
            .create_gc(gc, self.window, &CreateGCAux::new())?;
        // Pieces well under the core protocol's request size.
        let rows = (200_000 / (width * 4)).max(1);
        for (index, chunk) in pixels.chunks(rows * width).enumerate() {
            let mut data = Vec::with_capacity(chunk.len() * 4);
            for colour in chunk {
                let value = value_of(*colour, masks);
                if little {
                    data.extend_from_slice(&value.to_le_bytes());
                } else {
                    data.extend_from_slice(&value.to_be_bytes());
                }
            }
            let top = i16::try_from(index * rows)
                .ok()
                .and_then(|offset| area.y.checked_add(offset))
                .ok_or_else(|| X11Error("the area is too tall".to_owned()))?;
            let height = u16::try_from(chunk.len() / width)
                .map_err(|_| X11Error("the area is too tall".to_owned()))?;
            self.connection.put_image(
                ImageFormat::Z_PIXMAP,
                self.window,
                gc,
                area.width,
                height,
                area.x,
                top,
                0,
                depth,
                &data,
            )?;
        }
        self.connection.free_gc(gc)?;
        self.connection.get_input_focus()?.reply()?;
        Ok(())
    }

    /// Returns once every event the server sent it before now has been
    /// recorded: after this, what it did not record it was never sent.
    ///
    /// # Panics
    ///
    /// When the display cannot be reached or the event loop ended.
    pub fn sync(&self) {
        let serial = {
            let mut sent = self
                .sync_sent
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *sent += 1;
            *sent
        };
        let message =
            ClientMessageEvent::new(32, self.window, self.sync_atom, [serial, 0, 0, 0, 0]);
        let sent = self
            .connection
            .send_event(false, self.window, EventMask::NO_EVENT, message)
            .map_err(X11Error::from)
            .and_then(|_| self.connection.flush().map_err(X11Error::from));
        if let Err(e) = sent {
            fail(&format!("cannot reach the test window's display: {e}"));
        }
        self.shared.wait("the test window's sync", |r| {
            (r.synced >= serial).then_some(())
        });
    }

    /// The button presses received so far.
    #[must_use]
    pub fn clicks(&self) -> Vec<Click> {
        self.shared.lock().presses.clone()
    }

    /// The button releases received so far.
    #[must_use]
    pub fn releases(&self) -> Vec<Click> {
        self.shared.lock().releases.clone()
    }

    /// The key presses received so far.
    #[must_use]
    pub fn keys(&self) -> Vec<KeyPress> {
        self.shared.lock().keys.clone()
    }

    /// The text its key presses typed so far.
    #[must_use]
    pub fn text(&self) -> String {
        self.shared.lock().text.clone()
    }

    /// Whether it received no button or key press at all (call
    /// [`TestWindow::sync`] first).
    #[must_use]
    pub fn received_nothing(&self) -> bool {
        let recorded = self.shared.lock();
        recorded.presses.is_empty() && recorded.releases.is_empty() && recorded.keys.is_empty()
    }

    /// Forgets what it received so far.
    pub fn clear(&self) {
        let mut recorded = self.shared.lock();
        recorded.presses.clear();
        recorded.releases.clear();
        recorded.keys.clear();
        recorded.text.clear();
    }

    /// Waits until it has received `count` button presses; returns them.
    ///
    /// # Panics
    ///
    /// When they do not come within [`PATIENCE`].
    #[must_use]
    pub fn wait_for_clicks(&self, count: usize) -> Vec<Click> {
        self.shared.wait(&format!("{count} clicks"), |r| {
            (r.presses.len() >= count).then(|| r.presses.clone())
        })
    }

    /// Waits until it has received `count` button releases; returns them.
    ///
    /// # Panics
    ///
    /// When they do not come within [`PATIENCE`].
    #[must_use]
    pub fn wait_for_releases(&self, count: usize) -> Vec<Click> {
        self.shared.wait(&format!("{count} button releases"), |r| {
            (r.releases.len() >= count).then(|| r.releases.clone())
        })
    }

    /// Waits until it has received `count` key presses; returns them.
    ///
    /// # Panics
    ///
    /// When they do not come within [`PATIENCE`].
    #[must_use]
    pub fn wait_for_keys(&self, count: usize) -> Vec<KeyPress> {
        self.shared.wait(&format!("{count} key presses"), |r| {
            (r.keys.len() >= count).then(|| r.keys.clone())
        })
    }

    /// Waits until the text typed has at least as many characters as
    /// `expected`; returns it (which may differ from `expected`).
    ///
    /// # Panics
    ///
    /// When it does not come within [`PATIENCE`].
    #[must_use]
    pub fn wait_for_text(&self, expected: &str) -> String {
        let count = expected.chars().count();
        self.shared.wait(&format!("the text {expected:?}"), |r| {
            (r.text.chars().count() >= count).then(|| r.text.clone())
        })
    }
}

impl Drop for TestWindow {
    fn drop(&mut self) {
        // Its destruction ends the event loop; a display gone has ended it.
        let _ = self.connection.destroy_window(self.window);
        let _ = self.connection.flush();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Creates the top-level window `spec` describes on `screen` of `display`
/// (not mapped yet), listening for presses and its own mapping.
fn create_window(
    connection: &RustConnection,
    display: &str,
    screen: usize,
    spec: &WindowSpec,
) -> Result<u32, X11Error> {
    let root = connection
        .setup()
        .roots
        .get(screen)
        .ok_or_else(|| X11Error(format!("display {display} has no screen {screen}")))?
        .root;
    let background = pixel_value(connection, screen, spec.background)?;
    let window = connection.generate_id()?;
    let frame = spec.frame;
    connection.create_window(
        x11rb::COPY_DEPTH_FROM_PARENT,
        window,
        root,
        frame.x,
        frame.y,
        frame.width,
        frame.height,
        0,
        WindowClass::INPUT_OUTPUT,
        x11rb::COPY_FROM_PARENT,
        &CreateWindowAux::new()
            .background_pixel(background)
            .event_mask(
                EventMask::BUTTON_PRESS
                    | EventMask::BUTTON_RELEASE
                    | EventMask::KEY_PRESS
                    | EventMask::STRUCTURE_NOTIFY,
            ),
    )?;
    Ok(window)
}

/// Gives `window` the WM_CLASS and title of `spec`.
fn name_window(
    connection: &RustConnection,
    window: u32,
    spec: &WindowSpec,
) -> Result<(), X11Error> {
    let mut class = Vec::new();
    class.extend_from_slice(spec.instance.as_bytes());
    class.push(0);
    class.extend_from_slice(spec.class.as_bytes());
    class.push(0);
    connection.change_property8(
        PropMode::REPLACE,
        window,
        AtomEnum::WM_CLASS,
        AtomEnum::STRING,
        &class,
    )?;
    // WM_NAME is Latin-1 text; _NET_WM_NAME is UTF-8.
    let latin1: Vec<u8> = spec
        .title
        .chars()
        .map(|c| u8::try_from(u32::from(c)).unwrap_or(b'?'))
        .collect();
    connection.change_property8(
        PropMode::REPLACE,
        window,
        AtomEnum::WM_NAME,
        AtomEnum::STRING,
        &latin1,
    )?;
    let net_wm_name = intern(connection, b"_NET_WM_NAME")?;
    let utf8 = intern(connection, b"UTF8_STRING")?;
    connection.change_property8(
        PropMode::REPLACE,
        window,
        net_wm_name,
        utf8,
        spec.title.as_bytes(),
    )?;
    Ok(())
}

/// The atom named `name`, made if the server has none yet.
fn intern(connection: &RustConnection, name: &[u8]) -> Result<u32, X11Error> {
    Ok(connection.intern_atom(false, name)?.reply()?.atom)
}

/// Creates and maps the button: a child of `window` at `at` in `colour`.
fn create_button(
    connection: &RustConnection,
    screen: usize,
    window: u32,
    at: Rect,
    colour: Rgb,
) -> Result<u32, X11Error> {
    let child = connection.generate_id()?;
    let pixel = pixel_value(connection, screen, colour)?;
    // No events of its own: its presses go up to the window, which
    // sees them as on this child.
    connection.create_window(
        x11rb::COPY_DEPTH_FROM_PARENT,
        child,
        window,
        at.x,
        at.y,
        at.width,
        at.height,
        0,
        WindowClass::INPUT_OUTPUT,
        x11rb::COPY_FROM_PARENT,
        &CreateWindowAux::new().background_pixel(pixel),
    )?;
    connection.map_window(child)?;
    Ok(child)
}

/// Maps `window` and waits until the server says it is mapped and painted.
fn map_and_wait(connection: &RustConnection, window: u32) -> Result<(), X11Error> {
    connection.map_window(window)?;
    connection.flush()?;
    loop {
        if let Event::MapNotify(mapped) = connection.wait_for_event()?
            && mapped.window == window
        {
            break;
        }
    }
    connection.get_input_focus()?.reply()?;
    Ok(())
}

/// Runs [`event_loop`] on a thread of its own, recording into `shared`
/// until it ends, and then why.
fn start_event_loop(
    connection: &Arc<RustConnection>,
    shared: &Arc<Shared>,
    window: u32,
    button_window: Option<u32>,
    sync_atom: u32,
    keymap: Keymap,
) -> JoinHandle<()> {
    let connection = Arc::clone(connection);
    let shared = Arc::clone(shared);
    std::thread::spawn(move || {
        let ended = event_loop(
            &connection,
            window,
            button_window,
            sync_atom,
            keymap,
            &shared,
        );
        shared.lock().ended = Some(ended);
        shared.changed.notify_all();
    })
}

/// Reads the keyboard mapping and which modifiers pick the second group
/// and the third level.
fn read_keymap(connection: &RustConnection) -> Result<Keymap, X11Error> {
    let setup = connection.setup();
    let (min, max) = (setup.min_keycode, setup.max_keycode);
    let count = max.saturating_sub(min).saturating_add(1);
    let mapping = connection.get_keyboard_mapping(min, count)?.reply()?;
    let mut keymap = Keymap {
        min_keycode: min,
        per_keycode: mapping.keysyms_per_keycode,
        keysyms: mapping.keysyms,
        ..Keymap::default()
    };
    let modifiers = connection.get_modifier_mapping()?.reply()?;
    let per_modifier = modifiers.keycodes.len() / 8;
    keymap.read_modifiers(per_modifier, &modifiers.keycodes);
    Ok(keymap)
}

/// Records what `window` receives until it is destroyed or the display
/// goes; returns why it ended.
fn event_loop(
    connection: &RustConnection,
    window: u32,
    button: Option<u32>,
    sync_atom: u32,
    mut keymap: Keymap,
    shared: &Shared,
) -> String {
    loop {
        let event = match connection.wait_for_event() {
            Ok(event) => event,
            Err(e) => return format!("the display went away: {e}"),
        };
        let at = Instant::now();
        match event {
            Event::ButtonPress(press) | Event::ButtonRelease(press) => {
                let click = Click {
                    button: press.detail,
                    x: press.event_x,
                    y: press.event_y,
                    root_x: press.root_x,
                    root_y: press.root_y,
                    on_button: button.is_some_and(|b| press.child == b),
                    state: u16::from(press.state),
                    at,
                };
                let mut recorded = shared.lock();
                if press.response_type & 0x7f == x11rb::protocol::xproto::BUTTON_PRESS_EVENT {
                    recorded.presses.push(click);
                } else {
                    recorded.releases.push(click);
                }
            }
            Event::KeyPress(press) => {
                let state = u16::from(press.state);
                let keysym = keymap.keysym(press.detail, state);
                if keysym == 0
                    || is_modifier_key(keysym)
                    || is_modifier_key(keymap.base(press.detail))
                {
                    continue;
                }
                let modifiers = keymap.combo_modifiers(state);
                let text = if modifiers.is_empty() {
                    text_of(keysym)
                } else {
                    None
                };
                let mut recorded = shared.lock();
                if let Some(c) = text {
                    recorded.text.push(c);
                }
                recorded.keys.push(KeyPress {
                    keysym,
                    name: name_of(keysym),
                    modifiers,
                    text,
                    at,
                });
            }
            Event::MappingNotify(_) => match read_keymap(connection) {
                Ok(read) => keymap = read,
                Err(e) => return format!("cannot read the keyboard mapping: {e}"),
            },
            Event::ClientMessage(message) if message.type_ == sync_atom => {
                let [serial, ..] = message.data.as_data32();
                shared.lock().synced = serial;
            }
            Event::DestroyNotify(destroyed) if destroyed.window == window => {
                return "the window was destroyed".to_owned();
            }
            _ => continue,
        }
        shared.changed.notify_all();
    }
}

//! [`Session`], one connection to a display: connecting (XTest checked),
//! the server grabbed around what must not change, the screen's size and
//! its pixels.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use x11rb::connection::{Connection as _, RequestConnection as _};
use x11rb::protocol::xproto::{ConnectionExt as _, ImageFormat, ImageOrder, VisualClass, Window};
use x11rb::protocol::xtest;
use x11rb::rust_connection::RustConnection;

use super::keyboard::Spares;
use super::link::{XError, drain};
use crate::image::{PixelFormat, Rgb};

/// Longest a screenshot or a zoom holds the display grabbed while it
/// reads the window tree and the pixels; past it, it gives up.
pub const GRAB_LIMIT: Duration = Duration::from_secs(1);
/// About how many bytes of the server's image one GetImage reads.
const STRIP_BYTES: usize = 1 << 20;

/// One connection to a display.
pub struct Session {
    pub(super) conn: RustConnection,
    pub(super) root: Window,
    pub(super) screen: usize,
    pub(super) net_wm_name: u32,
    pub(super) utf8_string: u32,
    pub(super) compound_text: u32,
    /// Spare keycodes the device put characters on, kept between calls.
    pub(super) spares: RefCell<Spares>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
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
        drain(&self.conn)
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
}

/// Why a read under a grab of the server gave up.
pub(super) fn too_long() -> XError {
    XError::Failed(format!(
        "reading the screen held the display for more than {} ms; zoom on a smaller region",
        GRAB_LIMIT.as_millis()
    ))
}

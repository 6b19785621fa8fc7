//! What the rest of the X11 support is written in: colours, rectangles,
//! errors, and the screen's pixels read back.

use x11rb::connection::Connection;
use x11rb::protocol::xproto::{ConnectionExt as _, ImageFormat, ImageOrder};
use x11rb::rust_connection::RustConnection;

/// A colour, 8 bits for each of red, green and blue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    /// Black, as a blacked-out area is.
    pub const BLACK: Rgb = Rgb(0, 0, 0);

    /// Whether each channel is within `tolerance` of `other`'s (a scaled
    /// screenshot blends the pixels at an edge).
    #[must_use]
    pub fn near(self, other: Rgb, tolerance: u8) -> bool {
        self.0.abs_diff(other.0) <= tolerance
            && self.1.abs_diff(other.1) <= tolerance
            && self.2.abs_diff(other.2) <= tolerance
    }
}

/// A rectangle of pixels: its top left corner and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rect {
    /// The left edge.
    pub x: i16,
    /// The top edge.
    pub y: i16,
    /// The width.
    pub width: u16,
    /// The height.
    pub height: u16,
}

impl Rect {
    /// The rectangle at (`x`, `y`) of `width` x `height`.
    #[must_use]
    pub const fn new(x: i16, y: i16, width: u16, height: u16) -> Rect {
        Rect {
            x,
            y,
            width,
            height,
        }
    }

    /// Whether the pixel (`x`, `y`) is inside.
    #[must_use]
    pub fn contains(&self, x: i32, y: i32) -> bool {
        let (left, top) = (i32::from(self.x), i32::from(self.y));
        x >= left
            && y >= top
            && x < left + i32::from(self.width)
            && y < top + i32::from(self.height)
    }

    /// Its centre pixel.
    #[must_use]
    pub fn centre(&self) -> (i32, i32) {
        (
            i32::from(self.x) + i32::from(self.width) / 2,
            i32::from(self.y) + i32::from(self.height) / 2,
        )
    }
}

/// Why something on the X display failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct X11Error(pub String);

impl std::fmt::Display for X11Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for X11Error {}

impl From<x11rb::errors::ConnectError> for X11Error {
    fn from(e: x11rb::errors::ConnectError) -> X11Error {
        X11Error(format!("cannot connect to the display: {e}"))
    }
}

impl From<x11rb::errors::ConnectionError> for X11Error {
    fn from(e: x11rb::errors::ConnectionError) -> X11Error {
        X11Error(format!("the display's connection failed: {e}"))
    }
}

impl From<x11rb::errors::ReplyError> for X11Error {
    fn from(e: x11rb::errors::ReplyError) -> X11Error {
        X11Error(format!("the display refused a request: {e}"))
    }
}

impl From<x11rb::errors::ReplyOrIdError> for X11Error {
    fn from(e: x11rb::errors::ReplyOrIdError) -> X11Error {
        X11Error(format!("the display refused a request: {e}"))
    }
}

/// Fails the test with `message`.
#[expect(
    clippy::panic,
    reason = "test support: a failure here fails the test that asked"
)]
pub(super) fn fail(message: &str) -> ! {
    panic!("{message}")
}

/// The masks of the root visual's red, green and blue.
pub(super) fn colour_masks(
    connection: &RustConnection,
    screen: usize,
) -> Result<[u32; 3], X11Error> {
    let root = connection
        .setup()
        .roots
        .get(screen)
        .ok_or_else(|| X11Error(format!("no screen {screen}")))?;
    root.allowed_depths
        .iter()
        .flat_map(|depth| &depth.visuals)
        .find(|visual| visual.visual_id == root.root_visual)
        .map(|visual| [visual.red_mask, visual.green_mask, visual.blue_mask])
        .ok_or_else(|| X11Error("the root visual is not listed".to_owned()))
}

/// The pixel value of `colour` in the root visual of `screen` (a true
/// colour visual, as Xvfb's at 24 bits is).
pub(super) fn pixel_value(
    connection: &RustConnection,
    screen: usize,
    colour: Rgb,
) -> Result<u32, X11Error> {
    Ok(value_of(colour, colour_masks(connection, screen)?))
}

/// The pixel value of `colour` under `masks`.
pub(super) fn value_of(colour: Rgb, masks: [u32; 3]) -> u32 {
    let channel = |mask: u32, value: u8| -> u32 {
        if mask == 0 {
            return 0;
        }
        let shift = mask.trailing_zeros();
        let width = (mask >> shift).count_ones();
        let scaled = if width >= 8 {
            u32::from(value) << (width - 8)
        } else {
            u32::from(value) >> (8 - width)
        };
        (scaled << shift) & mask
    };
    channel(masks[0], colour.0) | channel(masks[1], colour.1) | channel(masks[2], colour.2)
}

/// The colour of pixel value `pixel` under `masks`.
fn colour_of(pixel: u32, masks: [u32; 3]) -> Rgb {
    let channel = |mask: u32| -> u8 {
        if mask == 0 {
            return 0;
        }
        let shift = mask.trailing_zeros();
        let width = (mask >> shift).count_ones();
        let value = (pixel & mask) >> shift;
        let value = if width >= 8 {
            value >> (width - 8)
        } else {
            value << (8 - width)
        };
        u8::try_from(value).unwrap_or(u8::MAX)
    };
    Rgb(channel(masks[0]), channel(masks[1]), channel(masks[2]))
}

/// The colours of the screen's pixels in `area`, row by row, read from
/// the root window of `display` (GetImage), as the screen shows them.
///
/// # Errors
///
/// When the display cannot be reached, or stores pixels in a way this
/// does not read (anything but 24 or 32 bits per pixel).
pub fn screen_pixels(display: &str, area: Rect) -> Result<Vec<Rgb>, X11Error> {
    let (connection, screen) = RustConnection::connect(Some(display))?;
    let setup = connection.setup();
    let root = setup
        .roots
        .get(screen)
        .ok_or_else(|| X11Error(format!("display {display} has no screen {screen}")))?;
    let image = connection
        .get_image(
            ImageFormat::Z_PIXMAP,
            root.root,
            area.x,
            area.y,
            area.width,
            area.height,
            !0,
        )?
        .reply()?;
    let bits = setup
        .pixmap_formats
        .iter()
        .find(|format| format.depth == image.depth)
        .map(|format| (format.bits_per_pixel, format.scanline_pad))
        .ok_or_else(|| X11Error(format!("no pixmap format of depth {}", image.depth)))?;
    let bytes_per_pixel = match bits.0 {
        24 => 3,
        32 => 4,
        other => return Err(X11Error(format!("{other} bits per pixel are not read"))),
    };
    let pad = usize::from(bits.1 / 8).max(1);
    let row = (usize::from(area.width) * bytes_per_pixel).div_ceil(pad) * pad;
    let masks = colour_masks(&connection, screen)?;
    let little = setup.image_byte_order == ImageOrder::LSB_FIRST;
    let mut pixels = Vec::with_capacity(usize::from(area.width) * usize::from(area.height));
    for y in 0..usize::from(area.height) {
        for x in 0..usize::from(area.width) {
            let start = y * row + x * bytes_per_pixel;
            let Some(bytes) = image.data.get(start..start + bytes_per_pixel) else {
                return Err(X11Error("the image is shorter than its size".to_owned()));
            };
            let mut value: u32 = 0;
            for (i, byte) in bytes.iter().enumerate() {
                let i = if little { i } else { bytes_per_pixel - 1 - i };
                value |= u32::from(*byte) << (8 * i);
            }
            pixels.push(colour_of(value, masks));
        }
    }
    Ok(pixels)
}

/// The colour of screen pixel (`x`, `y`) of `display`.
///
/// # Errors
///
/// As [`screen_pixels`].
pub fn screen_pixel(display: &str, x: i16, y: i16) -> Result<Rgb, X11Error> {
    screen_pixels(display, Rect::new(x, y, 1, 1))?
        .first()
        .copied()
        .ok_or_else(|| X11Error("no pixel read".to_owned()))
}

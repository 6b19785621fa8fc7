//! Pixels without X: a captured image turned into RGB by the visual's
//! channel masks and the server's byte order, rectangles filled with black,
//! an area-averaging scale down, and the PNG an agent gets.

use std::io::Cursor;

use crate::config::Size;

/// Largest PNG a call's result carries: its base64 must fit in a frame of
/// 1 MiB with room for the rest of the result.
pub const MAX_PNG_BASE64: usize = (1 << 20) - 4096;

/// The deflate level of the PNGs made.
const DEFLATE_LEVEL: u8 = 2;

/// An RGB image, 8 bits a channel, rows packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb {
    width: u32,
    height: u32,
    data: Vec<u8>,
}

impl Rgb {
    /// A black image.
    pub fn black(width: u32, height: u32) -> Self {
        Rgb {
            width,
            height,
            data: vec![0; pixels(width, height) * 3],
        }
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// The pixel at (`x`, `y`), if inside.
    #[cfg(test)]
    pub fn pixel(&self, x: u32, y: u32) -> Option<[u8; 3]> {
        if x >= self.width || y >= self.height {
            return None;
        }
        let at = (y as usize * self.width as usize + x as usize) * 3;
        match self.data.get(at..at + 3) {
            Some(&[r, g, b]) => Some([r, g, b]),
            _ => None,
        }
    }

    /// Fills the rectangle at (`x`, `y`) of `width` x `height` (clipped to
    /// the image) with black.
    pub fn fill_black(&mut self, x: i64, y: i64, width: i64, height: i64) {
        let left = x.clamp(0, i64::from(self.width)) as usize;
        let right = x.saturating_add(width).clamp(0, i64::from(self.width)) as usize;
        let top = y.clamp(0, i64::from(self.height)) as usize;
        let bottom = y.saturating_add(height).clamp(0, i64::from(self.height)) as usize;
        if left >= right {
            return;
        }
        let stride = self.width as usize * 3;
        for row in top..bottom {
            if let Some(span) = self
                .data
                .get_mut(row * stride + left * 3..row * stride + right * 3)
            {
                span.fill(0);
            }
        }
    }
}

fn pixels(width: u32, height: u32) -> usize {
    width as usize * height as usize
}

/// One colour channel of a visual: where its bits are in a pixel value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Channel {
    shift: u32,
    max: u32,
}

impl Channel {
    fn new(mask: u32) -> Option<Self> {
        if mask == 0 {
            return None;
        }
        let shift = mask.trailing_zeros();
        let bits = (mask >> shift).trailing_ones();
        // A mask must be one run of bits.
        if (mask >> shift) >> bits != 0 {
            return None;
        }
        Some(Channel {
            shift,
            max: (mask >> shift),
        })
    }

    fn read(self, pixel: u32) -> u8 {
        let value = (pixel >> self.shift) & self.max;
        if self.max == 255 {
            value as u8
        } else {
            ((value * 255 + self.max / 2) / self.max) as u8
        }
    }
}

/// How a ZPixmap image of a TrueColor or DirectColor visual lays out its
/// pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PixelFormat {
    bytes_per_pixel: usize,
    scanline_pad_bits: u32,
    most_significant_first: bool,
    red: Channel,
    green: Channel,
    blue: Channel,
}

/// Why a screen's pixels cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Bits per pixel other than 16, 24 or 32.
    #[error("the screen has {0} bits per pixel, which this device does not read")]
    BitsPerPixel(u8),
    /// A visual's masks that are not three runs of bits.
    #[error("the screen's visual has no usable red, green and blue masks")]
    Masks,
    /// A reply shorter than its size says.
    #[error("the screen's image is shorter than its size")]
    Short,
}

impl PixelFormat {
    /// The layout for `bits_per_pixel`, the scanline pad, the server's
    /// image byte order and the visual's channel masks.
    pub fn new(
        bits_per_pixel: u8,
        scanline_pad_bits: u8,
        most_significant_first: bool,
        masks: [u32; 3],
    ) -> Result<Self, FormatError> {
        let bytes_per_pixel = match bits_per_pixel {
            16 => 2,
            24 => 3,
            32 => 4,
            other => return Err(FormatError::BitsPerPixel(other)),
        };
        let [red, green, blue] = masks.map(Channel::new);
        let (Some(red), Some(green), Some(blue)) = (red, green, blue) else {
            return Err(FormatError::Masks);
        };
        Ok(PixelFormat {
            bytes_per_pixel,
            scanline_pad_bits: u32::from(scanline_pad_bits).max(8),
            most_significant_first,
            red,
            green,
            blue,
        })
    }

    /// Bytes a row of `width` pixels takes, padding included.
    pub fn stride(&self, width: u32) -> usize {
        let bits = width as usize * self.bytes_per_pixel * 8;
        let pad = self.scanline_pad_bits as usize;
        bits.div_ceil(pad) * pad / 8
    }

    /// The RGB image of `width` x `height` pixels in `raw`.
    #[cfg(test)]
    pub fn decode(&self, raw: &[u8], width: u32, height: u32) -> Result<Rgb, FormatError> {
        let mut image = Rgb::black(width, height);
        self.decode_rows(raw, &mut image, 0, height)?;
        Ok(image)
    }

    /// Decodes `rows` rows of `image`'s width from `raw` into `image`, from
    /// row `first` on.
    pub fn decode_rows(
        &self,
        raw: &[u8],
        image: &mut Rgb,
        first: u32,
        rows: u32,
    ) -> Result<(), FormatError> {
        let width = image.width;
        let stride = self.stride(width);
        if raw.len() < stride * rows as usize {
            return Err(FormatError::Short);
        }
        let target_stride = width as usize * 3;
        let target = image
            .data
            .get_mut(first as usize * target_stride..(first + rows) as usize * target_stride)
            .ok_or(FormatError::Short)?;
        let row_bytes = width as usize * self.bytes_per_pixel;
        let common = self.bytes_per_pixel == 4
            && !self.most_significant_first
            && self.red.shift == 16
            && self.green.shift == 8
            && self.blue.shift == 0
            && [self.red.max, self.green.max, self.blue.max] == [255; 3];
        for (source, target) in raw
            .chunks(stride.max(1))
            .zip(target.chunks_mut(target_stride.max(1)))
        {
            let source = source.get(..row_bytes).unwrap_or(&[]);
            if common {
                // B, G, R, pad: the layout of nearly every 24-bit screen.
                for (p, t) in source.chunks_exact(4).zip(target.chunks_exact_mut(3)) {
                    if let ([b, g, r, _], [tr, tg, tb]) = (p, t) {
                        (*tr, *tg, *tb) = (*r, *g, *b);
                    }
                }
                continue;
            }
            for (p, t) in source
                .chunks_exact(self.bytes_per_pixel)
                .zip(target.chunks_exact_mut(3))
            {
                let value = if self.most_significant_first {
                    p.iter().fold(0u32, |v, &b| (v << 8) | u32::from(b))
                } else {
                    p.iter().rev().fold(0u32, |v, &b| (v << 8) | u32::from(b))
                };
                if let [r, g, b] = t {
                    *r = self.red.read(value);
                    *g = self.green.read(value);
                    *b = self.blue.read(value);
                }
            }
        }
        Ok(())
    }
}

/// The size an image of `width` x `height` is scaled to so that it fits
/// `size`, keeping its aspect ratio; never larger than it is.
pub fn fit(width: u32, height: u32, size: Size) -> (u32, u32) {
    let (w, h) = (u64::from(width.max(1)), u64::from(height.max(1)));
    let (fw, fh) = (u64::from(size.width), u64::from(size.height));
    if w <= fw && h <= fh {
        return (w as u32, h as u32);
    }
    // The smaller of the two ratios, compared without floating point.
    if fw * h <= fh * w {
        let height = ((h * fw + w / 2) / w).max(1);
        (fw as u32, height as u32)
    } else {
        let width = ((w * fh + h / 2) / h).max(1);
        (width as u32, fh as u32)
    }
}

/// For each target pixel along one axis, the first source pixel it covers
/// and the weights of the source pixels it covers (summing to `source`).
struct Taps {
    first: Vec<usize>,
    offsets: Vec<usize>,
    weights: Vec<u32>,
    total: u32,
}

impl Taps {
    /// Exact area coverage: source pixel `i` spans `[i*target, (i+1)*target)`
    /// and target pixel `x` spans `[x*source, (x+1)*source)`.
    fn new(source: u32, target: u32) -> Self {
        let (s, t) = (u64::from(source), u64::from(target));
        let mut first = Vec::with_capacity(target as usize);
        let mut offsets = Vec::with_capacity(target as usize + 1);
        let mut weights = Vec::new();
        offsets.push(0);
        for x in 0..t {
            let (start, end) = (x * s, (x + 1) * s);
            let from = start / t;
            let to = end.div_ceil(t).min(s);
            first.push(from as usize);
            for i in from..to {
                let overlap = end.min((i + 1) * t) - start.max(i * t);
                weights.push(overlap as u32);
            }
            offsets.push(weights.len());
        }
        Taps {
            first,
            offsets,
            weights,
            total: source,
        }
    }

    fn of(&self, x: usize) -> (usize, &[u32]) {
        let from = self.first.get(x).copied().unwrap_or(0);
        let range = match (self.offsets.get(x), self.offsets.get(x + 1)) {
            (Some(&a), Some(&b)) => a..b,
            _ => 0..0,
        };
        (from, self.weights.get(range).unwrap_or(&[]))
    }
}

/// `image` scaled down to `width` x `height` by averaging the area each
/// target pixel covers (a box filter with exact fractional coverage).
pub fn scale_down(image: Rgb, width: u32, height: u32) -> Rgb {
    let (width, height) = (width.clamp(1, image.width), height.clamp(1, image.height));
    if width == image.width && height == image.height {
        return image;
    }
    // Across first, then down.
    let across = if width == image.width {
        image
    } else {
        let taps = Taps::new(image.width, width);
        let mut out = Rgb::black(width, image.height);
        for (src, dst) in image
            .data
            .chunks(image.width as usize * 3)
            .zip(out.data.chunks_mut(width as usize * 3))
        {
            for (x, pixel) in dst.chunks_exact_mut(3).enumerate() {
                let (from, weights) = taps.of(x);
                let mut sum = [0u32; 3];
                for (k, &w) in weights.iter().enumerate() {
                    let at = (from + k) * 3;
                    if let Some(&[r, g, b]) = src.get(at..at + 3) {
                        sum[0] += u32::from(r) * w;
                        sum[1] += u32::from(g) * w;
                        sum[2] += u32::from(b) * w;
                    }
                }
                for (p, s) in pixel.iter_mut().zip(sum) {
                    *p = ((s + taps.total / 2) / taps.total) as u8;
                }
            }
        }
        out
    };
    if height == across.height {
        return across;
    }
    let taps = Taps::new(across.height, height);
    let stride = across.width as usize * 3;
    let mut out = Rgb::black(across.width, height);
    let mut sums = vec![0u32; stride];
    for (y, dst) in out.data.chunks_mut(stride).enumerate() {
        let (from, weights) = taps.of(y);
        sums.fill(0);
        for (k, &w) in weights.iter().enumerate() {
            let at = (from + k) * stride;
            if let Some(row) = across.data.get(at..at + stride) {
                for (s, &v) in sums.iter_mut().zip(row) {
                    *s += u32::from(v) * w;
                }
            }
        }
        for (d, s) in dst.iter_mut().zip(&sums) {
            *d = ((s + taps.total / 2) / taps.total) as u8;
        }
    }
    out
}

/// Why an image could not be made into a PNG an agent can be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The PNG encoder failed.
    #[error("the screenshot could not be encoded as PNG: {0}")]
    Png(String),
    /// The PNG's base64 would not fit in a call's result.
    #[error(
        "the screenshot is {bytes} bytes of PNG, more than a call's result can carry (about 1 MiB as base64): zoom into a smaller region or run the device with a smaller --size"
    )]
    TooLarge {
        /// The PNG's size.
        bytes: usize,
    },
}

/// `image` as PNG bytes (RGB, a fast deflate level).
pub fn encode_png(image: &Rgb) -> Result<Vec<u8>, EncodeError> {
    let mut out = Cursor::new(Vec::with_capacity(image.data.len() / 4));
    let mut encoder = png::Encoder::new(&mut out, image.width, image.height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    // zlib's level 2 with adaptive filters: on a screen of text it is a
    // third of the size `Compression::Fast` (fdeflate) makes, for little
    // more time, and well under what a call's result carries.
    encoder.set_deflate_compression(png::DeflateCompression::Level(DEFLATE_LEVEL));
    let mut writer = encoder
        .write_header()
        .map_err(|e| EncodeError::Png(e.to_string()))?;
    writer
        .write_image_data(&image.data)
        .map_err(|e| EncodeError::Png(e.to_string()))?;
    writer
        .finish()
        .map_err(|e| EncodeError::Png(e.to_string()))?;
    Ok(out.into_inner())
}

/// Refuses a PNG whose base64 would not fit in a call's result.
pub fn check_fits(png: &[u8]) -> Result<(), EncodeError> {
    if png.len().div_ceil(3) * 4 > MAX_PNG_BASE64 {
        return Err(EncodeError::TooLarge { bytes: png.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(width: u32, height: u32) -> Size {
        Size { width, height }
    }

    #[test]
    fn fitting_keeps_the_ratio_and_never_enlarges() {
        assert_eq!(fit(1920, 1200, size(1280, 800)), (1280, 800));
        assert_eq!(fit(1920, 1080, size(1280, 800)), (1280, 720));
        assert_eq!(fit(1024, 768, size(1280, 800)), (1024, 768));
        assert_eq!(fit(800, 1600, size(1280, 800)), (400, 800));
        assert_eq!(fit(100_000, 1, size(1280, 800)), (1280, 1));
    }

    #[test]
    fn pixels_decode_by_masks_and_byte_order() {
        let masks = [0xff_0000, 0xff00, 0xff];
        let lsb = PixelFormat::new(32, 32, false, masks).unwrap_or_else(|e| unreachable!("{e}"));
        let image = lsb
            .decode(&[0x30, 0x20, 0x10, 0, 1, 2, 3, 0], 2, 1)
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(image.pixel(0, 0), Some([0x10, 0x20, 0x30]));
        assert_eq!(image.pixel(1, 0), Some([3, 2, 1]));
        let msb = PixelFormat::new(32, 32, true, masks).unwrap_or_else(|e| unreachable!("{e}"));
        let image = msb
            .decode(&[0, 0x10, 0x20, 0x30], 1, 1)
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(image.pixel(0, 0), Some([0x10, 0x20, 0x30]));
        // 16 bits, 5-6-5, rows padded to 32 bits.
        let rgb565 = PixelFormat::new(16, 32, false, [0xf800, 0x07e0, 0x001f])
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(rgb565.stride(1), 4);
        let image = rgb565
            .decode(&[0x1f, 0xf8, 0, 0, 0xe0, 0x07, 0, 0], 1, 2)
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(image.pixel(0, 0), Some([255, 0, 255]));
        assert_eq!(image.pixel(0, 1), Some([0, 255, 0]));
        assert!(lsb.decode(&[0; 7], 2, 1).is_err());
        assert!(PixelFormat::new(32, 32, false, [0xf0f0, 0xff00, 0xff]).is_err());
        assert!(PixelFormat::new(8, 32, false, masks).is_err());
    }

    #[test]
    fn scaling_averages_areas_and_black_stays_black() {
        let mut image = Rgb::black(6, 3);
        image.data.fill(255);
        image.fill_black(0, 0, 3, 3);
        let scaled = scale_down(image, 4, 2);
        assert_eq!((scaled.width(), scaled.height()), (4, 2));
        assert_eq!(scaled.pixel(0, 0), Some([0, 0, 0]));
        // Target pixel 1 covers source 1.5..3: all black.
        assert_eq!(scaled.pixel(1, 1), Some([0, 0, 0]));
        assert_eq!(scaled.pixel(3, 0), Some([255, 255, 255]));
        let png = encode_png(&scaled).unwrap_or_default();
        assert!(png.starts_with(b"\x89PNG"));
        assert!(check_fits(&png).is_ok());
        assert!(check_fits(&vec![0; 800_000]).is_err());
    }
}

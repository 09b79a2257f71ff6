//! Images into packed RGB8: encoded files (JPEG, PNG, WebP, with the pure-Rust
//! decoders of the `image` crate) and raw pixel buffers from the host app.
//! Limits are checked before any pixel buffer is allocated, so a hostile
//! header (100k × 100k) or a truncated file is an error, never an abort.

use crate::{Error, Result};
use image::{ImageFormat, ImageReader};
use std::io::Cursor;

/// Caps on one image.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Encoded (or raw) bytes.
    pub max_bytes: usize,
    /// Width × height.
    pub max_pixels: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_bytes: 64 << 20, max_pixels: 50_000_000 }
    }
}

/// A decoded image: packed RGB8 rows, no padding, and the alpha plane of an
/// encoded file that has one (processors differ on it: transformers'
/// `convert_to_rgb` composites onto white, PIL's `convert("RGB")` drops it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
    pub alpha: Option<Vec<u8>>,
}

impl Rgb {
    /// The pixels composited onto an opaque white background (as they are
    /// without alpha).
    pub fn over_white(&self) -> std::borrow::Cow<'_, [u8]> {
        let Some(alpha) = &self.alpha else { return std::borrow::Cow::Borrowed(&self.data) };
        let px = self.data.chunks_exact(3).zip(alpha).flat_map(|(p, &a)| over_white([p[0], p[1], p[2], a]));
        std::borrow::Cow::Owned(px.collect())
    }
}

/// Layouts of raw pixel buffers (`mlxrt_media`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixelFormat {
    Rgb8,
    Rgba8,
    /// Core Graphics' usual 32-bit layout (blue first).
    Bgra8,
}

impl PixelFormat {
    pub fn bytes_per_pixel(self) -> usize {
        match self {
            PixelFormat::Rgb8 => 3,
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => 4,
        }
    }
}

fn check_size(w: u64, h: u64, limits: &Limits) -> Result<()> {
    if w == 0 || h == 0 {
        // A header can also read as 0 wide when its size field wrapped (a
        // WebP past 16383 pixels a side).
        return Err(Error::invalid(format!("image has no pixels ({w}x{h}): empty, or its header is corrupt or out of range")));
    }
    if w.saturating_mul(h) > limits.max_pixels {
        return Err(Error::invalid(format!("image is {w}x{h}, over the limit of {} pixels", limits.max_pixels)));
    }
    Ok(())
}

/// Decodes a JPEG, PNG or WebP file (the alpha plane kept apart, see `Rgb`).
/// EXIF orientation is not applied (Pillow's `open` does not either).
pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Rgb> {
    if bytes.is_empty() {
        return Err(Error::invalid("image data is empty"));
    }
    if bytes.len() > limits.max_bytes {
        return Err(Error::invalid(format!("image data is {} bytes, over the limit of {}", bytes.len(), limits.max_bytes)));
    }
    let format = image::guess_format(bytes).map_err(|_| Error::invalid("image data is not a JPEG, PNG or WebP file"))?;
    if !matches!(format, ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP) {
        return Err(Error::invalid(format!("image format {format:?} is not supported (JPEG, PNG, WebP)")));
    }
    let name = match format {
        ImageFormat::Jpeg => "JPEG",
        ImageFormat::Png => "PNG",
        _ => "WebP",
    };
    let bad = |e: image::ImageError| Error::invalid(format!("cannot decode the {name} image: {e}"));
    let (w, h) = ImageReader::with_format(Cursor::new(bytes), format).into_dimensions().map_err(bad)?;
    check_size(w as u64, h as u64, limits)?;
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut caps = image::Limits::default();
    caps.max_image_width = Some(w);
    caps.max_image_height = Some(h);
    // The largest decoded form: 16-bit RGBA.
    caps.max_alloc = Some((w as u64 * h as u64 * 8).max(1 << 20));
    reader.limits(caps);
    let img = reader.decode().map_err(bad)?;
    if img.color().has_alpha() {
        let rgba = img.into_rgba8();
        let (width, height) = (rgba.width() as usize, rgba.height() as usize);
        let raw = rgba.into_raw();
        let data = raw.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect();
        let alpha = raw.chunks_exact(4).map(|p| p[3]).collect();
        return Ok(Rgb { width, height, data, alpha: Some(alpha) });
    }
    let rgb = img.into_rgb8();
    let (width, height) = (rgb.width() as usize, rgb.height() as usize);
    Ok(Rgb { width, height, data: rgb.into_raw(), alpha: None })
}

/// One RGBA pixel over an opaque white background, in Pillow's fixed point
/// (`ImagingAlphaComposite`, 7 fractional bits, division by 255 by shifts).
fn over_white(p: [u8; 4]) -> [u8; 3] {
    let a = p[3] as u32;
    if a == 0 {
        return [255; 3];
    }
    let (c1, c2) = (a << 7, (255 - a) << 7);
    let div255 = |v: u32| ((v >> 8) + v) >> 8;
    let ch = |c: u8| (div255(c as u32 * c1 + 255 * c2 + (0x80 << 7)) >> 7) as u8;
    [ch(p[0]), ch(p[1]), ch(p[2])]
}

/// Copies a raw pixel buffer (rows `stride` bytes apart; 0 = packed) into
/// packed RGB8 (alpha dropped: a host's buffer is taken as opaque).
pub fn from_pixels(
    format: PixelFormat,
    width: usize,
    height: usize,
    stride: usize,
    bytes: &[u8],
    limits: &Limits,
) -> Result<Rgb> {
    check_size(width as u64, height as u64, limits)?;
    let bpp = format.bytes_per_pixel();
    let row = width * bpp;
    let stride = if stride == 0 { row } else { stride };
    if stride < row {
        return Err(Error::invalid(format!("stride {stride} is less than width × {bpp} bytes ({row})")));
    }
    let need = stride.checked_mul(height - 1).and_then(|n| n.checked_add(row)).unwrap_or(usize::MAX);
    if bytes.len() < need {
        return Err(Error::invalid(format!("pixel buffer holds {} bytes; {width}x{height} at stride {stride} needs {need}", bytes.len())));
    }
    let mut data = Vec::with_capacity(width * height * 3);
    for y in 0..height {
        let r = &bytes[y * stride..y * stride + row];
        match format {
            PixelFormat::Rgb8 => data.extend_from_slice(r),
            PixelFormat::Rgba8 => r.chunks_exact(4).for_each(|p| data.extend_from_slice(&p[..3])),
            PixelFormat::Bgra8 => r.chunks_exact(4).for_each(|p| data.extend_from_slice(&[p[2], p[1], p[0]])),
        }
    }
    Ok(Rgb { width, height, data, alpha: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, (x ^ y) as u8]));
        let mut out = Vec::new();
        img.write_to(&mut Cursor::new(&mut out), ImageFormat::Png).unwrap();
        out
    }

    #[test]
    fn decodes_png_and_rejects_hostile_data() {
        let l = Limits::default();
        let ok = decode(&png(7, 5), &l).unwrap();
        assert_eq!((ok.width, ok.height, ok.data.len()), (7, 5, 105));
        assert_eq!(&ok.data[3..6], &[1, 0, 1]);
        let p = png(7, 5);
        for (what, bytes) in [
            ("empty", Vec::new()),
            ("not an image", b"hello, world".to_vec()),
            ("truncated", p[..p.len() / 2].to_vec()),
        ] {
            let e = decode(&bytes, &l).expect_err(what);
            assert_eq!(e.kind, crate::ErrorKind::InvalidArgument, "{what}: {e}");
        }
        let small = Limits { max_bytes: 10, ..l };
        assert!(decode(&p, &small).unwrap_err().message.contains("over the limit"));
    }

    #[test]
    fn raw_pixels_in_every_layout_give_the_same_rgb() {
        let l = Limits::default();
        let rgb = [10u8, 20, 30, 40, 50, 60];
        let a = from_pixels(PixelFormat::Rgb8, 2, 1, 0, &rgb, &l).unwrap();
        let b = from_pixels(PixelFormat::Rgba8, 2, 1, 0, &[10, 20, 30, 255, 40, 50, 60, 0], &l).unwrap();
        // BGRA with 4 bytes of row padding.
        let c = from_pixels(PixelFormat::Bgra8, 2, 1, 12, &[30, 20, 10, 1, 60, 50, 40, 1, 9, 9, 9, 9], &l).unwrap();
        assert_eq!(a.data, rgb);
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert!(from_pixels(PixelFormat::Rgb8, 2, 2, 0, &rgb, &l).is_err());
        assert!(from_pixels(PixelFormat::Rgb8, 0, 2, 0, &rgb, &l).is_err());
        assert!(from_pixels(PixelFormat::Rgba8, 2, 1, 5, &rgb, &l).is_err());
    }
}

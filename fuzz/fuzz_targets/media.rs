//! What a host hands mlxrt as an image: encoded file bytes (`media::decode`,
//! as a `{"type": "image", "data"}` part or an `MLXRT_MEDIA_ENCODED`
//! buffer) and raw pixel buffers (`media::from_pixels`, the `MLXRT_PIXEL_*`
//! layouts), then Gemma 3's image processor on what decodes.
//!
//! Input: arbitrary bytes; the first 8 also give a raw buffer's width,
//! height, stride and layout. Errors are expected and fine; a panic, an abort
//! on a huge allocation, a hang or a sanitizer report is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxrt::media::{decode, from_pixels, ImageProcessor, Limits, PixelFormat};
use std::sync::OnceLock;

fn processor() -> &'static ImageProcessor {
    static P: OnceLock<ImageProcessor> = OnceLock::new();
    P.get_or_init(|| {
        let cfg = serde_json::json!({"size": {"height": 32, "width": 32}, "resample": 2,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]});
        ImageProcessor::from_json(&cfg).expect("a valid processor config")
    })
}

fuzz_target!(|data: &[u8]| {
    // Small limits keep each run fast; the checks are the same.
    let limits = Limits { max_bytes: 1 << 20, max_pixels: 1 << 20 };
    if let Ok(img) = decode(data, &limits) {
        assert_eq!(img.data.len(), img.width * img.height * 3);
        let px = processor().process(&img);
        assert_eq!(px.data.len(), 3 * 32 * 32);
    }
    if data.len() >= 8 {
        let w = u16::from_le_bytes([data[0], data[1]]) as usize;
        let h = u16::from_le_bytes([data[2], data[3]]) as usize;
        let stride = u16::from_le_bytes([data[4], data[5]]) as usize;
        let format = [PixelFormat::Rgb8, PixelFormat::Rgba8, PixelFormat::Bgra8][data[6] as usize % 3];
        if let Ok(img) = from_pixels(format, w, h, stride, &data[8..], &limits) {
            assert_eq!(img.data.len(), w * h * 3);
            processor().process(&img);
        }
    }
});

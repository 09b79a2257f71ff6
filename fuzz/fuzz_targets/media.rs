//! What a host hands mlxrt as media: encoded image files (`media::decode`,
//! as a `{"type": "image", "data"}` part or an `MLXRT_MEDIA_ENCODED`
//! buffer), raw pixel buffers (`media::from_pixels`, the `MLXRT_PIXEL_*`
//! layouts) and WAV files (`media::decode_wav`), then the image processors
//! (Gemma 3's fixed size, Qwen3-VL's smart resize and patches, Gemma 4's
//! patch budget) and Gemma 4's log-mel feature extractor on what decodes.
//!
//! Input: arbitrary bytes; the first 8 also give a raw buffer's width,
//! height, stride and layout. Errors are expected and fine; a panic, an abort
//! on a huge allocation, a hang or a sanitizer report is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxrt::media::{decode, decode_wav, from_pixels, AudioProcessor, ImageProcessor, Limits, PixelFormat, Rgb};
use serde_json::json;
use std::sync::OnceLock;

fn processors() -> &'static [ImageProcessor; 3] {
    static P: OnceLock<[ImageProcessor; 3]> = OnceLock::new();
    P.get_or_init(|| {
        let gemma3 = json!({"size": {"height": 32, "width": 32}, "resample": 2,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]});
        let qwen = json!({"patch_size": 4, "merge_size": 2, "min_pixels": 256, "max_pixels": 4096});
        let gemma4 = json!({"patch_size": 4, "max_soft_tokens": 16, "pooling_kernel_size": 2});
        [
            ImageProcessor::from_json(&gemma3).expect("a valid processor config"),
            ImageProcessor::qwen_vl_from(&qwen).expect("a valid processor config"),
            ImageProcessor::gemma4(&gemma4).expect("a valid processor config"),
        ]
    })
}

fn audio_processor() -> &'static AudioProcessor {
    static P: OnceLock<AudioProcessor> = OnceLock::new();
    P.get_or_init(|| AudioProcessor::gemma4(&json!({}), &json!({})).expect("the default feature extractor"))
}

/// Every processor on `img`: a result whose data matches its shape, or an
/// error (Qwen refuses aspect ratios over 200).
fn process(img: &Rgb) {
    for p in processors() {
        if let Ok(it) = p.process(img) {
            assert_eq!(it.data.len(), it.shape.iter().product::<usize>());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // Small limits keep each run fast; the checks are the same.
    let limits = Limits { max_bytes: 1 << 20, max_pixels: 1 << 20 };
    if let Ok(img) = decode(data, &limits) {
        assert_eq!(img.data.len(), img.width * img.height * 3);
        process(&img);
    }
    if let Ok(audio) = decode_wav(data, &limits) {
        assert!(!audio.samples.is_empty());
        if let Ok(it) = audio_processor().process(&mlxrt::media::Audio { rate: 16000, ..audio }) {
            assert_eq!(it.data.len(), it.shape.iter().product::<usize>());
            assert!(it.valid <= it.shape[0] && it.data.iter().all(|v| v.is_finite()));
        }
    }
    if data.len() >= 8 {
        let w = u16::from_le_bytes([data[0], data[1]]) as usize;
        let h = u16::from_le_bytes([data[2], data[3]]) as usize;
        let stride = u16::from_le_bytes([data[4], data[5]]) as usize;
        let format = [PixelFormat::Rgb8, PixelFormat::Rgba8, PixelFormat::Bgra8][data[6] as usize % 3];
        if let Ok(img) = from_pixels(format, w, h, stride, &data[8..], &limits) {
            assert_eq!(img.data.len(), w * h * 3);
            process(&img);
        }
    }
});

//! Images in prompts against mlx-vlm 0.7.10 (the oracle,
//! tests/oracle/make_tiny_vlm.py): a tiny random-weight Gemma 3
//! vision-language checkpoint built with mlx-vlm's own classes, test images of
//! odd sizes, and the Python processor's pixel tensors, tower outputs, logits
//! and greedy tokens.

mod common;

use common::media::*;
use common::*;
use mlxrt::media::{self, ImageProcessor, Limits};
use mlxrt::ErrorKind;

/// Pixel tensors: equal to the processor's (transformers' Gemma 3 PIL image
/// processor, as mlx-vlm uses it). PNG and lossless WebP: the decoded RGB is
/// Pillow's exactly and the tensors are bit-equal (the resampler is Pillow's fixed-point
/// algorithm). JPEG: the `image` crate's decoder (zune-jpeg) and Pillow's
/// (libjpeg-turbo) upsample chroma and round the IDCT differently: here up to
/// a quarter of the decoded values differ, by a few levels. Measured on the
/// test images: tensors max |Δ| 3 levels (0.0235 after mean/std 0.5), mean
/// |Δ| 0.003 (0.4 level); asserted: at most 4 levels, mean under 1 level.
#[test]
fn pixel_tensors_match_the_processor() {
    let dir = tiny_vlm();
    let mut r = reference(&dir);
    let proc = ImageProcessor::load(&dir.join("model")).unwrap().expect("preprocessor_config.json");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir.join("images")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let img = media::decode(&std::fs::read(&path).unwrap(), &Limits::default()).unwrap();
        let want_rgb = r.take(&format!("decoded.{name}")).unwrap();
        let shape = want_rgb.shape();
        assert_eq!((img.height, img.width), (shape[0] as usize, shape[1] as usize), "{name}: size");
        let want_rgb = want_rgb.to_bytes().unwrap();
        // As transformers' convert_to_rgb: transparency over white.
        let rgb_diff = img.over_white().iter().zip(&want_rgb).filter(|(a, b)| a != b).count();
        let px = proc.process(&img).unwrap();
        let want = r.take(&format!("pixels.{name}")).unwrap().to_vec_f32().unwrap();
        assert_eq!(px.data.len(), want.len());
        let diff: Vec<f32> = px.data.iter().zip(&want).map(|(a, b)| (a - b).abs()).collect();
        let max = diff.iter().cloned().fold(0f32, f32::max);
        let n_diff = diff.iter().filter(|&&d| d > 0.0).count();
        eprintln!("{name}: decoded RGB differs from Pillow's at {rgb_diff} values; pixels max |Δ| {max:.2e} at {n_diff}/{}", want.len());
        if path.extension().unwrap() != "jpg" {
            assert_eq!(rgb_diff, 0, "{name}: PNG/WebP decode differs from Pillow's");
            assert_eq!(max, 0.0, "{name}: PNG/WebP pixel tensor not bit-equal to the processor's");
        } else {
            let mean = diff.iter().sum::<f32>() / diff.len() as f32;
            eprintln!("{name}: JPEG pixels mean |Δ| {mean:.2e}");
            assert!(max <= 8.0 / 255.0 + 1e-6, "{name}: JPEG pixels max |Δ| {max}");
            assert!(mean <= 2.0 / 255.0, "{name}: JPEG pixels mean |Δ| {mean}");
        }
        seen += 1;
    }
    assert!(seen >= 6, "expected the oracle's 6 test images, found {seen}");
}

/// Hostile media: errors with INVALID_ARGUMENT, never a crash or a huge
/// allocation.
#[test]
fn hostile_images_are_invalid_argument() {
    let dir = tiny_vlm();
    let jpg = std::fs::read(dir.join("images/odd_jpg.jpg")).unwrap();
    let png = std::fs::read(dir.join("images/odd_png.png")).unwrap();
    // A PNG whose header claims 100000 × 100000 (IHDR fields patched; its
    // CRC left stale, so decoders that check it refuse it too).
    let mut huge = png.clone();
    huge[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    huge[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    // A JPEG whose SOF0 frame header claims 65500 × 65500.
    let mut huge_jpg = jpg.clone();
    let sof = huge_jpg.windows(2).position(|w| w == [0xFF, 0xC0]).expect("baseline JPEG");
    huge_jpg[sof + 5..sof + 7].copy_from_slice(&65500u16.to_be_bytes());
    huge_jpg[sof + 7..sof + 9].copy_from_slice(&65500u16.to_be_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("not an image", b"GIF89a nope".to_vec()),
        ("text", b"{\"type\": \"image\"}".to_vec()),
        ("truncated JPEG", jpg[..jpg.len() / 3].to_vec()),
        ("JPEG header only", jpg[..20].to_vec()),
        ("truncated PNG", png[..png.len() - 30].to_vec()),
        ("100k x 100k PNG", huge),
        ("65500 x 65500 JPEG", huge_jpg),
    ];
    for (what, bytes) in cases {
        match media::decode(&bytes, &Limits::default()) {
            Err(e) => assert_eq!(e.kind, ErrorKind::InvalidArgument, "{what}: {e}"),
            Ok(img) => panic!("{what}: decoded a {}x{} image", img.width, img.height),
        }
    }
}

use mlxrt::engine::{Engine, EngineConfig, Event};
use mlxrt::mlx::{self, Array};
use mlxrt::media::MediaItem;
use mlxrt::model::{load, LoadOptions, MediaInput};
use serde_json::{json, Value};

/// Max |Δ| between mlxrt's and mlx-vlm's logits (f32 weights).
const LOGIT_TOL: f32 = 1e-3;

fn items(proc: &ImageProcessor, files: &[String]) -> Vec<MediaItem> {
    files.iter().map(|f| proc.process(&media::decode(&std::fs::read(f).unwrap(), &Limits::default()).unwrap()).unwrap()).collect()
}

/// The model API: tower output and greedy decoding (prompt in one forward
/// with the image rows spliced in, then one token per step) against mlx-vlm.
#[test]
fn gemma3_tower_and_logits_match_mlx_vlm() {
    let dir = tiny_vlm();
    let folder = dir.join("model");
    let m = load(&folder, &LoadOptions::default()).unwrap();
    let v = m.towers.image.as_ref().expect("the checkpoint's vision tower is built");
    let spec = m.text.media.as_ref().expect("media spec");
    let (proc, slot) = spec.image.as_ref().expect("an image processor");
    for c in cases(&dir) {
        let files: Vec<String> = c.messages.as_array().unwrap().iter()
            .flat_map(|m| m["content"].as_array().unwrap().iter().filter_map(|p| p["path"].as_str().map(str::to_owned)))
            .collect();
        assert_eq!(files.len(), c.images.len());
        let items = items(proc, &files);
        // The processor's own tensors (bit-equal for these PNGs, checked in
        // pixel_tensors_match_the_processor) are what the tower ran on.
        let mut r = reference(&dir);
        let want: Vec<f32> = c.images.iter().flat_map(|n| r.take(&format!("pixels.{n}")).unwrap().to_vec_f32().unwrap()).collect();
        let ours: Vec<f32> = items.iter().flat_map(|it| it.data.clone()).collect();
        assert_eq!(ours, want, "{}: pixel tensors", c.name);
        let encoded = v.encode(&items.iter().collect::<Vec<_>>()).unwrap();
        let rows = Array::concatenate(&encoded.iter().map(|e| &e.rows).collect::<Vec<_>>(), 0).unwrap();
        // mlx-vlm's projector output, before the division by √(config
        // `hidden_size`) that the tower's rows include.
        let config: Value = serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap()).unwrap();
        let divisor = (config["hidden_size"].as_f64().unwrap() as f32).sqrt();
        let tower: Vec<f32> = rows.reshape(&[-1]).unwrap().to_vec_f32().unwrap().iter().map(|x| x * divisor).collect();
        let d = max_abs_diff(&tower, &c.tower);
        assert!(d <= 1e-4, "{}: tower output max |Δ| {d}", c.name);
        let at: Vec<usize> = c.prompt.iter().enumerate().filter(|(_, &t)| t == slot.soft_id).map(|(i, _)| i).collect();
        let zero: Vec<usize> = c.prompt.iter().enumerate().filter(|(_, &t)| Some(t) == spec.zero_id).map(|(i, _)| i).collect();
        let media = MediaInput { features: rows, at, zero, deepstack: vec![], mrope: None, blocks: vec![] };
        let (tokens, worst) = greedy_media(&m, &c, &media);
        eprintln!("{}: tower max |Δ| {d:.2e}; {} tokens; logits max |Δ| {worst:.2e}", c.name, tokens.len());
        assert_eq!(tokens, c.tokens, "{}: greedy tokens differ from mlx-vlm", c.name);
        assert!(worst <= LOGIT_TOL, "{}: logits max |Δ| {worst} > {LOGIT_TOL}", c.name);
    }
    let _ = mlx::version();
}

/// The engine: an image prompt alone and batched with text rows gives
/// mlx-vlm's tokens (the text rows their own solo tokens). Repeated images
/// come from the encoder cache (the tower runs once per distinct image) and
/// give the same tokens; without the cache the tower runs for every image.
#[test]
fn engine_image_prompts_alone_and_batched_with_text() {
    check_engine(&tiny_vlm(), 256 << 20);
}

#[test]
fn engine_without_encoder_cache() {
    check_engine(&tiny_vlm(), 0);
}

/// Media errors at submit, naming the part; the engine keeps serving.
#[test]
fn media_errors_name_the_part() {
    let dir = tiny_vlm();
    let png = dir.join("images/odd_png.png");
    let img = std::fs::read(&png).unwrap();
    let b64 = base64_encode(&img);
    let jpg = std::fs::read(dir.join("images/odd_jpg.jpg")).unwrap();
    let webp = std::fs::read(dir.join("images/odd_webp.webp")).unwrap();
    // Headers claiming 100000 x 100000 (PNG) and 8000 x 8000 (lossless
    // WebP: 14-bit width - 1 and height - 1 after the VP8L signature).
    let mut huge_png = img.clone();
    huge_png[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    huge_png[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let crc = crc32(&huge_png[12..29]); // IHDR's type and data: a valid header
    huge_png[29..33].copy_from_slice(&crc.to_be_bytes());
    let mut huge_webp = webp.clone();
    let at = webp.windows(4).position(|w| w == b"VP8L").expect("a lossless WebP") + 9;
    let bits = u32::from_le_bytes(webp[at..at + 4].try_into().unwrap());
    let side = 8000 - 1; // 64 million pixels
    huge_webp[at..at + 4].copy_from_slice(&(bits & 0xF000_0000 | side << 14 | side).to_le_bytes());
    let data = |b: &[u8]| json!({"type": "image", "data": base64_encode(b)});
    let part = |p: Value| json!([{"role": "user", "content": [p, {"type": "text", "text": "What is it?"}]}]);
    // A text-only model: UNSUPPORTED, never a silent text-only answer.
    let text_only = engine();
    let err = text_only.prepare(request(part(json!({"type": "image", "data": b64})), 4)).err().expect("unsupported");
    assert_eq!(err.kind, ErrorKind::Unsupported, "{err}");
    assert!(err.message.contains("messages[0].content[0]"), "{err}");
    let e = Engine::new(EngineConfig::new(dir.join("model"))).unwrap();
    let cases: Vec<(Value, ErrorKind, &str)> = vec![
        (json!({"type": "audio", "data": "AAAA"}), ErrorKind::Unsupported, "audio"),
        (json!({"type": "image_url", "image_url": {"url": "http://x/y.png"}}), ErrorKind::Unsupported, "image_url"),
        (json!({"type": "image", "data": "not base64!"}), ErrorKind::InvalidArgument, "base64"),
        (json!({"type": "image", "data": base64_encode(&img[..img.len() / 2])}), ErrorKind::InvalidArgument, "cannot decode the PNG"),
        (json!({"type": "image", "data": base64_encode(b"hello")}), ErrorKind::InvalidArgument, "not a JPEG"),
        (json!({"type": "image"}), ErrorKind::InvalidArgument, "needs `path`"),
        (json!({"type": "image", "media": 0}), ErrorKind::InvalidArgument, "media entries"),
        (json!({"type": "image", "path": "/nonexistent/x.png"}), ErrorKind::Io, "/nonexistent/x.png"),
        // Hostile media.
        (data(&jpg[..jpg.len() / 3]), ErrorKind::InvalidArgument, "cannot decode the JPEG"),
        (data(&huge_png), ErrorKind::InvalidArgument, "100000x100000, over the limit"),
        (data(b""), ErrorKind::InvalidArgument, "empty"),
        (data(&webp[..webp.len() / 2]), ErrorKind::InvalidArgument, "cannot decode the WebP"),
        (data(&huge_webp), ErrorKind::InvalidArgument, "8000x8000, over the limit"),
    ];
    for (p, kind, says) in cases {
        let err = e.prepare(request(part(p.clone()), 4)).err().unwrap_or_else(|| panic!("{says}: accepted"));
        assert_eq!(err.kind, kind, "{says}: {err}");
        assert!(err.message.contains("messages[0].content[0]") && err.message.contains(says), "{says}: {err}");
    }
    // Still serving, and the same picture as a path, as base64 data, as a
    // data URL and as a lossless WebP gives the same tokens.
    let tokens = |p: Value| {
        let ev = run(&e, request(part(p.clone()), 8));
        assert!(matches!(ev.last(), Some(Event::Done { .. })), "{p}: {ev:?}");
        tokens_of(&ev)
    };
    let by_path = tokens(json!({"type": "image", "path": png}));
    assert_eq!(by_path.len(), 8);
    assert_eq!(tokens(json!({"type": "image", "data": b64})), by_path, "base64 data");
    assert_eq!(tokens(json!({"type": "image", "data": format!("data:image/png;base64,{b64}")})), by_path, "data URL");
    let odd_webp = dir.join("images/odd_webp.webp");
    assert_eq!(tokens(json!({"type": "image", "data": base64_encode(&webp)})), tokens(json!({"type": "image", "path": odd_webp})), "WebP");
}

/// PNG's chunk checksum (CRC-32, polynomial 0xEDB88320).
fn crc32(b: &[u8]) -> u32 {
    let mut c = !0u32;
    for &x in b {
        c ^= x as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

fn base64_encode(b: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The C ABI (tests/c/test_media.c): the same picture as a file path, as
/// encoded bytes and as RGB8/RGBA8/padded BGRA8 `mlxrt_media` buffers gives
/// the same tokens, with one tower run in `mlxrt_engine_stats` (the encoder
/// cache serves the other four); bad buffers are INVALID_ARGUMENT naming the entry, audio
/// and a model without a tower UNSUPPORTED; the engine keeps serving.
#[test]
fn c_abi_media_buffers() {
    let dir = tiny_vlm();
    let (png, raw, w, h) = tiny_vlm_image(&dir);
    let bin = compile_c("test_media", "test_media", &[]);
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg(dir.join("model")).arg(&png).arg(&raw).arg(w.to_string()).arg(h.to_string()).arg(model_path());
    let out = this_library(&mut cmd).output().unwrap();
    assert!(out.status.success(), "test_media failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn prompt_cache_keys_media_prompts_by_image_content() {
    check_prefix_identity(&tiny_vlm());
}

#[test]
fn prompt_cache_disk_tier_keys_media_prompts_by_image_content() {
    check_prefix_identity_on_disk(&tiny_vlm());
}

//! Images in prompts against mlx-vlm 0.7.10 (the oracle,
//! tests/oracle/make_tiny_vlm.py): a tiny random-weight Gemma 3
//! vision-language checkpoint built with mlx-vlm's own classes, test images of
//! odd sizes, and the Python processor's pixel tensors, tower outputs, logits
//! and greedy tokens.

mod common;

use common::*;
use mlxrt::media::{self, ImageProcessor, Limits};
use mlxrt::mlx::io::TensorFile;
use mlxrt::ErrorKind;

fn reference(dir: &std::path::Path) -> TensorFile {
    TensorFile::load_safetensors(dir.join("reference.safetensors").to_str().unwrap()).unwrap()
}

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
        let rgb_diff = img.data.iter().zip(&want_rgb).filter(|(a, b)| a != b).count();
        let px = proc.process(&img);
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

use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use mlxrt::mlx::{self, Array};
use mlxrt::model::{load, LoadOptions, MediaInput, Output};
use serde_json::{json, Value};

/// Max |Δ| between mlxrt's and mlx-vlm's logits (f32 weights).
const LOGIT_TOL: f32 = 1e-3;

/// One prompt of the reference: its messages (image parts pointing at the
/// oracle's files), ids, greedy tokens, logits of every step, tower output.
struct MediaCase {
    name: String,
    messages: Value,
    images: Vec<String>,
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    tower: Vec<f32>,
}

fn cases(dir: &std::path::Path) -> Vec<MediaCase> {
    let mut r = reference(dir);
    let mlxrt::mlx::io::Meta::Str(c) = r.meta("cases").unwrap().expect("cases metadata") else { panic!("cases") };
    let list: Vec<Value> = serde_json::from_str(&c).unwrap();
    list.into_iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap().to_owned();
            let images: Vec<String> = c["images"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect();
            let mut files = images.iter().map(|n| {
                let p = std::fs::read_dir(dir.join("images")).unwrap().map(|e| e.unwrap().path())
                    .find(|p| p.file_stem().unwrap() == n.as_str()).unwrap();
                p.to_str().unwrap().to_owned()
            });
            let mut messages = c["messages"].clone();
            for m in messages.as_array_mut().unwrap() {
                for part in m["content"].as_array_mut().unwrap() {
                    if part["type"] == "image" {
                        part["path"] = json!(files.next().unwrap());
                    }
                }
            }
            let ids = |k: &str, r: &mut TensorFile| r.take(&format!("{name}.{k}")).unwrap().to_vec_i32().unwrap().iter().map(|&t| t as u32).collect::<Vec<u32>>();
            let (prompt, tokens) = (ids("prompt_ids", &mut r), ids("tokens", &mut r));
            let l = r.take(&format!("{name}.logits")).unwrap();
            let v = l.shape()[1] as usize;
            let logits = l.to_vec_f32().unwrap().chunks(v).map(<[f32]>::to_vec).collect();
            let tower = r.take(&format!("{name}.tower")).unwrap().to_vec_f32().unwrap();
            MediaCase { name, messages, images, prompt, tokens, logits, tower }
        })
        .collect()
}

fn pixels(dir: &std::path::Path, proc: &ImageProcessor, files: &[String]) -> (Array, i32) {
    let _ = dir;
    let mut data = vec![];
    let mut s = 0;
    for f in files {
        let px = proc.process(&media::decode(&std::fs::read(f).unwrap(), &Limits::default()).unwrap());
        s = px.height as i32;
        data.extend(px.data);
    }
    let n = files.len() as i32;
    (Array::from_f32(&data, &[n, 3, s, s]).unwrap().transpose(&[0, 2, 3, 1]).unwrap(), n)
}

/// The model API: tower output and greedy decoding (prompt in one forward
/// with the image rows spliced in, then one token per step) against mlx-vlm.
#[test]
fn gemma3_tower_and_logits_match_mlx_vlm() {
    let dir = tiny_vlm();
    let folder = dir.join("model");
    let m = load(&folder, &LoadOptions::default()).unwrap();
    let v = m.vision.as_ref().expect("the checkpoint's vision tower is built");
    let spec = m.text.media.as_ref().expect("media spec");
    let proc = &spec.processor;
    for c in cases(&dir) {
        let files: Vec<String> = c.messages.as_array().unwrap().iter()
            .flat_map(|m| m["content"].as_array().unwrap().iter().filter_map(|p| p["path"].as_str().map(str::to_owned)))
            .collect();
        assert_eq!(files.len(), c.images.len());
        let (px, _) = pixels(&dir, proc, &files);
        // The processor's own tensors (bit-equal for these PNGs, checked in
        // pixel_tensors_match_the_processor) are what the tower ran on.
        let mut r = reference(&dir);
        let want: Vec<f32> = c.images.iter().flat_map(|n| r.take(&format!("pixels.{n}")).unwrap().to_vec_f32().unwrap()).collect();
        let ours = px.transpose(&[0, 3, 1, 2]).unwrap().reshape(&[-1]).unwrap().to_vec_f32().unwrap();
        assert_eq!(ours, want, "{}: pixel tensors", c.name);
        let tower = v.forward(&px).unwrap().reshape(&[-1]).unwrap().to_vec_f32().unwrap();
        let d = max_abs_diff(&tower, &c.tower);
        assert!(d <= 1e-4, "{}: tower output max |Δ| {d}", c.name);
        let features = v.embed(&px).unwrap();
        let at: Vec<usize> = c.prompt.iter().enumerate().filter(|(_, &t)| t == spec.soft_id).map(|(i, _)| i).collect();
        let zero: Vec<usize> = c.prompt.iter().enumerate().filter(|(_, &t)| t == v.pad_id).map(|(i, _)| i).collect();
        let media = MediaInput { features, at, zero };
        let mut cache = m.model.new_cache(1);
        let ids: Vec<i32> = c.prompt.iter().map(|&t| t as i32).collect();
        let x = Array::from_i32(&ids, &[1, ids.len() as i32]).unwrap();
        let mut logits = m.model.forward_media(&x, &media, &mut cache, Output::LastLogits).unwrap().unwrap().reshape(&[-1]).unwrap();
        let (mut worst, mut tokens) = (0f32, vec![]);
        for step in 0..c.tokens.len() {
            let l = logits.to_vec_f32().unwrap();
            worst = worst.max(max_abs_diff(&l, &c.logits[step]));
            let next = logits.argmax(-1, false).unwrap().item_i32().unwrap();
            tokens.push(next as u32);
            let x = Array::from_i32(&[next], &[1, 1]).unwrap();
            logits = m.model.forward(&x, &mut cache, Output::LastLogits).unwrap().unwrap().reshape(&[-1]).unwrap();
        }
        eprintln!("{}: tower max |Δ| {d:.2e}; {} tokens; logits max |Δ| {worst:.2e}", c.name, tokens.len());
        assert_eq!(tokens, c.tokens, "{}: greedy tokens differ from mlx-vlm", c.name);
        assert!(worst <= LOGIT_TOL, "{}: logits max |Δ| {worst} > {LOGIT_TOL}", c.name);
    }
    let _ = mlx::version();
}

fn request(messages: Value, steps: u32) -> RequestOptions {
    let mut o = RequestOptions::new(Input::Messages(messages));
    o.max_tokens = steps;
    o.stop_at_eos = false;
    o
}

/// The engine: an image prompt alone and batched with text rows gives
/// mlx-vlm's tokens (the text rows their own solo tokens). Repeated images
/// come from the encoder cache (the tower runs once per distinct image) and
/// give the same tokens; without the cache the tower runs for every image.
#[test]
fn engine_image_prompts_alone_and_batched_with_text() {
    check_engine(256 << 20);
}

#[test]
fn engine_without_encoder_cache() {
    check_engine(0);
}

fn check_engine(encoder_cache_bytes: usize) {
    let dir = tiny_vlm();
    let mut cfg = EngineConfig::new(dir.join("model"));
    cfg.max_rows = 4;
    cfg.encoder_cache_bytes = encoder_cache_bytes;
    let e = Engine::new(cfg).unwrap();
    let all = cases(&dir);
    for c in &all {
        let ev = run(&e, request(c.messages.clone(), c.tokens.len() as u32));
        let Some(Event::Done { usage, .. }) = ev.last() else { panic!("{}: {ev:?}", c.name) };
        assert_eq!(usage.prompt_tokens as usize, c.prompt.len(), "{}: prompt length (expansion)", c.name);
        assert_eq!(tokens_of(&ev), c.tokens, "{}: engine tokens differ from mlx-vlm", c.name);
    }
    // Batched: a text request decoding while the image prompt prefills, and
    // another queued behind it.
    let text = |t: &str| request(json!([{"role": "user", "content": t}]), 24);
    let solo: Vec<Vec<u32>> = ["Tell me a long story about a cat.", "Hi"].iter().map(|t| tokens_of(&run(&e, text(t)))).collect();
    let c = &all[1];
    let rx_a = submit(&e, text("Tell me a long story about a cat."));
    let rx_m = submit(&e, request(c.messages.clone(), c.tokens.len() as u32));
    let rx_b = submit(&e, text("Hi"));
    assert_eq!(tokens_of(&collect(&rx_m)), c.tokens, "batched image prompt");
    assert_eq!(tokens_of(&collect(&rx_a)), solo[0], "text row batched with an image prompt");
    assert_eq!(tokens_of(&collect(&rx_b)), solo[1], "text row queued behind an image prompt");
    let s = wait_idle(&e);
    let images: Vec<&String> = all.iter().flat_map(|c| &c.images).chain(&c.images).collect();
    let mut distinct = images.clone();
    distinct.sort();
    distinct.dedup();
    eprintln!("{} images, {} distinct: tower runs {}, encoder cache hits {}", images.len(), distinct.len(), s.tower_runs, s.encoder_cache_hits);
    if encoder_cache_bytes > 0 {
        assert_eq!((s.tower_runs as usize, s.encoder_cache_hits as usize), (distinct.len(), images.len() - distinct.len()));
    } else {
        assert_eq!((s.tower_runs as usize, s.encoder_cache_hits), (images.len(), 0));
    }
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

/// Runs a case on `e`: its tokens, the prompt tokens the prompt cache
/// supplied, and the engine's tower runs so far.
fn go(e: &Engine, c: &MediaCase) -> (Vec<u32>, usize, u64) {
    let ev = run(e, request(c.messages.clone(), c.tokens.len() as u32));
    let Some(Event::Done { usage, .. }) = ev.last() else { panic!("{}: {ev:?}", c.name) };
    (tokens_of(&ev), usage.cached_tokens as usize, wait_idle(e).tower_runs)
}

/// An engine on the tiny checkpoint whose prompt cache takes these short
/// prompts, without the encoder cache (so that only the prompt cache can
/// skip the tower).
fn caching_engine(dir: &std::path::Path, disk: Option<&std::path::Path>) -> Engine {
    let mut cfg = EngineConfig::new(dir.join("model"));
    cfg.prompt_cache_min_tokens = 8;
    cfg.encoder_cache_bytes = 0;
    cfg.prompt_cache_dir = disk.map(std::path::Path::to_path_buf);
    Engine::new(cfg).unwrap()
}

fn one_and_other(all: &[MediaCase]) -> (&MediaCase, &MediaCase) {
    let (one, other) = (all.iter().find(|c| c.name == "one_png").unwrap(), all.iter().find(|c| c.name == "other_png").unwrap());
    assert_eq!(one.prompt, other.prompt, "the two cases differ only in their image");
    (one, other)
}

/// Prefix identity: the prompt cache keys media prompts by their images'
/// content, so the same image and text hit (all but the last token, no tower
/// run, the same tokens) and the same text with another image does not.
#[test]
fn prompt_cache_keys_media_prompts_by_image_content() {
    let dir = tiny_vlm();
    let e = caching_engine(&dir, None);
    let all = cases(&dir);
    let (one, other) = one_and_other(&all);
    let (t, cached, runs) = go(&e, one);
    assert_eq!((t.as_slice(), cached, runs), (one.tokens.as_slice(), 0, 1), "cold");
    let (t, cached, runs) = go(&e, one);
    assert_eq!((t.as_slice(), cached, runs), (one.tokens.as_slice(), one.prompt.len() - 1, 1), "same image and text: a hit, no tower run");
    let (t, cached, runs) = go(&e, other);
    assert_eq!((t.as_slice(), cached, runs), (other.tokens.as_slice(), 0, 2), "same text, another image: no hit");
}

/// The same from the disk tier: after a restart on the same prompt-cache
/// directory, the same text with another image misses, and the same image
/// and text hit without running the tower and give the same tokens.
#[test]
fn prompt_cache_disk_tier_keys_media_prompts_by_image_content() {
    let dir = tiny_vlm();
    let disk = std::env::temp_dir().join(format!("mlxrt-media-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&disk);
    let all = cases(&dir);
    let (one, other) = one_and_other(&all);
    {
        let e = caching_engine(&dir, Some(&disk));
        let (t, cached, runs) = go(&e, one);
        assert_eq!((t.as_slice(), cached, runs), (one.tokens.as_slice(), 0, 1), "cold");
        e.flush_prompt_cache().unwrap();
        assert!(wait_idle(&e).prompt_cache_disk_bytes > 0, "the entry is on disk");
    }
    let e = caching_engine(&dir, Some(&disk));
    let (t, cached, runs) = go(&e, other);
    assert_eq!((t.as_slice(), cached, runs), (other.tokens.as_slice(), 0, 1), "after a restart, another image: no hit");
    let (t, cached, runs) = go(&e, one);
    assert_eq!((t.as_slice(), cached, runs), (one.tokens.as_slice(), one.prompt.len() - 1, 1), "after a restart, the same image and text: a disk hit, no tower run");
    drop(e);
    let _ = std::fs::remove_dir_all(&disk);
}

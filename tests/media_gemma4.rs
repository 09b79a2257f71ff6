//! Gemma 4 image and audio prompts against mlx-vlm 0.7.10 (the oracle,
//! tests/oracle/make_tiny_gemma4_vlm.py): a tiny random-weight checkpoint
//! built with mlx-vlm's own classes (vision tower, Conformer audio tower,
//! projectors, text model); its processor's pixels, the WAV samples, the
//! feature extractor's log-mel frames, the towers' rows, and the logits and
//! greedy tokens of prompts with images, audio, and both.

mod common;

use common::media::*;
use common::*;
use mlxrt::engine::{Engine, EngineConfig, Event, RequestOptions};
use mlxrt::media::{self, parts::Buffer, Limits, MediaItem, MediaSpec};
use mlxrt::mlx::Array;
use mlxrt::model::{load, LoadOptions, LoadedModel, MediaInput};
use mlxrt::ErrorKind;
use serde_json::json;

/// Max |Δ| between mlxrt's and mlx-vlm's logits (f32 weights).
const LOGIT_TOL: f32 = 1e-3;
/// Max |Δ| of log-mel values: mlxrt's FFT runs in f64, numpy's in f32.
const MEL_TOL: f32 = 1e-4;

fn spec_of(m: &LoadedModel) -> &MediaSpec {
    m.text.media.as_ref().expect("the checkpoint's media spec")
}

fn files(dir: &std::path::Path, sub: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join(sub)).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

/// Pixels: equal to mlx-vlm's Gemma4ImageProcessor (patch-budget resize,
/// PIL's bicubic, rescale in f32, alpha dropped), bit for bit on PNG and
/// lossless WebP; JPEG within the decoders' differences (see tests/media.rs:
/// at most 16 levels, mean under 4).
#[test]
fn pixels_match_the_processor() {
    let dir = tiny_gemma4_vlm();
    let m = load(&dir.join("model"), &LoadOptions::default()).unwrap();
    let (proc, _) = spec_of(&m).image.as_ref().expect("an image processor");
    let mut r = reference(&dir);
    let images = files(&dir, "images");
    for path in &images {
        let name = path.file_stem().unwrap().to_str().unwrap();
        let it = proc.process(&media::decode(&std::fs::read(path).unwrap(), &Limits::default()).unwrap()).unwrap();
        let want = r.take(&format!("pixels.{name}")).unwrap();
        let shape: Vec<usize> = want.shape().iter().map(|&d| d as usize).collect();
        assert_eq!(it.shape, shape, "{name}: size (patch budget)");
        assert_eq!(it.tokens, shape[1] / 4 * (shape[2] / 4) / 4, "{name}: soft tokens");
        let want = want.to_vec_f32().unwrap();
        if path.extension().unwrap() == "jpg" {
            let diff: Vec<f32> = it.data.iter().zip(&want).map(|(a, b)| (a - b).abs()).collect();
            let (max, mean) = (diff.iter().cloned().fold(0f32, f32::max), diff.iter().sum::<f32>() / diff.len() as f32);
            eprintln!("{name}: JPEG pixels max |Δ| {max:.2e}, mean {mean:.2e}");
            assert!(max <= 16.0 / 255.0 + 1e-6 && mean <= 4.0 / 255.0, "{name}: JPEG pixels max |Δ| {max}, mean {mean}");
        } else {
            assert_eq!(it.data, want, "{name}: pixels not bit-equal to the processor's");
        }
    }
    assert!(images.len() >= 7);
}

/// WAV decoding (PCM 16-bit mono and stereo, float 32-bit) gives the
/// samples soundfile reads (channels averaged); the log-mel frames are the
/// feature extractor's within `MEL_TOL`, the same frames valid.
#[test]
fn wav_samples_and_log_mel_match_the_feature_extractor() {
    let dir = tiny_gemma4_vlm();
    let m = load(&dir.join("model"), &LoadOptions::default()).unwrap();
    let (proc, _) = spec_of(&m).audio.as_ref().expect("an audio processor");
    let mut r = reference(&dir);
    let clips = files(&dir, "audio");
    for path in &clips {
        let name = path.file_stem().unwrap().to_str().unwrap();
        let audio = media::decode_wav(&std::fs::read(path).unwrap(), &Limits::default()).unwrap();
        assert_eq!((audio.rate, audio.samples.clone()), (16000, r.take(&format!("wave.{name}")).unwrap().to_vec_f32().unwrap()), "{name}: samples");
        let it = proc.process(&audio).unwrap();
        let want = r.take(&format!("mel.{name}")).unwrap();
        assert_eq!(it.shape, vec![want.shape()[0] as usize, 128], "{name}: frames");
        let valid = r.take(&format!("mel_valid.{name}")).unwrap().to_vec_i32().unwrap().iter().filter(|&&v| v == 1).count();
        assert_eq!(it.valid, valid, "{name}: valid frames");
        let d = max_abs_diff(&it.data, &want.to_vec_f32().unwrap());
        eprintln!("{name}: {} frames, log-mel max |Δ| {d:.2e}", it.shape[0]);
        assert!(d <= MEL_TOL, "{name}: log-mel max |Δ| {d}");
        let ms = audio.samples.len() as f64 / 16.0;
        assert_eq!(it.tokens, (ms / 40.0).ceil() as usize, "{name}: soft tokens");
    }
    assert_eq!(clips.len(), 3);
}

fn item(m: &LoadedModel, path: &str) -> MediaItem {
    let spec = spec_of(m);
    let bytes = std::fs::read(path).unwrap();
    if path.ends_with(".wav") {
        spec.audio.as_ref().unwrap().0.process(&media::decode_wav(&bytes, &Limits::default()).unwrap()).unwrap()
    } else {
        spec.image.as_ref().unwrap().0.process(&media::decode(&bytes, &Limits::default()).unwrap()).unwrap()
    }
}

/// The model API: the towers' projected rows (in prompt order), then greedy
/// decoding with them spliced in (images attending both ways) against
/// mlx-vlm, for images, audio, and both in one prompt.
#[test]
fn gemma4_towers_and_logits_match_mlx_vlm() {
    let dir = tiny_gemma4_vlm();
    let m = load(&dir.join("model"), &LoadOptions::default()).unwrap();
    let spec = spec_of(&m);
    assert!(spec.bidirectional, "use_bidirectional_attention: vision");
    for c in cases(&dir) {
        let paths: Vec<String> = c.messages.as_array().unwrap().iter()
            .flat_map(|m| m["content"].as_array().unwrap().iter().filter_map(|p| p["path"].as_str().map(str::to_owned)))
            .collect();
        let items: Vec<MediaItem> = paths.iter().map(|p| item(&m, p)).collect();
        let placed = spec.place(&c.prompt, items).unwrap();
        let mut rows = vec![];
        for (it, span) in placed.items.iter().zip(&placed.spans) {
            let tower = m.towers.get(it.kind).expect("a tower for the kind");
            let e = tower.encode(&[it]).unwrap().pop().unwrap();
            rows.push((span.start, e.rows));
        }
        rows.sort_by_key(|r| r.0);
        let features = Array::concatenate(&rows.iter().map(|r| &r.1).collect::<Vec<_>>(), 0).unwrap();
        let d = max_abs_diff(&features.reshape(&[-1]).unwrap().to_vec_f32().unwrap(), &c.tower);
        assert!(d <= 1e-4, "{}: tower rows max |Δ| {d}", c.name);
        let mut at: Vec<usize> = placed.spans.iter().flat_map(|s| s.clone()).collect();
        at.sort();
        let media = MediaInput { features, at, zero: vec![], deepstack: vec![], mrope: None, blocks: placed.blocks.clone() };
        let (tokens, worst) = greedy_media(&m, &c, &media);
        eprintln!("{}: tower max |Δ| {d:.2e}; logits max |Δ| {worst:.2e}", c.name);
        assert_eq!(tokens, c.tokens, "{}: greedy tokens differ from mlx-vlm", c.name);
        assert!(worst <= LOGIT_TOL, "{}: logits max |Δ| {worst} > {LOGIT_TOL}", c.name);
    }
}

#[test]
fn engine_image_and_audio_prompts_alone_and_batched_with_text() {
    check_engine(&tiny_gemma4_vlm(), 256 << 20);
}

#[test]
fn engine_without_encoder_cache() {
    check_engine(&tiny_gemma4_vlm(), 0);
}

#[test]
fn prompt_cache_keys_media_prompts_by_image_content() {
    check_prefix_identity(&tiny_gemma4_vlm());
}

/// The same clip as a path, as base64 data, as OpenAI's `input_audio` and
/// as an f32 sample buffer gives the same tokens (and one tower run: the
/// encoder cache keys the samples); bad audio is INVALID_ARGUMENT or
/// UNSUPPORTED naming the part, and the engine keeps serving.
#[test]
fn audio_inputs_and_errors() {
    let dir = tiny_gemma4_vlm();
    let all = cases(&dir);
    let c = all.iter().find(|c| c.name == "one_wav").unwrap();
    let e = Engine::new(EngineConfig::new(dir.join("model"))).unwrap();
    let path = c.messages[0]["content"][0]["path"].as_str().unwrap().to_owned();
    let bytes = std::fs::read(&path).unwrap();
    let b64 = base64(&bytes);
    let with = |part: serde_json::Value, media: Vec<Buffer>| {
        let mut o = request(json!([{"role": "user", "content": [part, {"type": "text", "text": "What is this sound?"}]}]), c.tokens.len() as u32);
        o.media = media;
        o
    };
    let tokens = |o: RequestOptions| {
        let ev = run(&e, o);
        assert!(matches!(ev.last(), Some(Event::Done { .. })), "{ev:?}");
        tokens_of(&ev)
    };
    assert_eq!(tokens(with(json!({"type": "audio", "path": path}), vec![])), c.tokens, "path");
    assert_eq!(tokens(with(json!({"type": "audio", "data": b64}), vec![])), c.tokens, "base64");
    assert_eq!(tokens(with(json!({"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}}), vec![])), c.tokens, "input_audio");
    let samples = media::decode_wav(&bytes, &Limits::default()).unwrap();
    assert_eq!(tokens(with(json!({"type": "audio", "media": 0}), vec![Buffer::Audio(samples.clone())])), c.tokens, "f32 samples");
    assert_eq!(wait_idle(&e).tower_runs, 1, "one clip, one tower run");
    let cases: Vec<(serde_json::Value, Vec<Buffer>, ErrorKind, &str)> = vec![
        (json!({"type": "audio", "data": base64(&bytes[..30])}), vec![], ErrorKind::InvalidArgument, "WAV"),
        (json!({"type": "audio", "data": base64(b"not a wav at all")}), vec![], ErrorKind::InvalidArgument, "not a WAV"),
        (json!({"type": "input_audio", "input_audio": {"data": b64, "format": "mp3"}}), vec![], ErrorKind::Unsupported, "mp3"),
        (json!({"type": "audio", "media": 0}), vec![Buffer::Audio(media::Audio { samples: samples.samples.clone(), rate: 44100 })], ErrorKind::Unsupported, "44100 Hz"),
        (json!({"type": "audio"}), vec![], ErrorKind::InvalidArgument, "needs `path`"),
    ];
    for (part, media, kind, says) in cases {
        let err = e.prepare(with(part, media)).err().unwrap_or_else(|| panic!("{says}: accepted"));
        assert_eq!(err.kind, kind, "{says}: {err}");
        assert!(err.message.contains("messages[0].content[0]") && err.message.contains(says), "{says}: {err}");
    }
    assert_eq!(tokens(with(json!({"type": "audio", "path": path}), vec![])), c.tokens, "still serving");
    // A model without an audio tower refuses audio parts.
    let g3 = Engine::new(EngineConfig::new(tiny_vlm().join("model"))).unwrap();
    let err = g3.prepare(with(json!({"type": "audio", "path": path}), vec![])).err().expect("unsupported");
    assert_eq!(err.kind, ErrorKind::Unsupported, "{err}");
    assert!(err.message.contains("audio tower"), "{err}");
}

fn base64(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The C ABI (tests/c/test_media_audio.c): the same clip as a path, as
/// encoded WAV bytes and as `MLXRT_AUDIO_F32` samples gives the same tokens
/// with one tower run; bad entries are INVALID_ARGUMENT naming the entry.
#[test]
fn c_abi_audio_buffers() {
    let dir = tiny_gemma4_vlm();
    let (wav, raw) = tiny_gemma4_clip(&dir);
    let bin = compile_c("test_media_audio", "test_media_audio", &[]);
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg(dir.join("model")).arg(&wav).arg(&raw);
    let out = this_library(&mut cmd).output().unwrap();
    assert!(out.status.success(), "test_media_audio failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn prompt_cache_disk_tier_keys_media_prompts_by_image_content() {
    check_prefix_identity_on_disk(&tiny_gemma4_vlm());
}

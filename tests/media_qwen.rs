//! Qwen3-VL image prompts against mlx-vlm 0.7.10 (the oracle,
//! tests/oracle/make_tiny_qwen_vl.py): a tiny random-weight checkpoint built
//! with mlx-vlm's own classes; its processor's patch rows, the tower's merger
//! and deepstack outputs, the multimodal RoPE positions and rope delta, and
//! the logits and greedy tokens of prompts with images.

mod common;

use common::media::*;
use common::*;
use mlxrt::engine::{Engine, EngineConfig};
use mlxrt::media::{self, Limits, MediaItem, MediaSpec};
use mlxrt::mlx::Array;
use mlxrt::model::{load, LoadOptions, MediaInput};
use serde_json::json;

/// Max |Δ| between mlxrt's and mlx-vlm's logits (f32 weights).
const LOGIT_TOL: f32 = 1e-3;

fn spec_of(m: &mlxrt::model::LoadedModel) -> &MediaSpec {
    m.text.media.as_ref().expect("the checkpoint's media spec")
}

/// Patch rows: equal to mlx-vlm's Qwen3VLImageProcessor (smart_resize with
/// min/max pixels, PIL's bicubic resize, rescale and normalize in f32,
/// patchify), grids included. PNG and lossless WebP: bit-equal (Pillow's
/// fixed-point bicubic resampler reimplemented). JPEG: the decoders differ
/// (see tests/media.rs); asserted: at most 8 levels, mean under 2 levels.
#[test]
fn patch_rows_match_the_processor() {
    let dir = tiny_qwen_vl();
    let m = load(&dir.join("model"), &LoadOptions::default()).unwrap();
    let (proc, _) = spec_of(&m).image.as_ref().expect("an image processor");
    let mut r = reference(&dir);
    let mut seen = 0;
    for entry in std::fs::read_dir(dir.join("images")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let img = media::decode(&std::fs::read(&path).unwrap(), &Limits::default()).unwrap();
        let it = proc.process(&img).unwrap();
        let grid: Vec<usize> = r.take(&format!("grid.{name}")).unwrap().to_vec_i32().unwrap().iter().map(|&g| g as usize).collect();
        assert_eq!(it.grid.to_vec(), grid, "{name}: grid (smart_resize)");
        let want = r.take(&format!("pixels.{name}")).unwrap().to_vec_f32().unwrap();
        assert_eq!(it.data.len(), want.len(), "{name}: patch rows");
        assert_eq!(it.tokens, grid.iter().product::<usize>() / 4, "{name}: soft tokens");
        let diff: Vec<f32> = it.data.iter().zip(&want).map(|(a, b)| (a - b).abs()).collect();
        let max = diff.iter().cloned().fold(0f32, f32::max);
        let mean = diff.iter().sum::<f32>() / diff.len() as f32;
        eprintln!("{name}: grid {grid:?}, patch rows max |Δ| {max:.2e}, mean {mean:.2e}");
        if path.extension().unwrap() == "jpg" {
            assert!(max <= 16.0 / 255.0 + 1e-6, "{name}: JPEG patch rows max |Δ| {max}");
            assert!(mean <= 4.0 / 255.0, "{name}: JPEG patch rows mean |Δ| {mean}");
        } else {
            assert_eq!(max, 0.0, "{name}: PNG/WebP patch rows not bit-equal to the processor's");
        }
        seen += 1;
    }
    assert!(seen >= 7, "expected the oracle's 7 test images, found {seen}");
}

fn items(m: &mlxrt::model::LoadedModel, files: &[String]) -> Vec<MediaItem> {
    let (proc, _) = spec_of(m).image.as_ref().unwrap();
    files.iter().map(|f| proc.process(&media::decode(&std::fs::read(f).unwrap(), &Limits::default()).unwrap()).unwrap()).collect()
}

fn files_of(c: &MediaCase) -> Vec<String> {
    c.messages.as_array().unwrap().iter().flat_map(|m| m["content"].as_array().unwrap().iter().filter_map(|p| p["path"].as_str().map(str::to_owned))).collect()
}

/// The model API: the tower (merger and deepstack rows), the prompt's
/// multimodal positions and delta, and greedy decoding (the prompt in one
/// forward, then one token per step at cache offset + delta) against mlx-vlm.
#[test]
fn qwen3_vl_tower_positions_and_logits_match_mlx_vlm() {
    let dir = tiny_qwen_vl();
    let m = load(&dir.join("model"), &LoadOptions::default()).unwrap();
    let tower = m.towers.image.as_ref().expect("the checkpoint's vision tower is built");
    let spec = spec_of(&m);
    let mut r = reference(&dir);
    for c in cases(&dir) {
        let items = items(&m, &files_of(&c));
        let enc = tower.encode(&items.iter().collect::<Vec<_>>()).unwrap();
        let cat = |f: &dyn Fn(&mlxrt::model::Encoded) -> &Array| Array::concatenate(&enc.iter().map(f).collect::<Vec<_>>(), 0).unwrap();
        let rows = cat(&|e| &e.rows);
        let d = max_abs_diff(&rows.reshape(&[-1]).unwrap().to_vec_f32().unwrap(), &c.tower);
        assert!(d <= 1e-4, "{}: merger output max |Δ| {d}", c.name);
        let layers = enc[0].deepstack.len();
        assert_eq!(layers, 2, "deepstack layers");
        let deep: Vec<Array> = (0..layers).map(|i| cat(&|e| &e.deepstack[i])).collect();
        let want = r.take(&format!("{}.deepstack", c.name)).unwrap().to_vec_f32().unwrap();
        let ours: Vec<f32> = deep.iter().flat_map(|a| a.reshape(&[-1]).unwrap().to_vec_f32().unwrap()).collect();
        let dd = max_abs_diff(&ours, &want);
        assert!(dd <= 1e-4, "{}: deepstack max |Δ| {dd}", c.name);

        let placed = spec.place(&c.prompt, items).unwrap();
        let (pos, delta) = placed.mrope.clone().expect("multimodal positions");
        let want_pos = r.take(&format!("{}.positions", c.name)).unwrap().to_vec_i32().unwrap();
        let l = c.prompt.len();
        let ours_pos: Vec<i32> = (0..3).flat_map(|a| pos.iter().map(move |p| p[a])).collect();
        assert_eq!(ours_pos.len(), 3 * l);
        assert_eq!(ours_pos, want_pos, "{}: mRoPE positions", c.name);
        let want_delta = r.take(&format!("{}.delta", c.name)).unwrap().to_vec_i32().unwrap();
        assert_eq!(vec![delta], want_delta, "{}: rope delta", c.name);

        let at: Vec<usize> = placed.spans.iter().flat_map(|s| s.clone()).collect();
        let media = MediaInput { features: rows, at, zero: vec![], deepstack: deep, mrope: Some((pos, delta)), blocks: vec![] };
        let (tokens, worst) = greedy_media(&m, &c, &media);
        eprintln!("{}: merger max |Δ| {d:.2e}, deepstack {dd:.2e}; delta {delta}; logits max |Δ| {worst:.2e}", c.name);
        assert_eq!(tokens, c.tokens, "{}: greedy tokens differ from mlx-vlm", c.name);
        assert!(worst <= LOGIT_TOL, "{}: logits max |Δ| {worst} > {LOGIT_TOL}", c.name);
    }
}

#[test]
fn engine_image_prompts_alone_and_batched_with_text() {
    check_engine(&tiny_qwen_vl(), 256 << 20);
}

#[test]
fn engine_without_encoder_cache() {
    check_engine(&tiny_qwen_vl(), 0);
}

/// Rows with different rope deltas (two image prompts and a text row)
/// decode in one batch, each giving its solo tokens.
#[test]
fn rows_with_different_rope_deltas_decode_together() {
    let dir = tiny_qwen_vl();
    let mut cfg = EngineConfig::new(dir.join("model"));
    cfg.max_rows = 4;
    let e = Engine::new(cfg).unwrap();
    let all = cases(&dir);
    let text = request(json!([{"role": "user", "content": "Tell me a long story about a cat."}]), 24);
    let solo = tokens_of(&run(&e, text.clone()));
    let long = |c: &MediaCase| request(c.messages.clone(), 24);
    let solos: Vec<Vec<u32>> = all.iter().map(|c| tokens_of(&run(&e, long(c)))).collect();
    for (c, s) in all.iter().zip(&solos) {
        assert_eq!(s[..c.tokens.len()], c.tokens[..], "{}: mlx-vlm's tokens first", c.name);
    }
    let rx_t = submit(&e, text);
    let rxs: Vec<_> = all.iter().map(|c| submit(&e, long(c))).collect();
    for ((rx, s), c) in rxs.iter().zip(&solos).zip(&all) {
        assert_eq!(&tokens_of(&collect(rx)), s, "{}: batched with other deltas", c.name);
    }
    assert_eq!(tokens_of(&collect(&rx_t)), solo, "text row batched with image rows");
}

#[test]
fn prompt_cache_keys_media_prompts_by_image_content() {
    check_prefix_identity(&tiny_qwen_vl());
}

#[test]
fn prompt_cache_disk_tier_keys_media_prompts_by_image_content() {
    check_prefix_identity_on_disk(&tiny_qwen_vl());
}

/// An image whose aspect ratio is over 200 is INVALID_ARGUMENT (Qwen's
/// processor refuses it), naming the part; the engine keeps serving.
#[test]
fn extreme_aspect_ratio_is_invalid_argument() {
    let dir = tiny_qwen_vl();
    let e = Engine::new(EngineConfig::new(dir.join("model"))).unwrap();
    let thin = image::RgbImage::from_pixel(402, 2, image::Rgb([9, 9, 9]));
    let mut png = Vec::new();
    thin.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
    let path = std::env::temp_dir().join(format!("mlxrt-thin-{}.png", std::process::id()));
    std::fs::write(&path, &png).unwrap();
    let msg = json!([{"role": "user", "content": [{"type": "image", "path": path}, {"type": "text", "text": "?"}]}]);
    let err = e.prepare(request(msg, 4)).err().expect("refused");
    let _ = std::fs::remove_file(&path);
    assert_eq!(err.kind, mlxrt::ErrorKind::InvalidArgument, "{err}");
    assert!(err.message.contains("messages[0].content[0]") && err.message.contains("aspect ratio"), "{err}");
    let c = &cases(&dir)[0];
    assert_eq!(tokens_of(&run(&e, request(c.messages.clone(), c.tokens.len() as u32))), c.tokens);
}

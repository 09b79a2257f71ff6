//! The checkpoint's image processor (`preprocessor_config.json`), as the
//! Python processor that mlx-vlm uses computes it: how the picture is sized
//! (`Resize`), resampled with Pillow's filter (`resize`), rescaled and
//! normalized in f32, and laid out for the tower (`Layout`).
//! - Gemma 3 (transformers' PIL image processor): a fixed size, bilinear,
//!   transparency composited onto white, `x * rescale_factor` in f64 then
//!   f32, channels first.
//! - Qwen3-VL (mlx-vlm's numpy `Qwen3VLImageProcessor`): `smart_resize` to
//!   multiples of patch × merge within min/max pixels, bicubic, alpha
//!   dropped, f32 arithmetic, patch rows with the frame repeated over the
//!   temporal axis.
//! - Gemma 4 (mlx-vlm's `Gemma4ImageProcessor`): the aspect ratio kept
//!   within a patch budget, sides multiples of patch × pool, bicubic, alpha
//!   dropped, rescaled in f32 (normalized only if configured), channels
//!   first.

use super::decode::Rgb;
use super::resize::{resize_rgb8, Filter};
use super::{MediaItem, MediaKind};
use crate::{Error, Result};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::Path;

/// How the processor sizes a picture.
#[derive(Debug, Clone, PartialEq)]
pub enum Resize {
    /// Always `(height, width)`.
    Fixed(usize, usize),
    /// Qwen's `smart_resize`: each side rounded to a multiple of `factor`,
    /// the area then scaled into `min_pixels..=max_pixels`.
    Smart { factor: usize, min_pixels: u64, max_pixels: u64 },
    /// Gemma 4: the largest size with the picture's aspect ratio whose sides
    /// are multiples of `patch × pool` and that has at most `max_patches`
    /// patches.
    Budget { patch: usize, pool: usize, max_patches: usize },
}

/// How the processed pixels are laid out for the tower.
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// `[3, height, width]`.
    ChannelsFirst,
    /// `[3, height, width]` with its patch grid; one soft token per
    /// `pool × pool` patches (Gemma 4).
    PatchGrid { patch: usize, pool: usize },
    /// Qwen-VL's patch rows `[t·h·w, 3 · temporal · patch²]`: patches in
    /// merge-group order `(h / merge, w / merge, merge, merge)`, each row
    /// `(channel, frame, y, x)` with the picture as `temporal` frames.
    Patches { patch: usize, temporal: usize, merge: usize },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessor {
    pub resize: Resize,
    pub filter: Filter,
    /// Transparency is composited onto white (transformers'
    /// `convert_to_rgb`); else the alpha plane is dropped (PIL's
    /// `convert("RGB")`).
    pub over_white: bool,
    pub rescale: Option<f64>,
    /// The rescale multiplies in f64, then rounds to f32 (transformers'
    /// `rescale`); else in f32 (numpy's float32 arrays).
    pub rescale_f64: bool,
    pub mean_std: Option<([f32; 3], [f32; 3])>,
    pub layout: Layout,
    /// Soft tokens of a fixed-size image (the model's `mm_tokens_per_image`).
    pub tokens: usize,
}

fn triple(v: &Value, key: &str) -> Result<[f32; 3]> {
    let bad = || Error::model(format!("preprocessor_config.json: {key} must be 3 numbers"));
    let a = v.get(key).and_then(Value::as_array).ok_or_else(bad)?;
    if a.len() != 3 {
        return Err(bad());
    }
    let mut out = [0f32; 3];
    for (o, x) in out.iter_mut().zip(a) {
        *o = x.as_f64().ok_or_else(bad)? as f32;
    }
    Ok(out)
}

/// `dir/preprocessor_config.json`; `None` when the folder has none.
pub fn read_config(dir: &Path) -> Result<Option<Value>> {
    let path = dir.join("preprocessor_config.json");
    if !path.exists() {
        return Ok(None);
    }
    let v = serde_json::from_str(&std::fs::read_to_string(&path)?).map_err(|e| Error::model(format!("{}: {e}", path.display())))?;
    Ok(Some(v))
}

impl ImageProcessor {
    /// Gemma 3's processor from `dir/preprocessor_config.json`; `None` when
    /// the folder has none.
    pub fn load(dir: &Path) -> Result<Option<ImageProcessor>> {
        read_config(dir)?.map(|v| ImageProcessor::from_json(&v)).transpose()
    }

    /// Gemma 3's fixed-size processor (transformers' PIL backend).
    pub fn from_json(v: &Value) -> Result<ImageProcessor> {
        let flag = |k: &str, default: bool| v.get(k).and_then(Value::as_bool).unwrap_or(default);
        if flag("do_pan_and_scan", false) {
            return Err(Error::unsupported("preprocessor_config.json: do_pan_and_scan is not supported yet"));
        }
        if !flag("do_resize", true) {
            return Err(Error::unsupported("preprocessor_config.json: do_resize false is not supported"));
        }
        let size = v.get("size").ok_or_else(|| Error::model("preprocessor_config.json: no size"))?;
        let dim = |k: &str| size.get(k).and_then(Value::as_u64).filter(|&n| n > 0 && n <= 8192);
        let (Some(h), Some(w)) = (dim("height"), dim("width")) else {
            return Err(Error::unsupported("preprocessor_config.json: only a fixed size {height, width} is supported"));
        };
        let mut p = ImageProcessor::common(v, 2, true, true)?;
        p.resize = Resize::Fixed(h as usize, w as usize);
        p.over_white = true;
        p.rescale_f64 = true;
        p.tokens = v.get("image_seq_length").and_then(Value::as_u64).unwrap_or(256) as usize;
        Ok(p)
    }

    /// Qwen3-VL's processor from `dir`'s preprocessor_config.json (and
    /// processor_config.json's `image_processor`), with mlx-vlm's defaults:
    /// patch 16, temporal 2, merge 2, `size.shortest_edge`/`min_pixels`
    /// 56², `size.longest_edge`/`max_pixels` 14² · 4 · 1280.
    pub fn qwen_vl(dir: &Path) -> Result<ImageProcessor> {
        let mut v = read_config(dir)?.unwrap_or_else(|| Value::Object(Default::default()));
        let overrides = std::fs::read_to_string(dir.join("processor_config.json"))
            .ok()
            .and_then(|s| serde_json::from_str::<Value>(&s).ok())
            .and_then(|c| c.get("image_processor").cloned());
        if let (Some(o), Some(Value::Object(extra))) = (v.as_object_mut(), overrides) {
            o.extend(extra);
        }
        ImageProcessor::qwen_vl_from(&v)
    }

    /// `qwen_vl` from the merged settings.
    pub fn qwen_vl_from(v: &Value) -> Result<ImageProcessor> {
        let num = |k: &str| v.get(k).and_then(Value::as_u64);
        let size = |k: &str| v.get("size").and_then(|s| s.get(k)).and_then(Value::as_u64);
        let patch = num("patch_size").unwrap_or(16) as usize;
        let temporal = num("temporal_patch_size").unwrap_or(2) as usize;
        let merge = num("merge_size").unwrap_or(2) as usize;
        let min_pixels = num("min_pixels").or(size("shortest_edge")).unwrap_or(56 * 56);
        let max_pixels = num("max_pixels").or(size("longest_edge")).unwrap_or(14 * 14 * 4 * 1280);
        if !(1..=1024).contains(&patch) || !(1..=16).contains(&temporal) || !(1..=16).contains(&merge) || min_pixels > max_pixels {
            return Err(Error::model("preprocessor_config.json: patch, temporal, merge sizes or min/max pixels out of range"));
        }
        // mlx-vlm's numpy processor always resamples bicubic.
        let mut p = ImageProcessor::common(v, 3, true, false)?;
        p.filter = Filter::Bicubic;
        p.resize = Resize::Smart { factor: patch * merge, min_pixels, max_pixels };
        p.layout = Layout::Patches { patch, temporal, merge };
        Ok(p)
    }

    /// Gemma 4's image processor from its settings (processor_config.json's
    /// `image_processor`, or a flat preprocessor_config.json), with
    /// mlx-vlm's defaults: patch 16, 280 soft tokens, pool 3, no
    /// normalization.
    pub fn gemma4(v: &Value) -> Result<ImageProcessor> {
        let num = |k: &str, default: u64| v.get(k).and_then(Value::as_u64).unwrap_or(default) as usize;
        let (patch, tokens, pool) = (num("patch_size", 16), num("max_soft_tokens", 280), num("pooling_kernel_size", 3));
        if !(1..=1024).contains(&patch) || !(1..=16).contains(&pool) || !(1..=65536).contains(&tokens) {
            return Err(Error::model("processor config: Gemma 4 patch_size, max_soft_tokens or pooling_kernel_size out of range"));
        }
        if !v.get("do_resize").and_then(Value::as_bool).unwrap_or(true) {
            return Err(Error::unsupported("processor config: do_resize false is not supported"));
        }
        let mut p = ImageProcessor::common(v, 3, false, false)?;
        p.filter = Filter::Bicubic;
        p.resize = Resize::Budget { patch, pool, max_patches: tokens * pool * pool };
        p.layout = Layout::PatchGrid { patch, pool };
        Ok(p)
    }

    /// The fields every processor reads: `resample` (default
    /// `resample_default`), `do_rescale` + `rescale_factor`, `do_normalize`
    /// (default `normalize_default`) + `image_mean` / `image_std` (default
    /// 0.5 each when `mean_required` is false).
    fn common(v: &Value, resample_default: i64, normalize_default: bool, mean_required: bool) -> Result<ImageProcessor> {
        let flag = |k: &str, default: bool| v.get(k).and_then(Value::as_bool).unwrap_or(default);
        let code = v.get("resample").and_then(Value::as_i64).unwrap_or(resample_default);
        let filter = Filter::from_pil(code)
            .ok_or_else(|| Error::unsupported(format!("preprocessor_config.json: resample {code} is not supported")))?;
        let rescale = flag("do_rescale", true).then(|| v.get("rescale_factor").and_then(Value::as_f64).unwrap_or(1.0 / 255.0));
        let mean_std = if flag("do_normalize", normalize_default) {
            let half = ([0.5; 3], [0.5; 3]);
            match (v.get("image_mean"), v.get("image_std")) {
                (None, None) if !mean_required => Some(half),
                _ => Some((triple(v, "image_mean")?, triple(v, "image_std")?)),
            }
        } else {
            None
        };
        Ok(ImageProcessor {
            resize: Resize::Fixed(0, 0),
            filter,
            over_white: false,
            rescale,
            rescale_f64: false,
            mean_std,
            layout: Layout::ChannelsFirst,
            tokens: 0,
        })
    }

    /// The parameters in a canonical form (part of every content hash).
    fn identity(&self) -> String {
        format!("{:?}", self)
    }

    /// The output size `(height, width)` for a `w`×`h` picture.
    fn target(&self, w: usize, h: usize) -> Result<(usize, usize)> {
        match self.resize {
            Resize::Fixed(h, w) => Ok((h, w)),
            Resize::Smart { factor, min_pixels, max_pixels } => smart_resize(h, w, factor, min_pixels, max_pixels),
            Resize::Budget { patch, pool, max_patches } => patch_budget(h, w, patch, pool, max_patches),
        }
    }

    /// Resizes, rescales, normalizes and lays out `img` for the tower.
    pub fn process(&self, img: &Rgb) -> Result<MediaItem> {
        let (oh, ow) = self.target(img.width, img.height)?;
        let rgb = if self.over_white { img.over_white() } else { std::borrow::Cow::Borrowed(&img.data[..]) };
        let px = resize_rgb8(&rgb, img.width, img.height, ow, oh, self.filter);
        let plane = oh * ow;
        let mut chw = vec![0f32; 3 * plane];
        for (i, p) in px.chunks_exact(3).enumerate() {
            for c in 0..3 {
                let mut x = match self.rescale {
                    Some(s) if self.rescale_f64 => (p[c] as f64 * s) as f32,
                    Some(s) => p[c] as f32 * s as f32,
                    None => p[c] as f32,
                };
                if let Some((mean, std)) = &self.mean_std {
                    x = (x - mean[c]) / std[c];
                }
                chw[c * plane + i] = x;
            }
        }
        let hash = content_hash(&self.identity(), img);
        let (data, shape, grid, tokens) = match self.layout {
            Layout::ChannelsFirst => (chw, vec![3, oh, ow], [1, oh, ow], self.tokens),
            Layout::Patches { patch, temporal, merge } => {
                let (gh, gw) = (oh / patch, ow / patch);
                let data = patch_rows(&chw, oh, ow, patch, temporal, merge);
                (data, vec![gh * gw, 3 * temporal * patch * patch], [1, gh, gw], gh * gw / (merge * merge))
            }
            Layout::PatchGrid { patch, pool } => {
                let (gh, gw) = (oh / patch, ow / patch);
                (chw, vec![3, oh, ow], [1, gh, gw], gh * gw / (pool * pool))
            }
        };
        let valid = shape[0];
        Ok(MediaItem { kind: MediaKind::Image, data, shape, grid, valid, tokens, hash })
    }
}

/// Qwen's `smart_resize` (mlx-vlm's port of transformers' qwen2_vl one):
/// sides rounded to multiples of `factor` (half to even, as Python's
/// `round`), then, if the area is over `max_pixels`, both scaled down by
/// `√(h w / max_pixels)` and floored to `factor`; if under `min_pixels`,
/// scaled up and ceiled.
fn smart_resize(h: usize, w: usize, factor: usize, min_pixels: u64, max_pixels: u64) -> Result<(usize, usize)> {
    let (hf, wf, f) = (h as f64, w as f64, factor as f64);
    if hf.max(wf) / hf.min(wf) > 200.0 {
        return Err(Error::invalid(format!("image is {w}x{h}: its aspect ratio is over 200")));
    }
    let (mut hb, mut wb) = ((hf / f).round_ties_even() * f, (wf / f).round_ties_even() * f);
    if hb * wb > max_pixels as f64 {
        let beta = (hf * wf / max_pixels as f64).sqrt();
        hb = f.max((hf / beta / f).floor() * f);
        wb = f.max((wf / beta / f).floor() * f);
    } else if hb * wb < min_pixels as f64 {
        let beta = (min_pixels as f64 / (hf * wf)).sqrt();
        hb = (hf * beta / f).ceil() * f;
        wb = (wf * beta / f).ceil() * f;
    }
    if hb < f || wb < f || hb * wb > 1e9 {
        return Err(Error::invalid(format!("image is {w}x{h}: it resizes to {wb}x{hb} pixels")));
    }
    Ok((hb as usize, wb as usize))
}

/// Gemma 4's `get_aspect_ratio_preserving_size`: both sides scaled by
/// `√(max_patches · patch² / (h w))` and floored to multiples of
/// `patch × pool`; a side that floors to 0 becomes one multiple, the other
/// then `⌊long / short⌋` multiples, at most the budget's side.
fn patch_budget(h: usize, w: usize, patch: usize, pool: usize, max_patches: usize) -> Result<(usize, usize)> {
    let factor = ((max_patches * patch * patch) as f64 / (h as f64 * w as f64)).sqrt();
    let side = pool * patch;
    let mut th = (factor * h as f64 / side as f64).floor() as usize * side;
    let mut tw = (factor * w as f64 / side as f64).floor() as usize * side;
    let max_side = (max_patches / (pool * pool)) * side;
    if th == 0 && tw == 0 {
        return Err(Error::invalid(format!("image is {w}x{h}: it resizes to 0x0 pixels")));
    }
    if th == 0 {
        th = side;
        tw = ((w as f64 / h as f64).floor() as usize * side).min(max_side);
    } else if tw == 0 {
        tw = side;
        th = ((h as f64 / w as f64).floor() as usize * side).min(max_side);
    }
    if th == 0 || tw == 0 {
        return Err(Error::invalid(format!("image is {w}x{h}: it resizes to {tw}x{th} pixels")));
    }
    Ok((th, tw))
}

/// `chw` (`[3, h, w]`) as Qwen-VL's patch rows (see `Layout::Patches`).
fn patch_rows(chw: &[f32], h: usize, w: usize, p: usize, temporal: usize, m: usize) -> Vec<f32> {
    let (gh, gw) = (h / p, w / p);
    let mut out = Vec::with_capacity(3 * h * w * temporal);
    for bh in 0..gh / m {
        for bw in 0..gw / m {
            for ih in 0..m {
                for iw in 0..m {
                    let (y0, x0) = ((bh * m + ih) * p, (bw * m + iw) * p);
                    for c in 0..3 {
                        for _ in 0..temporal {
                            for y in y0..y0 + p {
                                out.extend_from_slice(&chw[(c * h + y) * w + x0..(c * h + y) * w + x0 + p]);
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// SHA-256 of the processing parameters and the decoded pixels (so a BGRA
/// buffer and the same picture as a PNG share one hash).
pub fn content_hash(params: &str, img: &Rgb) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"mlxrt-image-v1\0");
    h.update(params.as_bytes());
    h.update((img.width as u64).to_le_bytes());
    h.update((img.height as u64).to_le_bytes());
    h.update(&img.data);
    if let Some(a) = &img.alpha {
        h.update(b"alpha");
        h.update(a);
    }
    h.finalize().into()
}

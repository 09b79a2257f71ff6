//! The checkpoint's image processor (`preprocessor_config.json`), as the
//! Python processor that mlx-vlm uses computes it: Gemma 3's fixed-size
//! processor (resize with Pillow's filter, `x * rescale_factor` in f64 then
//! f32, `(x - mean) / std` in f32, channels first).

use super::decode::Rgb;
use super::resize::{resize_rgb8, Filter};
use crate::{Error, Result};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessor {
    /// Output height and width.
    pub size: (usize, usize),
    pub filter: Filter,
    pub rescale: Option<f64>,
    pub mean_std: Option<([f32; 3], [f32; 3])>,
}

/// A processed image: `[3, height, width]` f32, and the content hash of the
/// decoded pixels with the processing parameters (the encoder cache's and
/// the prompt cache's key).
#[derive(Debug, Clone)]
pub struct PixelTensor {
    pub data: Vec<f32>,
    pub height: usize,
    pub width: usize,
    pub hash: [u8; 32],
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

impl ImageProcessor {
    /// Reads `dir/preprocessor_config.json`; `None` when the folder has none.
    pub fn load(dir: &Path) -> Result<Option<ImageProcessor>> {
        let path = dir.join("preprocessor_config.json");
        if !path.exists() {
            return Ok(None);
        }
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .map_err(|e| Error::model(format!("{}: {e}", path.display())))?;
        ImageProcessor::from_json(&v).map(Some)
    }

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
        let code = v.get("resample").and_then(Value::as_i64).unwrap_or(2);
        let filter = Filter::from_pil(code)
            .ok_or_else(|| Error::unsupported(format!("preprocessor_config.json: resample {code} is not supported")))?;
        let rescale = if flag("do_rescale", true) {
            Some(v.get("rescale_factor").and_then(Value::as_f64).unwrap_or(1.0 / 255.0))
        } else {
            None
        };
        let mean_std = if flag("do_normalize", true) {
            Some((triple(v, "image_mean")?, triple(v, "image_std")?))
        } else {
            None
        };
        Ok(ImageProcessor { size: (h as usize, w as usize), filter, rescale, mean_std })
    }

    /// The parameters in a canonical form (part of every content hash).
    fn identity(&self) -> String {
        format!("{:?}", self)
    }

    pub fn process(&self, img: &Rgb) -> PixelTensor {
        let (oh, ow) = self.size;
        let px = resize_rgb8(&img.data, img.width, img.height, ow, oh, self.filter);
        let plane = oh * ow;
        let mut data = vec![0f32; 3 * plane];
        for (i, p) in px.chunks_exact(3).enumerate() {
            for c in 0..3 {
                let mut x = match self.rescale {
                    Some(s) => (p[c] as f64 * s) as f32,
                    None => p[c] as f32,
                };
                if let Some((mean, std)) = &self.mean_std {
                    x = (x - mean[c]) / std[c];
                }
                data[c * plane + i] = x;
            }
        }
        PixelTensor { data, height: oh, width: ow, hash: content_hash(&self.identity(), img) }
    }
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
    h.finalize().into()
}

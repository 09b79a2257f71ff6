//! Gemma 3's vision tower: a SigLIP encoder (patch embedding, learned
//! positions, pre-LayerNorm blocks of full attention and a tanh-GELU MLP, a
//! final LayerNorm) and the multimodal projector (average pooling of the patch
//! grid to `mm_tokens_per_image` tokens, a `(1 + w)` RMSNorm, a matmul into
//! the language model's width), op for op as mlx-vlm's gemma3 (vision.py,
//! gemma3.py). Tensor names are the checkpoint's (`vision_tower.vision_model.…`,
//! `multi_modal_projector.…`).

use super::layers::{gelu_tanh, LayerNorm, Linear, RmsNorm};
use super::media::{Encoded, Tower};
use super::weights::Weights;
use crate::error::{Error, Result};
use crate::media::MediaItem;
use crate::mlx::fast::{self, Mask};
use crate::mlx::Array;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
struct VisionConfig {
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    patch_size: i32,
    #[serde(default = "default_image_size")]
    image_size: i32,
    #[serde(default = "default_eps")]
    layer_norm_eps: f32,
}

fn default_image_size() -> i32 {
    224
}
fn default_eps() -> f32 {
    1e-6
}

struct Block {
    ln1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// The tower and projector of one checkpoint.
pub struct Gemma3Vision {
    patch_w: Array,
    patch_b: Array,
    positions: Array,
    blocks: Vec<Block>,
    post_ln: LayerNorm,
    soft_norm: RmsNorm,
    projection: Array,
    heads: i32,
    hidden: i32,
    image_size: i32,
    patch: i32,
    /// Patches per side pooled into one token side.
    pool: i32,
    /// Image soft tokens per image.
    pub tokens_per_image: usize,
    /// mlx-vlm divides the projected features by √(config `hidden_size`),
    /// 2048 when absent, before the language model scales every embedding.
    feature_divisor: f32,
}

impl Gemma3Vision {
    /// Builds the tower when `config` has a `vision_config` and the
    /// checkpoint its tensors (`None` otherwise: a text-only folder).
    pub fn load(config: &Value, text_hidden: i32, w: &mut Weights) -> Result<Option<Gemma3Vision>> {
        let Some(vc) = config.get("vision_config").filter(|v| v.is_object()) else { return Ok(None) };
        let p = "vision_tower.vision_model";
        if !w.contains(&format!("{p}.embeddings.patch_embedding.weight")) {
            return Ok(None);
        }
        let cfg: VisionConfig =
            serde_json::from_value(vc.clone()).map_err(|e| Error::model(format!("config.json vision_config: {e}")))?;
        let mm = config
            .get("mm_tokens_per_image")
            .or_else(|| config.get("text_config").and_then(|t| t.get("mm_tokens_per_image")))
            .and_then(Value::as_i64)
            .unwrap_or(256) as i32;
        let (d, ps) = (cfg.hidden_size, cfg.patch_size);
        let side = cfg.image_size / ps.max(1);
        let tokens_side = (mm as f64).sqrt() as i32;
        if ps <= 0
            || cfg.image_size % ps != 0
            || tokens_side * tokens_side != mm
            || side % tokens_side.max(1) != 0
            || d % cfg.num_attention_heads.max(1) != 0
        {
            return Err(Error::model("config.json: vision_config's image_size, patch_size, heads or mm_tokens_per_image do not fit together"));
        }
        let eps = cfg.layer_norm_eps;
        let patch_w = w.take_shaped(&format!("{p}.embeddings.patch_embedding.weight"), &[d, ps, ps, 3])?;
        let patch_b = w.take_shaped(&format!("{p}.embeddings.patch_embedding.bias"), &[d])?;
        let positions = w.take_shaped(&format!("{p}.embeddings.position_embedding.weight"), &[side * side, d])?;
        let mut blocks = vec![];
        for i in 0..cfg.num_hidden_layers {
            let l = format!("{p}.encoder.layers.{i}");
            blocks.push(Block {
                ln1: LayerNorm::load(w, &format!("{l}.layer_norm1"), d, eps)?,
                q: w.linear(&format!("{l}.self_attn.q_proj"), d, d, true)?,
                k: w.linear(&format!("{l}.self_attn.k_proj"), d, d, true)?,
                v: w.linear(&format!("{l}.self_attn.v_proj"), d, d, true)?,
                out: w.linear(&format!("{l}.self_attn.out_proj"), d, d, true)?,
                ln2: LayerNorm::load(w, &format!("{l}.layer_norm2"), d, eps)?,
                fc1: w.linear(&format!("{l}.mlp.fc1"), d, cfg.intermediate_size, true)?,
                fc2: w.linear(&format!("{l}.mlp.fc2"), cfg.intermediate_size, d, true)?,
            });
        }
        // SigLIP's post-LayerNorm: mlx-vlm builds it with nn.LayerNorm's
        // default eps (1e-5), not the config's.
        let post_ln = LayerNorm::load(w, &format!("{p}.post_layernorm"), d, 1e-5)?;
        let q = "multi_modal_projector";
        let soft_norm = RmsNorm::offset(w.take_shaped(&format!("{q}.mm_soft_emb_norm.weight"), &[d])?, eps)?;
        let projection = w.take_shaped(&format!("{q}.mm_input_projection_weight"), &[d, text_hidden])?;
        Ok(Some(Gemma3Vision {
            patch_w: patch_w.reshape(&[d, ps * ps * 3])?.transpose(&[1, 0])?,
            patch_b,
            positions,
            blocks,
            post_ln,
            soft_norm,
            projection,
            heads: cfg.num_attention_heads,
            hidden: d,
            image_size: cfg.image_size,
            patch: ps,
            pool: side / tokens_side,
            tokens_per_image: mm as usize,
            feature_divisor: (config.get("hidden_size").and_then(Value::as_f64).unwrap_or(2048.0)).sqrt() as f32,
        }))
    }

    /// `pixels` `[N, S, S, 3]` (channels last, normalized) → projected soft
    /// tokens `[N, tokens_per_image, text hidden]`.
    pub fn forward(&self, pixels: &Array) -> Result<Array> {
        let n = pixels.dim(0);
        let (s, p, d) = (self.image_size, self.patch, self.hidden);
        let side = s / p;
        // The stride-p convolution as a matmul over (kh, kw, c) patches.
        let patches = pixels
            .reshape(&[n, side, p, side, p, 3])?
            .transpose(&[0, 1, 3, 2, 4, 5])?
            .reshape(&[n, side * side, p * p * 3])?;
        let mut x = patches.addmm(&self.patch_w, &self.patch_b)?.add(&self.positions)?;
        let hd = d / self.heads;
        let split = |t: Array| -> Result<Array> { Ok(t.reshape(&[n, -1, self.heads, hd])?.transpose(&[0, 2, 1, 3])?) };
        for b in &self.blocks {
            let h = b.ln1.forward(&x)?;
            let (q, k, v) = (split(b.q.forward(&h)?)?, split(b.k.forward(&h)?)?, split(b.v.forward(&h)?)?);
            let a = fast::scaled_dot_product_attention(&q, &k, &v, (hd as f32).powf(-0.5), Mask::None)?;
            let a = a.transpose(&[0, 2, 1, 3])?.reshape(&[n, -1, d])?;
            x = x.add(&b.out.forward(&a)?)?;
            let h = b.ln2.forward(&x)?;
            x = x.add(&b.fc2.forward(&gelu_tanh(&b.fc1.forward(&h)?)?)?)?;
        }
        let x = self.post_ln.forward(&x)?;
        // Average pooling of the patch grid, pool × pool patches per token.
        let (t, k) = (side / self.pool, self.pool);
        let pooled = x.reshape(&[n, t, k, t, k, d])?.mean(4, false)?.mean(2, false)?.reshape(&[n, t * t, d])?;
        let normed = self.soft_norm.forward(&pooled)?;
        Ok(normed.matmul(&self.projection)?)
    }

    /// `forward`, flattened to `[N × tokens_per_image, text hidden]` rows
    /// ready to splice into the prompt's embeddings.
    pub fn embed(&self, pixels: &Array) -> Result<Array> {
        let f = self.forward(pixels)?;
        let d = f.dim(2);
        Ok(f.divide(&f.scalar_like(self.feature_divisor)?)?.reshape(&[-1, d])?)
    }
}

impl Tower for Gemma3Vision {
    /// Items are `[3, S, S]` pixels (channels first, normalized).
    fn encode(&self, items: &[&MediaItem]) -> Result<Vec<Encoded>> {
        let s = self.image_size;
        let mut data = Vec::with_capacity(items.len() * 3 * (s * s) as usize);
        for it in items {
            if it.shape != [3, s as usize, s as usize] {
                return Err(Error::internal(format!("a {:?} image for a {s}x{s} tower", it.shape)));
            }
            data.extend_from_slice(&it.data);
        }
        let pixels = Array::from_f32(&data, &[items.len() as i32, 3, s, s])?.transpose(&[0, 2, 3, 1])?;
        let out = self.embed(&pixels)?;
        let t = self.tokens_per_image as i32;
        (0..items.len() as i32).map(|k| Ok(Encoded { rows: out.slice_axis(0, k * t, (k + 1) * t)?.contiguous()?, deepstack: vec![] })).collect()
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = vec![&self.patch_w, &self.patch_b, &self.positions, &self.soft_norm.w, &self.projection];
        v.extend([&self.post_ln.w, &self.post_ln.b]);
        for b in &self.blocks {
            v.extend([&b.ln1.w, &b.ln1.b, &b.ln2.w, &b.ln2.b]);
            for l in [&b.q, &b.k, &b.v, &b.out, &b.fc1, &b.fc2] {
                v.extend(l.arrays());
            }
        }
        v
    }
}

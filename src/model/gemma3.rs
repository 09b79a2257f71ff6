//! Gemma 3 (text): sliding-window and global attention layers interleaved
//! (every `sliding_window_pattern`-th layer is global), each kind with its
//! own RoPE base; `(1 + w)` RMSNorms, also around the attention and MLP
//! outputs ("sandwich" norms) and on each query/key head; a GeGLU MLP
//! (tanh-approximated GELU); embeddings scaled by √hidden (rounded to bf16,
//! as the reference does); queries scaled by `query_pre_attn_scalar^-½`.
//!
//! Sliding layers keep a ring of their last `sliding_window` positions
//! (`RingCache`, mlx-lm's `RotatingKVCache`): their memory and attention cost
//! stay bounded by the window however long the context grows.

use super::attention::{AttnSpec, Attention};
use super::layers::{Act, Embedding, Head, Mlp, RmsNorm, Rope};
use super::load::FamilyConfig;
use super::pass::Pass;
use super::weights::Weights;
use super::{Group, LanguageModel, MediaInput, ModelInfo, Output};
use crate::cache::kv::bytes_per_position;
use crate::cache::{KvCache, LayerCache, RingCache};
use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};
use serde::Deserialize;
use serde_json::Value;
use std::rc::Rc;

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct Config {
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    head_dim: i32,
    rms_norm_eps: f32,
    vocab_size: i32,
    num_key_value_heads: i32,
    rope_theta: f32,
    rope_local_base_freq: f32,
    query_pre_attn_scalar: f32,
    sliding_window: i32,
    sliding_window_pattern: i32,
    max_position_embeddings: i64,
    rope_scaling: Option<Value>,
}

impl FamilyConfig for Config {
    const REQUIRED: &'static [&'static str] =
        &["hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "vocab_size"];
}

/// mlx-lm's defaults (gemma3_text.py).
impl Default for Config {
    fn default() -> Config {
        Config {
            hidden_size: 0,
            num_hidden_layers: 0,
            intermediate_size: 0,
            num_attention_heads: 0,
            head_dim: 256,
            rms_norm_eps: 1e-6,
            vocab_size: 0,
            num_key_value_heads: 1,
            rope_theta: 1_000_000.0,
            rope_local_base_freq: 10_000.0,
            query_pre_attn_scalar: 256.0,
            sliding_window: 512,
            sliding_window_pattern: 6,
            max_position_embeddings: 32768,
            rope_scaling: None,
        }
    }
}

struct Block {
    attn: Attention,
    mlp: Mlp,
    input_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ff_norm: RmsNorm,
    post_ff_norm: RmsNorm,
    /// The sliding window, for sliding layers.
    window: Option<i32>,
}

pub struct Gemma3 {
    embed: Embedding,
    /// √hidden rounded to bf16.
    embed_scale: f32,
    blocks: Vec<Block>,
    norm: RmsNorm,
    head: Head,
    info: ModelInfo,
}

/// Rounds to the nearest bfloat16 (ties to even), as `mx.array(v, mx.bfloat16)`.
pub(crate) fn round_bf16(v: f32) -> f32 {
    let b = v.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(rounded)
}

/// `x + y`; in f16 summed in f32 and clipped to the f16 range, as the
/// reference does against overflow.
fn residual(x: &Array, y: &Array) -> Result<Array> {
    if x.dtype() != Dtype::F16 {
        return Ok(x.add(y)?);
    }
    let s = x.astype(Dtype::F32)?.add(&y.astype(Dtype::F32)?)?;
    let bound = Array::scalar_f32(65504.0)?;
    Ok(s.minimum(&bound)?.maximum(&bound.negative()?)?.astype(Dtype::F16)?)
}

pub fn load(config: &Value, w: &mut Weights, mut info: ModelInfo) -> Result<Gemma3> {
    let cfg: Config = super::load::parse_config("gemma3_text", config)?;
    if cfg.sliding_window_pattern <= 0 || cfg.sliding_window <= 0 || cfg.num_attention_heads % cfg.num_key_value_heads.max(1) != 0 {
        return Err(Error::model("config.json for gemma3_text: invalid sliding window or head counts"));
    }
    let (d, hd, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps);
    let norm = |w: &mut Weights, name: &str, n: i32| RmsNorm::offset(w.take_shaped(name, &[n])?, eps);
    let embed = w.embedding("model.embed_tokens", cfg.vocab_size, d)?;
    let local = Rc::new(Rope::new(hd, cfg.rope_local_base_freq, false, None, None)?);
    let global = Rc::new(Rope::new(hd, cfg.rope_theta, false, cfg.rope_scaling.as_ref(), Some(cfg.max_position_embeddings))?);
    let mut blocks = vec![];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let sliding = (i + 1) % cfg.sliding_window_pattern != 0;
        let window = sliding.then_some(cfg.sliding_window);
        let spec = AttnSpec {
            dim: d,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: hd,
            bias: false,
            qk_norm: Some(eps),
            norm_offset: true,
            scale: cfg.query_pre_attn_scalar.powf(-0.5),
            output_gate: false,
            window,
        };
        let rope = if sliding { local.clone() } else { global.clone() };
        blocks.push(Block {
            attn: Attention::load(w, &format!("{p}.self_attn"), &spec, rope)?,
            mlp: Mlp::load(w, &format!("{p}.mlp"), d, cfg.intermediate_size, Act::GeluTanh)?,
            input_norm: norm(w, &format!("{p}.input_layernorm.weight"), d)?,
            post_attn_norm: norm(w, &format!("{p}.post_attention_layernorm.weight"), d)?,
            pre_ff_norm: norm(w, &format!("{p}.pre_feedforward_layernorm.weight"), d)?,
            post_ff_norm: norm(w, &format!("{p}.post_feedforward_layernorm.weight"), d)?,
            window,
        });
    }
    let norm = norm(w, "model.norm.weight", d)?;
    let head = Head::load(w, "lm_head", None, d, cfg.vocab_size)?;
    info.architecture = "gemma3_text".into();
    info.vocab_size = cfg.vocab_size;
    info.num_layers = cfg.num_hidden_layers;
    info.hidden_size = d;
    info.context_length = cfg.max_position_embeddings;
    info.kv_bytes_per_token = cfg.num_hidden_layers as usize * bytes_per_position(cfg.num_key_value_heads, hd, Dtype::F32);
    Ok(Gemma3 { embed, embed_scale: round_bf16((d as f32).sqrt()), blocks, norm, head, info })
}

impl Gemma3 {
    /// The layers over input embeddings `h` (unscaled) of the pass's tokens.
    fn run(&self, h: Array, mut pass: Pass) -> Result<Option<Array>> {
        let mut h = h.multiply(&h.scalar_like(self.embed_scale)?)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let r = b.attn.forward(&b.input_norm.forward(&h)?, &mut pass, i)?;
            h = residual(&h, &b.post_attn_norm.forward(&r)?)?;
            let r = b.mlp.forward(&b.pre_ff_norm.forward(&h)?)?;
            h = residual(&h, &b.post_ff_norm.forward(&r)?)?;
            pass.settle(&h)?;
        }
        pass.logits(h, |h| self.head.forward(&self.norm.forward(h)?, &self.embed))
    }
}

impl LanguageModel for Gemma3 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self, rows: usize) -> Vec<LayerCache> {
        let ring = |w| LayerCache::Ring(RingCache::new(rows, w));
        self.blocks.iter().map(|b| b.window.map_or_else(|| LayerCache::Kv(KvCache::new(rows)), ring)).collect()
    }

    fn kv_layers(&self) -> Vec<Option<crate::cache::scheme::KvLayer>> {
        self.blocks.iter().map(|b| Some(b.attn.kv_layer())).collect()
    }

    fn forward(&self, tokens: &Array, cache: &mut [LayerCache], out: Output) -> Result<Option<Array>> {
        self.run(self.embed.forward(tokens)?, Pass::single(cache, tokens.dim(1), out, self.blocks.len())?)
    }

    fn supports_mixed(&self) -> bool {
        true
    }

    fn forward_mixed(&self, tokens: &Array, groups: &mut [Group]) -> Result<Option<Array>> {
        self.run(self.embed.forward(tokens)?, Pass::mixed(tokens, groups, self.blocks.len())?)
    }

    /// As mlx-vlm's gemma3 `get_input_embeddings`: token embeddings, zero at
    /// `media.zero` (its pad positions), the media rows at `media.at`; then
    /// the usual √hidden scaling of every position. Attention stays causal
    /// over image tokens, as mlx-vlm's `generate` runs it.
    fn forward_media(&self, tokens: &Array, media: &MediaInput, cache: &mut [LayerCache], out: Output) -> Result<Option<Array>> {
        let h = media.splice(&self.embed.forward(tokens)?)?;
        self.run(h, Pass::single(cache, tokens.dim(1), out, self.blocks.len())?)
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = self.embed.arrays();
        for b in &self.blocks {
            v.extend(b.attn.arrays());
            v.extend(b.mlp.arrays());
            for n in [&b.input_norm, &b.post_attn_norm, &b.pre_ff_norm, &b.post_ff_norm] {
                v.push(&n.w);
            }
        }
        v.push(&self.norm.w);
        v.extend(self.head.arrays());
        v
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bf16_rounding() {
        assert_eq!(super::round_bf16(1.0), 1.0);
        // √64 = 8 is exact; √1152 = 33.941… → 34.0 in bf16 (8 significant bits).
        assert_eq!(super::round_bf16(64f32.sqrt()), 8.0);
        assert_eq!(super::round_bf16(1152f32.sqrt()), 34.0);
    }
}

//! The Llama architecture (also SmolLM, Llama 2/3.x, Mistral-style dense
//! configs): pre-norm decoder blocks with grouped-query attention, RoPE and a
//! SwiGLU MLP. Tensor names follow the Hugging Face checkpoint.

use super::attention::{AttnSpec, Attention};
use super::decoder::{Block, Decoder, Ffn};
use super::layers::{Act, FusedLinear, Head, Mlp, RmsNorm, Rope};
use super::load::FamilyConfig;
use super::weights::Weights;
use super::ModelInfo;
use crate::cache::kv::bytes_per_position;
use crate::error::{Error, Result};
use crate::mlx::Dtype;
use serde::Deserialize;
use serde_json::Value;
use std::rc::Rc;

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct LlamaConfig {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub head_dim: Option<i32>,
    pub max_position_embeddings: Option<i64>,
    pub num_key_value_heads: Option<i32>,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub rope_theta: f32,
    pub rope_traditional: bool,
    pub rope_scaling: Option<Value>,
    pub tie_word_embeddings: Option<bool>,
}

impl FamilyConfig for LlamaConfig {
    const REQUIRED: &'static [&'static str] =
        &["hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "rms_norm_eps", "vocab_size"];
}

/// Defaults for what config.json may omit: mlx-lm's (llama.py), except
/// that a missing `tie_word_embeddings` follows the checkpoint (tied when it
/// has no `lm_head`).
impl Default for LlamaConfig {
    fn default() -> LlamaConfig {
        LlamaConfig {
            hidden_size: 0,
            num_hidden_layers: 0,
            intermediate_size: 0,
            num_attention_heads: 0,
            rms_norm_eps: 0.0,
            vocab_size: 0,
            head_dim: None,
            max_position_embeddings: None,
            num_key_value_heads: None,
            attention_bias: false,
            mlp_bias: false,
            rope_theta: 10_000.0,
            rope_traditional: false,
            rope_scaling: None,
            tie_word_embeddings: None,
        }
    }
}

impl LlamaConfig {
    pub(crate) fn kv_heads(&self) -> i32 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }
    pub(crate) fn head_dim(&self) -> i32 {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads)
    }
    pub(crate) fn validate(&self) -> Result<()> {
        let pos = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("vocab_size", self.vocab_size),
            ("head_dim", self.head_dim()),
        ];
        for (name, v) in pos {
            if v <= 0 {
                return Err(Error::model(format!("config.json: `{name}` must be positive, got {v}")));
            }
        }
        if self.num_attention_heads % self.kv_heads() != 0 {
            return Err(Error::model(format!(
                "config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.kv_heads()
            )));
        }
        Ok(())
    }
}

/// What distinguishes the families that reuse the Llama block.
pub(crate) struct Variant<'a> {
    pub arch: &'a str,
    /// Per-head RMSNorm of queries and keys (Qwen3).
    pub qk_norm: bool,
    /// The feed-forward part of layer `i` (`prefix` = `model.layers.{i}.mlp`);
    /// None = the dense SwiGLU MLP.
    pub ffn: Option<&'a dyn Fn(&mut Weights, i32, &str) -> Result<Ffn>>,
    /// Multimodal RoPE sections (t, h, w) for media prompts (Qwen3-VL).
    pub mrope: Option<[i32; 3]>,
}

/// A Llama-architecture model (also SmolLM, Llama 2/3.x, Mistral-style dense).
pub fn load(cfg: &LlamaConfig, w: &mut Weights, info: ModelInfo) -> Result<Decoder> {
    build(cfg, w, info, &Variant { arch: "llama", qk_norm: false, ffn: None, mrope: None })
}

pub(crate) fn build(cfg: &LlamaConfig, w: &mut Weights, mut info: ModelInfo, var: &Variant) -> Result<Decoder> {
    cfg.validate()?;
    let (d, hd) = (cfg.hidden_size, cfg.head_dim());
    let (nh, nkv) = (cfg.num_attention_heads, cfg.kv_heads());
    let eps = cfg.rms_norm_eps;
    let norm = |w: &mut Weights, name: &str| -> Result<RmsNorm> { Ok(RmsNorm { w: w.take_shaped(name, &[d])?, eps }) };
    let embed = w.embedding("model.embed_tokens", cfg.vocab_size, d)?;
    let mut rope = Rope::new(hd, cfg.rope_theta, cfg.rope_traditional, cfg.rope_scaling.as_ref(), cfg.max_position_embeddings)?;
    if let Some(s) = var.mrope {
        rope = rope.with_sections(s)?;
    }
    let rope = Rc::new(rope);
    let spec = AttnSpec {
        dim: d,
        heads: nh,
        kv_heads: nkv,
        head_dim: hd,
        bias: cfg.attention_bias,
        qk_norm: var.qk_norm.then_some(eps),
        norm_offset: false,
        scale: (hd as f32).powf(-0.5),
        output_gate: false,
        window: None,
    };
    let mut blocks = Vec::with_capacity(cfg.num_hidden_layers as usize);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let attn = Attention::load(w, &format!("{p}.self_attn"), &spec, rope.clone())?;
        let mlp = format!("{p}.mlp");
        let ffn = match var.ffn {
            Some(f) => f(w, i, &mlp)?,
            None => Ffn::Dense(Mlp {
                gate_up: FusedLinear::new(vec![
                    (w.linear(&format!("{mlp}.gate_proj"), d, cfg.intermediate_size, cfg.mlp_bias)?, cfg.intermediate_size),
                    (w.linear(&format!("{mlp}.up_proj"), d, cfg.intermediate_size, cfg.mlp_bias)?, cfg.intermediate_size),
                ])?,
                down: w.linear(&format!("{mlp}.down_proj"), cfg.intermediate_size, d, cfg.mlp_bias)?,
                act: Act::Silu,
                kernels: w.kernels(),
            }),
        };
        blocks.push(Block {
            attn,
            ffn,
            input_norm: norm(w, &format!("{p}.input_layernorm.weight"))?,
            post_norm: norm(w, &format!("{p}.post_attention_layernorm.weight"))?,
        });
    }
    let norm = norm(w, "model.norm.weight")?;
    let head = Head::load(w, "lm_head", cfg.tie_word_embeddings, d, cfg.vocab_size)?;
    info.architecture = var.arch.into();
    info.vocab_size = cfg.vocab_size;
    info.num_layers = cfg.num_hidden_layers;
    info.hidden_size = d;
    info.kv_bytes_per_token = cfg.num_hidden_layers as usize * bytes_per_position(nkv, hd, Dtype::F32);
    if let Some(n) = cfg.max_position_embeddings {
        info.context_length = n;
    }
    Ok(Decoder { embed, blocks, norm, head, info })
}

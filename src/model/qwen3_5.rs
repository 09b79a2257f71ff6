//! The Qwen3-Next / Qwen3.5 hybrid: Gated DeltaNet linear-attention layers
//! (gated_delta.rs) with a gated full-attention layer every
//! `full_attention_interval`-th layer (output gate from the query
//! projection, per-head q/k RMSNorm, RoPE over a `partial_rotary_factor`
//! part of each head). The feed-forward is a SwiGLU MLP or a sparse MoE with
//! a gated shared expert.
//!
//! Linear layers keep a recurrent state (`StateCache`), attention layers a KV
//! cache. A state cannot be cut back, so the engine uses prompt-cache entries
//! of this model whole only, and snapshots prompts at their boundary.
//! Qwen3.5 checkpoints nest the text model under `language_model.`.

use super::attention::{AttnSpec, Attention};
use super::decoder::Ffn;
use super::gated_delta::{DeltaSpec, GatedDeltaNet, Layout};
use super::layers::{Act, Embedding, Head, Mlp, RmsNorm, Rope};
use super::load::FamilyConfig;
use super::moe::{MoeSpec, SparseMoe};
use super::pass::Pass;
use super::weights::Weights;
use super::{bounded_chunk, Group, LanguageModel, ModelInfo, Output};
use crate::cache::kv::bytes_per_position;
use crate::cache::{KvCache, LayerCache, StateCache};
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
    rms_norm_eps: f32,
    vocab_size: i32,
    num_key_value_heads: i32,
    max_position_embeddings: Option<i64>,
    linear_num_value_heads: i32,
    linear_num_key_heads: i32,
    linear_key_head_dim: i32,
    linear_value_head_dim: i32,
    linear_conv_kernel_dim: i32,
    tie_word_embeddings: bool,
    attention_bias: bool,
    head_dim: Option<i32>,
    full_attention_interval: i32,
    num_experts: i32,
    num_experts_per_tok: i32,
    decoder_sparse_step: i32,
    shared_expert_intermediate_size: i32,
    moe_intermediate_size: i32,
    norm_topk_prob: Option<bool>,
    mlp_only_layers: Vec<i32>,
    rope_theta: Option<f32>,
    partial_rotary_factor: Option<f32>,
    rope_scaling: Option<Value>,
}

impl FamilyConfig for Config {
    const REQUIRED: &'static [&'static str] = &[
        "hidden_size",
        "num_hidden_layers",
        "intermediate_size",
        "num_attention_heads",
        "rms_norm_eps",
        "vocab_size",
        "num_key_value_heads",
        "linear_num_value_heads",
        "linear_num_key_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    ];
}

/// Defaults for what config.json may omit (a dense model, full attention
/// every 4th layer, as in mlx-lm).
impl Default for Config {
    fn default() -> Config {
        Config {
            hidden_size: 0,
            num_hidden_layers: 0,
            intermediate_size: 0,
            num_attention_heads: 0,
            rms_norm_eps: 0.0,
            vocab_size: 0,
            num_key_value_heads: 0,
            max_position_embeddings: None,
            linear_num_value_heads: 0,
            linear_num_key_heads: 0,
            linear_key_head_dim: 0,
            linear_value_head_dim: 0,
            linear_conv_kernel_dim: 0,
            tie_word_embeddings: false,
            attention_bias: false,
            head_dim: None,
            full_attention_interval: 4,
            num_experts: 0,
            num_experts_per_tok: 0,
            decoder_sparse_step: 1,
            shared_expert_intermediate_size: 0,
            moe_intermediate_size: 0,
            norm_topk_prob: None,
            mlp_only_layers: Vec::new(),
            rope_theta: None,
            partial_rotary_factor: None,
            rope_scaling: None,
        }
    }
}

enum Mixer {
    Linear(GatedDeltaNet),
    Attn(Attention),
}

struct Block {
    mixer: Mixer,
    ffn: Ffn,
    input_norm: RmsNorm,
    post_norm: RmsNorm,
}

pub struct Hybrid {
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    head: Head,
    /// Query heads of the attention layers (their score workspace bounds
    /// the prefill chunk).
    attn_heads: usize,
    info: ModelInfo,
}

pub fn load(model_type: &str, config: &Value, w: &mut Weights, mut info: ModelInfo) -> Result<Box<dyn LanguageModel>> {
    // Qwen3.5 keeps the text model's settings in `text_config`.
    let text = config.get("text_config").filter(|t| t.is_object()).unwrap_or(config);
    let cfg: Config = super::load::parse_config(model_type, text)?;
    let qwen3_next = model_type == "qwen3_next";
    let root = if w.contains("language_model.model.embed_tokens.weight")
        || w.contains("language_model.model.embed_tokens.scales")
    {
        "language_model."
    } else {
        ""
    };
    if cfg.full_attention_interval <= 0 || cfg.num_attention_heads % cfg.num_key_value_heads.max(1) != 0 {
        return Err(Error::model(format!("config.json for {model_type}: invalid full_attention_interval or head counts")));
    }
    let (d, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
    let hd = cfg.head_dim.unwrap_or(d / cfg.num_attention_heads);
    let norm = |w: &mut Weights, name: &str, n: i32| -> Result<RmsNorm> { Ok(RmsNorm { w: w.take_shaped(name, &[n])?, eps }) };
    let embed = w.embedding(&format!("{root}model.embed_tokens"), cfg.vocab_size, d)?;

    // RoPE over the first `partial_rotary_factor` of each head. Qwen3.5's
    // multimodal RoPE is the plain one for text (all sections share positions).
    // Qwen3.5 takes them from `rope_parameters` when it is there.
    let rp = text.get("rope_parameters").filter(|v| v.is_object() && !qwen3_next);
    let rp_f32 = |k: &str| rp.and_then(|v| v.get(k)).and_then(Value::as_f64).map(|x| x as f32);
    let partial = rp_f32("partial_rotary_factor").or(cfg.partial_rotary_factor).unwrap_or(0.25);
    let theta = rp_f32("rope_theta").or(cfg.rope_theta).unwrap_or(if qwen3_next { 10_000.0 } else { 100_000.0 });
    let scaling = cfg.rope_scaling.clone().filter(|s| {
        let t = s.get("type").or_else(|| s.get("rope_type")).and_then(Value::as_str).unwrap_or("default");
        !matches!(t, "default" | "mrope")
    });
    let rope = Rc::new(Rope::new((hd as f32 * partial) as i32, theta, false, scaling.as_ref(), cfg.max_position_embeddings)?);
    let attn = AttnSpec {
        dim: d,
        heads: cfg.num_attention_heads,
        kv_heads: cfg.num_key_value_heads,
        head_dim: hd,
        bias: cfg.attention_bias,
        qk_norm: Some(eps),
        norm_offset: false,
        scale: (hd as f64).powf(-0.5) as f32,
        window: None,
        output_gate: true,
    };
    let delta = DeltaSpec {
        dim: d,
        k_heads: cfg.linear_num_key_heads,
        v_heads: cfg.linear_num_value_heads,
        k_dim: cfg.linear_key_head_dim,
        v_dim: cfg.linear_value_head_dim,
        kernel: cfg.linear_conv_kernel_dim,
        eps,
    };
    let moe = MoeSpec {
        dim: d,
        experts: cfg.num_experts,
        top_k: cfg.num_experts_per_tok,
        hidden: cfg.moe_intermediate_size,
        // mlx-lm's defaults differ between the two model types.
        norm_topk: cfg.norm_topk_prob.unwrap_or(!qwen3_next),
        shared_hidden: Some(cfg.shared_expert_intermediate_size),
    };
    if cfg.num_experts > 0 && (moe.top_k <= 0 || moe.top_k > moe.experts || cfg.decoder_sparse_step <= 0) {
        return Err(Error::model(format!("config.json for {model_type}: invalid MoE settings")));
    }
    let layout = if qwen3_next { Layout::Grouped } else { Layout::Separate };
    let mut blocks = vec![];
    let mut linear_layers = 0;
    for i in 0..cfg.num_hidden_layers {
        let p = format!("{root}model.layers.{i}");
        let mixer = if (i + 1) % cfg.full_attention_interval != 0 {
            linear_layers += 1;
            Mixer::Linear(GatedDeltaNet::load(w, &format!("{p}.linear_attn"), delta, layout)?)
        } else {
            Mixer::Attn(Attention::load(w, &format!("{p}.self_attn"), &attn, rope.clone())?)
        };
        let sparse = cfg.num_experts > 0 && !cfg.mlp_only_layers.contains(&i) && (i + 1) % cfg.decoder_sparse_step == 0;
        let ffn = if sparse {
            Ffn::Moe(SparseMoe::load(w, &format!("{p}.mlp"), &moe)?)
        } else {
            Ffn::Dense(Mlp::load(w, &format!("{p}.mlp"), d, cfg.intermediate_size, Act::Silu)?)
        };
        blocks.push(Block {
            mixer,
            ffn,
            input_norm: norm(w, &format!("{p}.input_layernorm.weight"), d)?,
            post_norm: norm(w, &format!("{p}.post_attention_layernorm.weight"), d)?,
        });
    }
    if linear_layers == cfg.num_hidden_layers {
        return Err(Error::model(format!("config.json for {model_type}: no full-attention layer")));
    }
    let norm = norm(w, &format!("{root}model.norm.weight"), d)?;
    let head = Head::load(w, &format!("{root}lm_head"), Some(cfg.tie_word_embeddings), d, cfg.vocab_size)?;
    let attn_layers = (cfg.num_hidden_layers - linear_layers) as usize;
    info.architecture = model_type.into();
    info.vocab_size = cfg.vocab_size;
    info.num_layers = cfg.num_hidden_layers;
    info.hidden_size = d;
    info.context_length = cfg.max_position_embeddings.unwrap_or(0);
    // Per position only the attention layers grow; the recurrent state is a
    // fixed size per sequence.
    info.kv_bytes_per_token = attn_layers * bytes_per_position(cfg.num_key_value_heads, hd, Dtype::F32);
    let conv = (delta.kernel - 1) * (2 * delta.k_heads * delta.k_dim + delta.v_heads * delta.v_dim);
    let state = delta.v_heads * delta.v_dim * delta.k_dim;
    info.state_bytes_per_sequence = linear_layers as usize * (conv + state) as usize * 4;
    let attn_heads = cfg.num_attention_heads as usize;
    Ok(Box::new(Hybrid { embed, blocks, norm, head, attn_heads, info }))
}

impl Hybrid {
    fn run(&self, tokens: &Array, mut pass: Pass) -> Result<Option<Array>> {
        let mut h = self.embed.forward(tokens)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let x = b.input_norm.forward(&h)?;
            let r = match &b.mixer {
                Mixer::Linear(l) => l.forward(&x, &mut pass, i)?,
                Mixer::Attn(a) => a.forward(&x, &mut pass, i)?,
            };
            h = h.add(&r)?;
            h = h.add(&b.ffn.forward(&b.post_norm.forward(&h)?)?)?;
            pass.settle(&h)?;
        }
        pass.logits(h, |h| self.head.forward(&self.norm.forward(h)?, &self.embed))
    }
}

impl LanguageModel for Hybrid {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self, rows: usize) -> Vec<LayerCache> {
        self.blocks
            .iter()
            .map(|b| match b.mixer {
                Mixer::Linear(_) => LayerCache::State(StateCache::new(rows)),
                Mixer::Attn(_) => LayerCache::Kv(KvCache::new(rows)),
            })
            .collect()
    }

    fn kv_layers(&self) -> Vec<Option<crate::cache::scheme::KvLayer>> {
        self.blocks
            .iter()
            .map(|b| match &b.mixer {
                Mixer::Linear(_) => None,
                Mixer::Attn(a) => Some(a.kv_layer()),
            })
            .collect()
    }

    fn forward(&self, tokens: &Array, cache: &mut [LayerCache], out: Output) -> Result<Option<Array>> {
        self.run(tokens, Pass::single(cache, tokens.dim(1), out, self.blocks.len())?)
    }

    fn supports_mixed(&self) -> bool {
        true
    }

    fn forward_mixed(&self, tokens: &Array, groups: &mut [Group]) -> Result<Option<Array>> {
        self.run(tokens, Pass::mixed(tokens, groups, self.blocks.len())?)
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = self.embed.arrays();
        for b in &self.blocks {
            match &b.mixer {
                Mixer::Linear(l) => v.extend(l.arrays()),
                Mixer::Attn(a) => v.extend(a.arrays()),
            }
            v.extend(b.ffn.arrays());
            v.push(&b.input_norm.w);
            v.push(&b.post_norm.w);
        }
        v.push(&self.norm.w);
        v.extend(self.head.arrays());
        v
    }

    /// Attention scores of a chunk are materialized (`rows × heads × chunk ×
    /// keys` f32): keep them within 1 GiB at long context.
    fn prefill_chunk(&self, rows: usize, done: usize, requested: usize) -> usize {
        bounded_chunk(rows, self.attn_heads, done, requested)
    }
}

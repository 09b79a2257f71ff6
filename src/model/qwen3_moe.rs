//! Qwen3-MoE: Qwen3's attention; the feed-forward of every
//! `decoder_sparse_step`-th layer (except `mlp_only_layers`) is a sparse
//! mixture of experts (softmax router, top-k, optional renormalization).

use super::decoder::{Decoder, Ffn};
use super::layers::{Act, Mlp};
use super::llama::{build, LlamaConfig, Variant};
use super::load::FamilyConfig;
use super::moe::{MoeSpec, SparseMoe};
use super::weights::Weights;
use super::ModelInfo;
use crate::error::{Error, Result};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct MoeConfig {
    num_experts: i32,
    num_experts_per_tok: i32,
    decoder_sparse_step: i32,
    mlp_only_layers: Vec<i32>,
    moe_intermediate_size: i32,
    norm_topk_prob: bool,
}

impl FamilyConfig for MoeConfig {
    const REQUIRED: &'static [&'static str] = &["num_experts", "num_experts_per_tok", "moe_intermediate_size"];
}

impl Default for MoeConfig {
    fn default() -> MoeConfig {
        MoeConfig {
            num_experts: 0,
            num_experts_per_tok: 0,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            moe_intermediate_size: 0,
            norm_topk_prob: false,
        }
    }
}

pub fn load(config: &Value, w: &mut Weights, info: ModelInfo) -> Result<Decoder> {
    let cfg: LlamaConfig = super::load::parse_config("qwen3_moe", config)?;
    let moe: MoeConfig = super::load::parse_config("qwen3_moe", config)?;
    if moe.num_experts_per_tok <= 0 || moe.num_experts_per_tok > moe.num_experts || moe.decoder_sparse_step <= 0 {
        return Err(Error::model(format!(
            "config.json: {} experts per token of {} (sparse step {}) is not a valid MoE",
            moe.num_experts_per_tok, moe.num_experts, moe.decoder_sparse_step
        )));
    }
    let spec = MoeSpec {
        dim: cfg.hidden_size,
        experts: moe.num_experts,
        top_k: moe.num_experts_per_tok,
        hidden: moe.moe_intermediate_size,
        norm_topk: moe.norm_topk_prob,
        shared_hidden: None,
    };
    let ffn = |w: &mut Weights, i: i32, prefix: &str| -> Result<Ffn> {
        let sparse = !moe.mlp_only_layers.contains(&i) && moe.num_experts > 0 && (i + 1) % moe.decoder_sparse_step == 0;
        Ok(if sparse {
            Ffn::Moe(SparseMoe::load(w, prefix, &spec)?)
        } else {
            Ffn::Dense(Mlp::load(w, prefix, cfg.hidden_size, cfg.intermediate_size, Act::Silu)?)
        })
    };
    build(&cfg, w, info, &Variant { arch: "qwen3_moe", qk_norm: true, ffn: Some(&ffn), mrope: None })
}

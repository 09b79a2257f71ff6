//! Qwen3 (dense): the Llama block without biases, with an RMSNorm over each
//! query and key head before RoPE.

use super::decoder::Decoder;
use super::llama::{build, LlamaConfig, Variant};
use super::weights::Weights;
use super::ModelInfo;
use crate::error::Result;
use serde_json::Value;

pub fn load(config: &Value, w: &mut Weights, info: ModelInfo) -> Result<Decoder> {
    let cfg: LlamaConfig = super::load::parse_config("qwen3", config)?;
    build(&cfg, w, info, &Variant { arch: "qwen3", qk_norm: true, ffn: None })
}

//! Qwen3 (dense): the Llama block without biases, with an RMSNorm over each
//! query and key head before RoPE. Qwen3-VL's language model is the same
//! block with interleaved multimodal RoPE for media prompts (its config
//! under `text_config`, the sections in `rope_scaling.mrope_section`).

use super::decoder::Decoder;
use super::llama::{build, LlamaConfig, Variant};
use super::weights::Weights;
use super::ModelInfo;
use crate::error::{Error, Result};
use serde_json::Value;

pub fn load(config: &Value, w: &mut Weights, info: ModelInfo) -> Result<Decoder> {
    let cfg: LlamaConfig = super::load::parse_config("qwen3", config)?;
    build(&cfg, w, info, &Variant { arch: "qwen3", qk_norm: true, ffn: None, mrope: None })
}

/// Qwen3-VL's language model (tensors without the `language_model.` prefix).
pub fn load_vl(config: &Value, w: &mut Weights, info: ModelInfo) -> Result<Decoder> {
    let text = config.get("text_config").filter(|t| t.is_object()).ok_or_else(|| Error::model("config.json for qwen3_vl: no text_config"))?;
    let mut cfg: LlamaConfig = super::load::parse_config("qwen3_vl", text)?;
    // mlx-vlm's default sections; the scaling object is otherwise plain RoPE.
    let section = match cfg.rope_scaling.take().as_ref().and_then(|r| r.get("mrope_section")) {
        Some(s) => {
            let v: Vec<i32> = serde_json::from_value(s.clone()).map_err(|e| Error::model(format!("config.json: mrope_section: {e}")))?;
            <[i32; 3]>::try_from(v).map_err(|v| Error::model(format!("config.json: mrope_section {v:?} is not 3 numbers")))?
        }
        None => [24, 20, 20],
    };
    build(&cfg, w, info, &Variant { arch: "qwen3_vl", qk_norm: true, ffn: None, mrope: Some(section) })
}

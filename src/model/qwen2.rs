//! Qwen2 / Qwen2.5: the Llama block with biases on the q/k/v projections
//! (not on o), head size `hidden / heads`, a large RoPE base (default 1e6)
//! and a tied head unless the config says otherwise.

use super::decoder::Decoder;
use super::llama::{build, LlamaConfig, Variant};
use super::weights::Weights;
use super::ModelInfo;
use crate::error::Result;
use serde_json::{json, Value};

pub fn load(config: &Value, w: &mut Weights, info: ModelInfo) -> Result<Decoder> {
    let mut c = config.clone();
    let o = c.as_object_mut().expect("config.json is an object");
    o.entry("rope_theta").or_insert(json!(1_000_000.0));
    o.entry("tie_word_embeddings").or_insert(json!(true));
    o.insert("attention_bias".into(), json!(true));
    o.remove("head_dim");
    let cfg: LlamaConfig = super::load::parse_config("qwen2", &c)?;
    build(&cfg, w, info, &Variant { arch: "qwen2", qk_norm: false, ffn: None, mrope: None })
}

//! Gemma 4 (text). Not built yet.

use super::weights::Weights;
use super::{LanguageModel, ModelInfo};
use crate::error::{Error, Result};
use serde_json::Value;

pub fn load(_config: &Value, _w: &mut Weights, _info: ModelInfo) -> Result<Box<dyn LanguageModel>> {
    Err(Error::unsupported("model_type `gemma4_text` is not supported yet"))
}

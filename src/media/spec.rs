//! What preparing an image prompt needs from the checkpoint (plain data, any
//! thread): the image processor and how the processor expands each image in
//! the rendered prompt (Gemma 3: `<start_of_image>` becomes
//! `"\n\n<start_of_image>" + <image_soft_token> × mm_tokens_per_image +
//! "<end_of_image>\n\n"`, as mlx-vlm's Gemma3Processor).

use super::process::ImageProcessor;
use crate::model::load::TextAssets;
use crate::{Error, Result};
use serde_json::Value;
use std::path::Path;

#[derive(Debug, Clone)]
pub struct MediaSpec {
    pub processor: ImageProcessor,
    /// What the chat template renders for an image part.
    pub placeholder: String,
    /// What the processor puts in its place.
    pub expansion: String,
    /// The id of an image soft token (the positions the tower's rows fill).
    pub soft_id: u32,
    pub tokens_per_image: usize,
}

impl MediaSpec {
    pub fn load(dir: &Path, config: &Value, text: &TextAssets, tokens_per_image: usize) -> Result<MediaSpec> {
        let processor = ImageProcessor::load(dir)?
            .ok_or_else(|| Error::model("the checkpoint has a vision tower but no preprocessor_config.json"))?;
        let tok_cfg: Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null);
        let token = |key: &str, default: &str| -> String {
            tok_cfg
                .get("extra_special_tokens")
                .and_then(|e| e.get(key))
                .or_else(|| tok_cfg.get(key))
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_owned()
        };
        let (boi, eoi, soft) =
            (token("boi_token", "<start_of_image>"), token("eoi_token", "<end_of_image>"), token("image_token", "<image_soft_token>"));
        let soft_id = text
            .tokenizer
            .token_to_id(&soft)
            .ok_or_else(|| Error::model(format!("the tokenizer has no image token `{soft}`")))?;
        if let Some(want) = config.get("image_token_index").and_then(Value::as_u64) {
            if want != soft_id as u64 {
                return Err(Error::model(format!("image_token_index {want} is not the tokenizer's `{soft}` ({soft_id})")));
            }
        }
        for t in [&boi, &eoi] {
            text.tokenizer.token_to_id(t).ok_or_else(|| Error::model(format!("the tokenizer has no `{t}` token")))?;
        }
        let expansion = format!("\n\n{boi}{}{eoi}\n\n", soft.repeat(tokens_per_image));
        Ok(MediaSpec { processor, placeholder: boi, expansion, soft_id, tokens_per_image })
    }

    /// Replaces each placeholder in `rendered` with its expansion; the number
    /// of placeholders must be `images`.
    pub fn expand(&self, rendered: &str, images: usize) -> Result<String> {
        let found = rendered.matches(&self.placeholder).count();
        if found != images {
            return Err(Error::invalid(format!(
                "the chat template rendered {found} image placeholder(s) `{}` for {images} image part(s)",
                self.placeholder
            )));
        }
        Ok(rendered.replace(&self.placeholder, &self.expansion))
    }
}

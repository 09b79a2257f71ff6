//! What preparing a media prompt needs from the checkpoint (plain data, any
//! thread): the processors and how each item is expanded in the rendered
//! prompt (`Slot`), as mlx-vlm's processor for the family does it:
//! - Gemma 3: `<start_of_image>` becomes `"\n\n<start_of_image>" +
//!   <image_soft_token> × mm_tokens_per_image + "<end_of_image>\n\n"`.
//! - Qwen3-VL: the template's `<|image_pad|>` (between `<|vision_start|>`
//!   and `<|vision_end|>`) becomes one `<|image_pad|>` per merged patch; the
//!   prompt's multimodal RoPE positions follow (`mrope`).
//! - Gemma 4: the template's `<|image|>` becomes `<|image>` + `<|image|>` ×
//!   n + `<image|>` (n from the image's size); image tokens attend to each
//!   other both ways when the text config says `use_bidirectional_attention:
//!   "vision"`.

use super::audio::AudioProcessor;
use super::process::{read_config, ImageProcessor};
use super::{MediaItem, MediaKind, MediaPrompt};
use crate::model::load::TextAssets;
use crate::{Error, Result};
use serde_json::Value;
use std::path::Path;

/// How one kind of media appears in the prompt: the chat template renders
/// `placeholder` for each part; the processor puts `prefix + soft × n +
/// suffix` in its place, `n` the item's soft tokens.
#[derive(Debug, Clone)]
pub struct Slot {
    pub placeholder: String,
    pub prefix: String,
    pub soft: String,
    pub suffix: String,
    /// The id of `soft` (the positions the tower's rows fill).
    pub soft_id: u32,
}

impl Slot {
    fn expansion(&self, n: usize) -> String {
        format!("{}{}{}", self.prefix, self.soft.repeat(n), self.suffix)
    }
}

#[derive(Debug, Clone)]
pub struct MediaSpec {
    pub image: Option<(ImageProcessor, Slot)>,
    pub audio: Option<(AudioProcessor, Slot)>,
    /// A token whose embedding is zero in media prompts (Gemma 3: the pad
    /// token, as mlx-vlm's `get_input_embeddings`).
    pub zero_id: Option<u32>,
    /// Multimodal RoPE positions (Qwen3-VL), with the tower's spatial merge.
    pub mrope_merge: Option<usize>,
    /// Each image's tokens attend to one another both ways (Gemma 4).
    pub bidirectional: bool,
}

/// The media tokens a checkpoint names in tokenizer_config.json (top level,
/// or transformers 5's `extra_special_tokens`), checked against the
/// tokenizer.
struct Tokens<'a> {
    config: Value,
    text: &'a TextAssets,
}

impl Tokens<'_> {
    fn new<'a>(dir: &Path, text: &'a TextAssets) -> Tokens<'a> {
        let config = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null);
        Tokens { config, text }
    }

    fn string(&self, key: &str, default: &str) -> String {
        let c = &self.config;
        c.get("extra_special_tokens").and_then(|e| e.get(key)).or_else(|| c.get(key)).and_then(Value::as_str).unwrap_or(default).to_owned()
    }

    fn id(&self, token: &str) -> Result<u32> {
        self.text.tokenizer.token_to_id(token).ok_or_else(|| Error::model(format!("the tokenizer has no `{token}` token")))
    }

    /// Gemma 4's slot of one kind: the template's soft token becomes
    /// `begin + soft × n + end` (each a (tokenizer_config key, default)).
    fn slot(&self, config: &Value, begin: (&str, &str), soft: (&str, &str), end: (&str, &str), id_key: &str) -> Result<Slot> {
        let (begin, soft, end) = (self.string(begin.0, begin.1), self.string(soft.0, soft.1), self.string(end.0, end.1));
        let soft_id = self.checked_id(&soft, config, id_key)?;
        self.id(&begin)?;
        self.id(&end)?;
        Ok(Slot { placeholder: soft.clone(), prefix: begin, soft, suffix: end, soft_id })
    }

    /// The id of `token`, checked against the config's `key` when it has one.
    fn checked_id(&self, token: &str, config: &Value, key: &str) -> Result<u32> {
        let id = self.id(token)?;
        match config.get(key).and_then(Value::as_u64) {
            Some(want) if want != id as u64 => Err(Error::model(format!("{key} {want} is not the tokenizer's `{token}` ({id})"))),
            _ => Ok(id),
        }
    }
}

impl MediaSpec {
    /// Gemma 3: the fixed-size processor, `tokens_per_image` soft tokens.
    pub fn gemma3(dir: &Path, config: &Value, text: &TextAssets, tokens_per_image: usize) -> Result<MediaSpec> {
        let mut processor = ImageProcessor::load(dir)?
            .ok_or_else(|| Error::model("the checkpoint has a vision tower but no preprocessor_config.json"))?;
        processor.tokens = tokens_per_image;
        let t = Tokens::new(dir, text);
        let (boi, eoi, soft) =
            (t.string("boi_token", "<start_of_image>"), t.string("eoi_token", "<end_of_image>"), t.string("image_token", "<image_soft_token>"));
        let soft_id = t.checked_id(&soft, config, "image_token_index")?;
        t.id(&boi)?;
        t.id(&eoi)?;
        let slot = Slot { placeholder: boi.clone(), prefix: format!("\n\n{boi}"), soft, suffix: format!("{eoi}\n\n"), soft_id };
        let zero_id = Some(config.get("pad_token_id").and_then(Value::as_u64).unwrap_or(0) as u32);
        Ok(MediaSpec { image: Some((processor, slot)), audio: None, zero_id, mrope_merge: None, bidirectional: false })
    }

    /// Qwen3-VL: `smart_resize`d patches, one soft token per `merge²`.
    pub fn qwen3_vl(dir: &Path, config: &Value, text: &TextAssets, merge: usize) -> Result<MediaSpec> {
        let processor = ImageProcessor::qwen_vl(dir)?;
        if !matches!(processor.layout, super::process::Layout::Patches { merge: m, .. } if m == merge) {
            return Err(Error::model(format!("preprocessor_config.json: merge_size is not the vision tower's {merge}")));
        }
        let t = Tokens::new(dir, text);
        let soft = t.string("image_token", "<|image_pad|>");
        let key = if config.get("image_token_id").is_some() { "image_token_id" } else { "image_token_index" };
        let soft_id = t.checked_id(&soft, config, key)?;
        let slot = Slot { placeholder: soft.clone(), prefix: String::new(), soft, suffix: String::new(), soft_id };
        Ok(MediaSpec { image: Some((processor, slot)), audio: None, zero_id: None, mrope_merge: Some(merge), bidirectional: false })
    }

    /// Gemma 4, with a vision tower (its patch and pool sizes) and/or an
    /// audio tower: the processor settings from processor_config.json
    /// (`image_processor`, `feature_extractor`), else a flat
    /// preprocessor_config.json, as mlx-vlm's Gemma4Processor reads them.
    pub fn gemma4(dir: &Path, config: &Value, text: &TextAssets, vision: Option<(usize, usize)>, audio: bool) -> Result<MediaSpec> {
        let proc_config = match std::fs::read_to_string(dir.join("processor_config.json")) {
            Ok(s) => serde_json::from_str(&s).map_err(|e| Error::model(format!("processor_config.json: {e}")))?,
            Err(_) => read_config(dir)?.unwrap_or(Value::Null),
        };
        let t = Tokens::new(dir, text);
        let image = match vision {
            Some(patch_pool) => {
                let settings = match proc_config.get("image_processor") {
                    Some(ip) if ip.is_object() => ip.clone(),
                    _ => proc_config.clone(),
                };
                let processor = ImageProcessor::gemma4(&settings)?;
                if !matches!(processor.layout, super::process::Layout::PatchGrid { patch, pool } if (patch, pool) == patch_pool) {
                    return Err(Error::model(format!("processor config: patch_size and pooling_kernel_size are not the vision tower's {patch_pool:?}")));
                }
                Some((processor, t.slot(config, ("boi_token", "<|image>"), ("image_token", "<|image|>"), ("eoi_token", "<image|>"), "image_token_id")?))
            }
            None => None,
        };
        let audio = match audio {
            true => {
                let fe = proc_config.get("feature_extractor").cloned().unwrap_or(Value::Null);
                let processor = AudioProcessor::gemma4(&fe, &proc_config)?;
                Some((processor, t.slot(config, ("boa_token", "<|audio>"), ("audio_token", "<|audio|>"), ("eoa_token", "<audio|>"), "audio_token_id")?))
            }
            false => None,
        };
        let text_config = config.get("text_config").unwrap_or(config);
        let bidirectional = text_config.get("use_bidirectional_attention").and_then(Value::as_str) == Some("vision");
        Ok(MediaSpec { image, audio, zero_id: None, mrope_merge: None, bidirectional })
    }

    pub fn slot(&self, kind: MediaKind) -> Option<&Slot> {
        match kind {
            MediaKind::Image => self.image.as_ref().map(|(_, s)| s),
            MediaKind::Audio => self.audio.as_ref().map(|(_, s)| s),
        }
    }

    fn slots(&self) -> impl Iterator<Item = (MediaKind, &Slot)> {
        [MediaKind::Image, MediaKind::Audio].into_iter().filter_map(|k| self.slot(k).map(|s| (k, s)))
    }

    /// `rendered` with the `k`-th placeholder of each kind replaced by the
    /// expansion of the `k`-th item of that kind (left to right; what is put
    /// in is not scanned again). The placeholders must match the items.
    pub fn expand(&self, rendered: &str, items: &[MediaItem]) -> Result<String> {
        let mut queues: Vec<(MediaKind, &Slot, std::vec::IntoIter<usize>)> = self
            .slots()
            .map(|(k, s)| (k, s, items.iter().filter(|i| i.kind == k).map(|i| i.tokens).collect::<Vec<_>>().into_iter()))
            .collect();
        let (mut out, mut rest) = (String::with_capacity(rendered.len()), rendered);
        loop {
            let next = queues.iter_mut().filter_map(|q| rest.find(&q.1.placeholder).map(|at| (at, q))).min_by_key(|(at, _)| *at);
            let Some((at, (kind, slot, tokens))) = next else { break };
            let n = tokens.next().ok_or_else(|| too_many(*kind, &slot.placeholder, items))?;
            out.push_str(&rest[..at]);
            out.push_str(&slot.expansion(n));
            rest = &rest[at + slot.placeholder.len()..];
        }
        if let Some((kind, slot, left)) = queues.iter().find(|q| q.2.len() > 0) {
            let found = items.iter().filter(|i| i.kind == *kind).count() - left.len();
            return Err(Error::invalid(format!(
                "the chat template rendered {found} {} placeholder(s) `{}` for {} {} part(s)",
                kind.name(),
                slot.placeholder,
                found + left.len(),
                kind.name()
            )));
        }
        out.push_str(rest);
        Ok(out)
    }

    /// Where the items' soft tokens lie in the tokenized `prompt` (each
    /// item's in one run, in document order per kind).
    pub fn place(&self, prompt: &[u32], items: Vec<MediaItem>) -> Result<MediaPrompt> {
        let mut spans = Vec::with_capacity(items.len());
        let mut cursor = vec![0usize; 2];
        for item in &items {
            let slot = self.slot(item.kind).ok_or_else(|| Error::internal("an item without a slot"))?;
            let c = &mut cursor[item.kind as usize];
            let positions: Vec<usize> = prompt.iter().enumerate().skip(*c).filter(|(_, &t)| t == slot.soft_id).map(|(i, _)| i).take(item.tokens).collect();
            let run = positions.first().map_or(0..0, |&a| a..a + item.tokens);
            if positions.len() != item.tokens || positions.last().is_some_and(|&l| l + 1 != run.end) {
                return Err(Error::internal(format!(
                    "the prompt does not hold {} {} soft tokens `{}` in one run where the {} belongs",
                    item.tokens,
                    item.kind.name(),
                    slot.soft,
                    item.kind.name()
                )));
            }
            *c = run.end;
            spans.push(run);
        }
        for (kind, slot) in self.slots() {
            let want: usize = items.iter().filter(|i| i.kind == kind).map(|i| i.tokens).sum();
            let soft = prompt.iter().filter(|&&t| t == slot.soft_id).count();
            if soft != want {
                return Err(Error::internal(format!("the prompt has {soft} {} soft tokens; its parts need {want}", kind.name())));
            }
        }
        let zero = match self.zero_id {
            Some(z) => prompt.iter().enumerate().filter(|(_, &t)| t == z).map(|(i, _)| i).collect(),
            None => vec![],
        };
        let mrope = self.mrope_merge.map(|m| mrope(prompt.len(), &items, &spans, m));
        let blocks = match self.bidirectional {
            true => items.iter().zip(&spans).filter(|(i, _)| i.kind == MediaKind::Image).map(|(_, s)| s.clone()).collect(),
            false => vec![],
        };
        Ok(MediaPrompt { items, spans, zero, mrope, blocks })
    }
}

/// Qwen3-VL's multimodal RoPE positions of a prompt (mlx-vlm's
/// `get_rope_index`): text tokens count up on all three axes; an image's
/// tokens sit at (frame, row, column) of its merged patch grid from where
/// the text reached, and the text after it continues from one past its
/// largest. Returns every position's (t, h, w) and the delta decoding
/// continues with (largest position + 1 - length).
fn mrope(len: usize, items: &[MediaItem], spans: &[std::ops::Range<usize>], merge: usize) -> (Vec<[i32; 3]>, i32) {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| spans[i].start);
    let (mut pos, mut next, mut at) = (Vec::with_capacity(len), 0i32, 0usize);
    for i in order {
        for _ in at..spans[i].start {
            pos.push([next; 3]);
            next += 1;
        }
        let [t, h, w] = items[i].grid;
        let (h, w) = (h / merge, w / merge);
        for ti in 0..t {
            for hi in 0..h {
                for wi in 0..w {
                    pos.push([next + ti as i32, next + hi as i32, next + wi as i32]);
                }
            }
        }
        next += t.max(h).max(w) as i32;
        at = spans[i].end;
    }
    for _ in at..len {
        pos.push([next; 3]);
        next += 1;
    }
    (pos, next - len as i32)
}

fn too_many(kind: MediaKind, placeholder: &str, items: &[MediaItem]) -> Error {
    let n = items.iter().filter(|i| i.kind == kind).count();
    Error::invalid(format!("the chat template rendered more {} placeholders `{placeholder}` than the {n} {} part(s)", kind.name(), kind.name()))
}

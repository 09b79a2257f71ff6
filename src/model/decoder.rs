//! The pre-norm decoder stack that Llama, Qwen2, Qwen3, Qwen3-MoE and
//! Qwen3-VL's language model share: `h += attn(norm(h)); h += ffn(norm(h))`
//! per block, a final norm and the output head. The family files (llama.rs,
//! qwen2.rs, qwen3.rs, qwen3_moe.rs) read their configs and checkpoints into
//! it. Media prompts (Qwen3-VL) splice the tower's rows into the input
//! embeddings, rotate by each token's (t, h, w) position and add the
//! deepstack rows after the first layers, as mlx-vlm's qwen3_vl.

use super::attention::Attention;
use super::layers::{Embedding, Head, Mlp, RmsNorm};
use super::moe::SparseMoe;
use super::pass::Pass;
use super::{Group, LanguageModel, MediaInput, ModelInfo, Output};
use crate::cache::scheme::KvLayer;
use crate::cache::{KvCache, LayerCache, Positions};
use crate::error::{Error, Result};
use crate::mlx::Array;

/// A block's feed-forward part.
pub enum Ffn {
    Dense(Mlp),
    Moe(SparseMoe),
}

impl Ffn {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Moe(m) => m.forward(x),
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Ffn::Dense(m) => m.arrays(),
            Ffn::Moe(m) => m.arrays(),
        }
    }
}

pub struct Block {
    pub attn: Attention,
    pub ffn: Ffn,
    pub input_norm: RmsNorm,
    pub post_norm: RmsNorm,
}

pub struct Decoder {
    pub embed: Embedding,
    pub blocks: Vec<Block>,
    pub norm: RmsNorm,
    pub head: Head,
    pub info: ModelInfo,
}

impl Decoder {
    /// The blocks over input embeddings `h` (`[B, L, dim]`, or the packed
    /// `[1, T, dim]` of a mixed pass); `after(i, h)` is applied to the
    /// output of each of the first `touched` blocks. Each residual add runs
    /// with the norm that follows it (one node).
    fn run(&self, mut h: Array, mut pass: Pass, after: impl Fn(usize, Array) -> Result<Array>, touched: usize) -> Result<Option<Array>> {
        let Some(first) = self.blocks.first() else { return Err(Error::internal("a model without blocks")) };
        let mut x = first.input_norm.forward(&h)?;
        for (i, blk) in self.blocks.iter().enumerate() {
            let a = blk.attn.forward(&x, &mut pass, i)?;
            let (h1, y) = blk.post_norm.add_forward(&h, &a)?;
            let m = blk.ffn.forward(&y)?;
            match self.blocks.get(i + 1) {
                Some(next) if i >= touched => (h, x) = next.input_norm.add_forward(&h1, &m)?,
                next => {
                    h = h1.add(&m)?;
                    if i < touched {
                        h = after(i, h)?;
                    }
                    if let Some(next) = next {
                        x = next.input_norm.forward(&h)?;
                    }
                }
            }
            pass.settle(&h)?;
        }
        pass.logits(h, |h| self.head.forward(&self.norm.forward(h)?, &self.embed))
    }
}

impl LanguageModel for Decoder {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self, rows: usize) -> Vec<LayerCache> {
        (0..self.blocks.len()).map(|_| LayerCache::Kv(KvCache::new(rows))).collect()
    }

    fn kv_layers(&self) -> Vec<Option<KvLayer>> {
        self.blocks.iter().map(|b| Some(b.attn.kv_layer())).collect()
    }

    fn forward(&self, tokens: &Array, cache: &mut [LayerCache], out: Output) -> Result<Option<Array>> {
        let pass = Pass::single(cache, tokens.dim(1), out, self.blocks.len())?;
        self.run(self.embed.forward(tokens)?, pass, |_, h| Ok(h), 0)
    }

    /// The tower's rows spliced at their positions; with multimodal RoPE
    /// every token at its (t, h, w) position, and the row's RoPE delta set
    /// for decoding; deepstack rows added after the first layers.
    fn forward_media(&self, tokens: &Array, media: &MediaInput, cache: &mut [LayerCache], out: Output) -> Result<Option<Array>> {
        let h = media.splice(&self.embed.forward(tokens)?)?;
        let l = tokens.dim(1);
        let sections = match &media.mrope {
            Some((p, _)) if p.len() == l as usize => {
                let flat: Vec<i32> = (0..3).flat_map(|a| p.iter().map(move |t| t[a])).collect();
                Some(Positions::Sections(Array::from_i32(&flat, &[3, 1, l])?))
            }
            Some(_) => return Err(Error::internal("multimodal positions do not fit the chunk")),
            None => None,
        };
        if media.deepstack.len() > self.blocks.len() {
            return Err(Error::internal("more deepstack layers than the model has"));
        }
        let mut pass = Pass::single(cache, l, out, self.blocks.len())?;
        if let Some(pos) = sections {
            pass.set_positions(pos)?;
        }
        let logits = self.run(h, pass, |i, h| media.add_deepstack(i, &h), media.deepstack.len())?;
        if let Some((_, delta)) = media.mrope {
            cache.iter_mut().for_each(|c| c.set_rope_delta(0, delta));
        }
        Ok(logits)
    }

    fn supports_mixed(&self) -> bool {
        true
    }

    fn forward_mixed(&self, tokens: &Array, groups: &mut [Group]) -> Result<Option<Array>> {
        self.run(self.embed.forward(tokens)?, Pass::mixed(tokens, groups, self.blocks.len())?, |_, h| Ok(h), 0)
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = self.embed.arrays();
        for b in &self.blocks {
            v.extend(b.attn.arrays());
            v.extend(b.ffn.arrays());
            v.push(&b.input_norm.w);
            v.push(&b.post_norm.w);
        }
        v.push(&self.norm.w);
        v.extend(self.head.arrays());
        v
    }
}

//! The pre-norm decoder stack that Llama, Qwen2, Qwen3 and Qwen3-MoE share:
//! `h += attn(norm(h)); h += ffn(norm(h))` per block, a final norm and the
//! output head. The family files (llama.rs, qwen2.rs, qwen3.rs,
//! qwen3_moe.rs) read their configs and checkpoints into it.

use super::attention::Attention;
use super::layers::{Embedding, Head, Mlp, RmsNorm};
use super::moe::SparseMoe;
use super::pass::Pass;
use super::{Group, LanguageModel, ModelInfo, Output};
use crate::cache::scheme::KvLayer;
use crate::cache::{KvCache, LayerCache};
use crate::error::Result;
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
    fn run(&self, tokens: &Array, mut pass: Pass) -> Result<Option<Array>> {
        let mut h = self.embed.forward(tokens)?;
        for (i, blk) in self.blocks.iter().enumerate() {
            let a = blk.attn.forward(&blk.input_norm.forward(&h)?, &mut pass, i)?;
            h = h.add(&a)?;
            let m = blk.ffn.forward(&blk.post_norm.forward(&h)?)?;
            h = h.add(&m)?;
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

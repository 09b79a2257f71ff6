//! The pre-norm decoder stack that Llama, Qwen2, Qwen3 and Qwen3-MoE share:
//! `h += attn(norm(h)); h += ffn(norm(h))` per block, a final norm and the
//! output head. The family files (llama.rs, qwen2.rs, qwen3.rs,
//! qwen3_moe.rs) read their configs and checkpoints into it.

use super::attention::{AttnGroup, Attention, Masks};
use super::layers::{output_positions, Embedding, Head, Mlp, RmsNorm};
use super::moe::SparseMoe;
use super::{Group, LanguageModel, ModelInfo, Output};
use crate::cache::scheme::KvLayer;
use crate::cache::{KvCache, LayerCache};
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
        if cache.len() != self.blocks.len() {
            return Err(Error::internal("cache has the wrong number of layers"));
        }
        let pos = cache[0].positions()?;
        let masks = Masks::new(cache, tokens.dim(1))?;
        let mut h = self.embed.forward(tokens)?;
        for (blk, c) in self.blocks.iter().zip(cache.iter_mut()) {
            let a = blk.attn.forward(&blk.input_norm.forward(&h)?, c, &pos, &masks)?;
            h = h.add(&a)?;
            let m = blk.ffn.forward(&blk.post_norm.forward(&h)?)?;
            h = h.add(&m)?;
        }
        let Some(h) = output_positions(h, out)? else { return Ok(None) };
        let h = self.norm.forward(&h)?;
        Ok(Some(self.head.forward(&h, &self.embed)?))
    }

    fn supports_mixed(&self) -> bool {
        true
    }

    fn forward_mixed(&self, tokens: &Array, groups: &mut [Group]) -> Result<Option<Array>> {
        if groups.iter().any(|g| g.cache.len() != self.blocks.len()) {
            return Err(Error::internal("cache has the wrong number of layers"));
        }
        let mut ctx = Vec::with_capacity(groups.len());
        for g in groups.iter() {
            ctx.push((g.cache[0].positions()?, Masks::new(g.cache, g.len)?));
        }
        let mut h = self.embed.forward(tokens)?;
        for (i, blk) in self.blocks.iter().enumerate() {
            let mut parts: Vec<AttnGroup> = (groups.iter_mut().zip(&ctx))
                .map(|(g, (pos, masks))| AttnGroup { cache: &mut g.cache[i], pos, masks, rows: g.rows, len: g.len })
                .collect();
            let a = blk.attn.forward_groups(&blk.input_norm.forward(&h)?, &mut parts)?;
            h = h.add(&a)?;
            let m = blk.ffn.forward(&blk.post_norm.forward(&h)?)?;
            h = h.add(&m)?;
        }
        let (mut at, mut idx) = (0, vec![]);
        for g in groups.iter() {
            idx.extend(g.outputs().into_iter().map(|p| at + p));
            at += g.rows * g.len;
        }
        if idx.is_empty() {
            return Ok(None);
        }
        let n = idx.len() as i32;
        let h = h.take(&Array::from_i32(&idx, &[n])?, 1)?;
        let h = self.norm.forward(&h)?;
        Ok(Some(self.head.forward(&h, &self.embed)?.reshape(&[n, -1])?))
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

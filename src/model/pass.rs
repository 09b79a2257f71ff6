//! The sequences of one forward pass, so that each family writes its block
//! loop once for `LanguageModel::forward` (one batch of rows) and
//! `forward_mixed` (several groups packed into `[1, T]`, each with its own
//! caches). Token-wise work (embeddings, norms, projections, MLP/MoE) runs on
//! the pass's whole input; sequence mixers (attention, linear attention) run
//! through `Pass::each`, once per group; `Pass::logits` picks the positions
//! the output needs. A single pass adds no op to what its forward computes.

use super::attention::Masks;
use super::layers::output_positions;
use super::{Group, Output};
use crate::cache::{LayerCache, Positions};
use crate::error::{Error, Result};
use crate::mlx::Array;

/// Passes of at least this many tokens compute block by block (`settle`).
const SETTLE_TOKENS: i32 = 256;

/// What the sequence mixers of one set of rows need besides its caches,
/// computed once for all layers (the caches share one timeline).
pub struct SeqCtx {
    /// RoPE positions of the new tokens (from the first attention cache).
    pub pos: Positions,
    pub masks: Masks,
    /// `[B, L]`, true at real tokens, for recurrent layers when some new
    /// positions are padding (`StateCache::token_mask`).
    pub token_mask: Option<Array>,
}

impl SeqCtx {
    fn new(cache: &[LayerCache], len: i32) -> Result<SeqCtx> {
        let attn = cache
            .iter()
            .find(|c| !matches!(c, LayerCache::State(_)))
            .ok_or_else(|| Error::internal("a model without an attention layer cache"))?;
        let state = cache.iter().find_map(|c| match c {
            LayerCache::State(s) => Some(s),
            _ => None,
        });
        Ok(SeqCtx {
            pos: attn.positions()?,
            masks: Masks::new(cache, len)?,
            token_mask: state.map(|s| s.token_mask(len)).transpose()?.flatten(),
        })
    }
}

/// The rows one forward pass runs.
pub enum Pass<'a, 'g> {
    /// `forward`: `[B, L]` tokens after what `cache` holds.
    Single { cache: &'a mut [LayerCache], ctx: SeqCtx, out: Output },
    /// `forward_mixed`: the groups' tokens packed into `[1, T]`.
    Mixed { groups: &'a mut [Group<'g>], ctx: Vec<SeqCtx> },
}

fn check_layers(cache: &[LayerCache], layers: usize) -> Result<()> {
    match cache.len() == layers {
        true => Ok(()),
        false => Err(Error::internal("cache has the wrong number of layers")),
    }
}

impl<'a, 'g> Pass<'a, 'g> {
    /// `len` new tokens per row after `cache` (a model's `layers` caches).
    pub fn single(cache: &'a mut [LayerCache], len: i32, out: Output, layers: usize) -> Result<Pass<'a, 'g>> {
        check_layers(cache, layers)?;
        let ctx = SeqCtx::new(cache, len)?;
        Ok(Pass::Single { cache, ctx, out })
    }

    /// Rotates a single pass's tokens at `pos` instead of its caches'
    /// positions (a media prompt's multimodal RoPE positions).
    pub fn set_positions(&mut self, pos: Positions) -> Result<()> {
        match self {
            Pass::Single { ctx, .. } => Ok(ctx.pos = pos),
            Pass::Mixed { .. } => Err(Error::internal("media positions in a mixed forward")),
        }
    }

    /// Attends a single pass's tokens with `masks` instead of its caches'
    /// (a media prompt's bidirectional spans).
    pub fn set_masks(&mut self, masks: Masks) -> Result<()> {
        match self {
            Pass::Single { ctx, .. } => Ok(ctx.masks = masks),
            Pass::Mixed { .. } => Err(Error::internal("media masks in a mixed forward")),
        }
    }

    /// `tokens` (`[1, T]`) packed from `groups`, in order.
    pub fn mixed(tokens: &Array, groups: &'a mut [Group<'g>], layers: usize) -> Result<Pass<'a, 'g>> {
        let mut ctx = Vec::with_capacity(groups.len());
        for g in groups.iter() {
            check_layers(g.cache, layers)?;
            ctx.push(SeqCtx::new(g.cache, g.len)?);
        }
        let total: i32 = groups.iter().map(|g| g.rows * g.len).sum();
        if tokens.ndim() != 2 || tokens.dim(0) != 1 || tokens.dim(1) != total {
            return Err(Error::internal(format!("mixed forward: tokens {:?} for groups of {total} tokens", tokens.shape())));
        }
        Ok(Pass::Mixed { groups, ctx })
    }

    /// Runs a sequence mixer: `f(group, inputs, caches, ctx)` per group on
    /// its part of `inputs` (each `[B, L, …]` for a single pass, `[1, T, …]`
    /// packed for a mixed one) as `[rows, len, …]`, with its caches and
    /// context. `f` returns `[rows, len, …]`; the result is laid out as the
    /// inputs are.
    pub fn each(
        &mut self,
        inputs: Vec<Array>,
        mut f: impl FnMut(usize, Vec<Array>, &mut [LayerCache], &SeqCtx) -> Result<Array>,
    ) -> Result<Array> {
        let (groups, ctx) = match self {
            Pass::Single { cache, ctx, .. } => return f(0, inputs, cache, ctx),
            Pass::Mixed { groups, ctx } => (groups, ctx),
        };
        let (mut parts, mut at) = (Vec::with_capacity(groups.len()), 0);
        for (i, (g, c)) in groups.iter_mut().zip(ctx.iter()).enumerate() {
            let n = g.rows * g.len;
            let part = |a: &Array| -> Result<Array> {
                let mut s = a.shape();
                s.splice(0..2, [g.rows, g.len]);
                Ok(a.slice_axis(1, at, at + n)?.reshape(&s)?)
            };
            let xs = inputs.iter().map(part).collect::<Result<Vec<_>>>()?;
            let y = f(i, xs, g.cache, c)?;
            let mut s = y.shape();
            s.splice(0..2, [1, n]);
            parts.push(y.reshape(&s)?);
            at += n;
        }
        if inputs.iter().any(|a| a.dim(1) != at) {
            return Err(Error::internal("mixed forward: the groups do not cover the input"));
        }
        Ok(Array::concatenate(&parts.iter().collect::<Vec<_>>(), 1)?)
    }

    /// Ends a block of a pass of many tokens (a prefill chunk) by computing
    /// its output `h`. Otherwise MLX's graph building runs dozens of ops
    /// ahead of the CPU stream, each with its output allocated: for a
    /// 1024-token chunk of SmolLM2 about 70 MB more peak memory (4096-token
    /// prompt: `EngineStats::peak_memory` 421 -> 349 MiB), for no speed (a block of such a chunk
    /// computes for milliseconds; waiting for it costs microseconds).
    pub fn settle(&self, h: &Array) -> Result<()> {
        match h.dim(0) * h.dim(1) >= SETTLE_TOKENS {
            true => Ok(h.eval()?),
            false => Ok(()),
        }
    }

    /// The logits the pass's output asks for, `head` applied to the hidden
    /// states `h` of those positions only: for a single pass what its
    /// `Output` says (`[B, 1 or L, vocab]`), for a mixed one the positions
    /// each group's `out` asks for, as `[n, vocab]` rows in group order.
    /// None when nothing is asked for.
    pub fn logits(&self, h: Array, head: impl FnOnce(&Array) -> Result<Array>) -> Result<Option<Array>> {
        let groups = match self {
            Pass::Single { out, .. } => return output_positions(h, *out)?.map(|h| head(&h)).transpose(),
            Pass::Mixed { groups, .. } => groups,
        };
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
        Ok(Some(head(&h)?.reshape(&[n, -1])?))
    }
}

//! Grouped-query self-attention as the Llama, Qwen and Gemma families use it:
//! fused q/k/v projections (biases where the checkpoint has them), optional
//! per-head RMSNorm of queries and keys, RoPE (possibly over part of each
//! head), the layer's KV cache (a ring for a sliding window), and an optional
//! sigmoid output gate computed by the query projection (Qwen3-Next).
//! Under `Kernels::Auto` float KV attends through mlxrt's fused CPU
//! attention (`mlx::fused_sdpa`; a sliding window computed in the kernel).

use super::layers::{FusedLinear, Kernels, Linear, LinearGroup, RmsNorm, Rope};
use super::pass::Pass;
use super::weights::Weights;
use crate::cache::scheme::KvLayer;
use crate::cache::{AttnMask, KvView, LayerCache, Positions};
use crate::error::{Error, Result};
use crate::mlx::fast::Mask;
use crate::mlx::{fused_sdpa_merged, Array, Dtype, HeadPart};
use std::rc::Rc;

/// The masks of one forward pass, computed once for all layers (the layers'
/// caches share one timeline): for full-attention layers from their KV
/// caches, for sliding-window layers over the keys their rings return
/// (paged layers need none).
pub struct Masks {
    full: Option<AttnMask>,
    window: Option<AttnMask>,
    /// `Some(w)` when `window` is exactly "causal, each query sees its last
    /// `w` keys" over the ring's keys (several new tokens, no padding among
    /// the keys): the fused kernel then computes it instead of reading it.
    causal_window: Option<i32>,
}

impl Masks {
    /// Given masks for the full-attention and the sliding layers (a media
    /// prompt's bidirectional spans).
    pub fn given(full: AttnMask, window: AttnMask) -> Masks {
        Masks { full: Some(full), window: Some(window), causal_window: None }
    }

    /// The masks for `n` new tokens over a model's layer caches.
    pub fn new(cache: &[LayerCache], n: i32) -> Result<Masks> {
        // Paged layers attend causally over each row's own length (the
        // kernels' bounds): their mask is only a placeholder.
        let paged = |window: bool| {
            cache.iter().any(|c| matches!(c, LayerCache::Paged(p) if p.layer().window.is_some() == window)).then_some(AttnMask::Causal)
        };
        let full = cache.iter().find_map(|c| c.kv().ok()).map(|c| c.mask(n)).transpose()?.or_else(|| paged(false));
        let ring = cache.iter().find_map(LayerCache::ring);
        let window = ring.map(|c| c.mask(n)).transpose()?.or_else(|| paged(true));
        // As `RingCache::mask`: for n > 1 the keys run in temporal order from
        // `start`, and padding past `start` is what else it would mask.
        let causal_window = ring.filter(|_| n > 1).and_then(|c| {
            let start = (c.len() - c.window() + 1).max(0);
            c.timeline().pads().iter().all(|&p| p <= start).then_some(c.window())
        });
        Ok(Masks { full, window, causal_window })
    }

    pub fn full(&self) -> Result<&AttnMask> {
        self.full.as_ref().ok_or_else(|| Error::internal("a full-attention layer in a model without its cache"))
    }

    pub fn window(&self) -> Result<&AttnMask> {
        self.window.as_ref().ok_or_else(|| Error::internal("a sliding-window layer in a model without its cache"))
    }
}

/// Shapes and options of an attention layer.
pub struct AttnSpec {
    pub dim: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    /// Biases on q/k/v are taken when present; `bias` makes them required.
    pub bias: bool,
    /// Per-head RMSNorm of queries and keys (`q_norm`, `k_norm`) with this eps.
    pub qk_norm: Option<f32>,
    /// Gemma's `(1 + w)` norm weights.
    pub norm_offset: bool,
    pub scale: f32,
    pub window: Option<i32>,
    /// `q_proj` also yields a per-head gate (its output is `[q | gate]` per
    /// head); the attention output is multiplied by `sigmoid(gate)`.
    pub output_gate: bool,
}

pub struct Attention {
    qkv: LinearGroup,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    rope: Rc<Rope>,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    scale: f32,
    window: Option<i32>,
    output_gate: bool,
    kernels: Kernels,
}

impl Attention {
    /// Loads `{prefix}.{q,k,v,o}_proj` (and `q_norm`, `k_norm`).
    pub fn load(w: &mut Weights, prefix: &str, s: &AttnSpec, rope: Rc<Rope>) -> Result<Attention> {
        let (d, hd, nh, nkv) = (s.dim, s.head_dim, s.heads, s.kv_heads);
        let norm = |w: &mut Weights, name: &str, eps: f32| -> Result<RmsNorm> {
            let t = w.take_shaped(&format!("{prefix}.{name}.weight"), &[hd])?;
            if s.norm_offset {
                RmsNorm::offset(t, eps)
            } else {
                Ok(RmsNorm { w: t, eps })
            }
        };
        let (q_norm, k_norm) = match s.qk_norm {
            Some(eps) => (Some(norm(w, "q_norm", eps)?), Some(norm(w, "k_norm", eps)?)),
            None => (None, None),
        };
        let q_out = if s.output_gate { 2 * nh * hd } else { nh * hd };
        Ok(Attention {
            qkv: FusedLinear::new(vec![
                (w.linear(&format!("{prefix}.q_proj"), d, q_out, s.bias)?, q_out),
                (w.linear(&format!("{prefix}.k_proj"), d, nkv * hd, s.bias)?, nkv * hd),
                (w.linear(&format!("{prefix}.v_proj"), d, nkv * hd, s.bias)?, nkv * hd),
            ])?,
            o: w.linear(&format!("{prefix}.o_proj"), nh * hd, d, false)?,
            q_norm,
            k_norm,
            rope,
            heads: nh,
            kv_heads: nkv,
            head_dim: hd,
            scale: s.scale,
            window: s.window,
            output_gate: s.output_gate,
            kernels: w.kernels(),
        })
    }

    /// Attends through layer `layer`'s cache of each of the pass's row
    /// sets (a `KvCache` for a full layer, a `RingCache` of the layer's
    /// window for a sliding one) with their positions and masks. The
    /// projections run on the whole input at once.
    pub fn forward(&self, x: &Array, pass: &mut Pass, layer: usize) -> Result<Array> {
        let (parts, gate) = self.project(x)?;
        let o = pass.each(parts, |_, parts, cache, ctx| {
            let [q, k, v] = self.heads(parts, &ctx.pos, cache[layer].kv_write_dtype())?;
            self.attend(q, k, v, &mut cache[layer], &ctx.masks)
        })?;
        self.output(o, gate)
    }

    /// The projections of `x` (`[b, l, dim]`) as `heads` takes them: the
    /// stacked q/k/v output when the layer stacks them (one array), else
    /// q, k and v; and the output gate if any.
    fn project(&self, x: &Array) -> Result<(Vec<Array>, Option<Array>)> {
        if !self.output_gate {
            if let Some(qkv) = self.qkv.forward_packed(x)? {
                return Ok((vec![qkv], None));
            }
        }
        let mut qkv = self.qkv.forward(x)?;
        if !self.output_gate {
            return Ok((qkv, None));
        }
        // `[q | gate]` per head.
        let (b, l, hd) = (x.dim(0), x.dim(1), self.head_dim);
        let qg = qkv[0].reshape(&[b, l, self.heads, 2 * hd])?;
        let gate = qg.slice_axis(-1, hd, 2 * hd)?.reshape(&[b, l, self.heads * hd])?;
        qkv[0] = qg.slice_axis(-1, 0, hd)?;
        Ok((qkv, Some(gate)))
    }

    /// Queries, keys and values `[b, heads, l, head_dim]`, per-head norms
    /// applied and rotated at `pos`, from `project`'s arrays (`[b, l, …]`).
    /// From a stacked projection this is one mlxrt node on the CPU
    /// (`Rope::heads`, the same bits as the ops), which also gives keys and
    /// values in the cache's `kv_dtype` (f16 / bf16) instead of its cast.
    fn heads(&self, mut parts: Vec<Array>, pos: &Positions, kv_dtype: Option<Dtype>) -> Result<[Array; 3]> {
        let (hd, nq, nkv) = (self.head_dim, self.heads, self.kv_heads);
        if let [qkv] = parts.as_slice() {
            let kv = match kv_dtype {
                Some(d @ (Dtype::F16 | Dtype::BF16)) => d,
                _ => Dtype::F32,
            };
            let spec = [
                HeadPart { col: 0, heads: nq, rotate: true, dtype: Dtype::F32 },
                HeadPart { col: nq * hd, heads: nkv, rotate: true, dtype: kv },
                HeadPart { col: (nq + nkv) * hd, heads: nkv, rotate: false, dtype: kv },
            ];
            if let Some(h) = self.rope.heads(qkv, &spec, hd, pos, [self.q_norm.as_ref(), self.k_norm.as_ref()])? {
                return Ok(h.try_into().expect("three parts"));
            }
            parts = spec.iter().map(|p| qkv.slice_axis(-1, p.col, p.col + p.heads * hd)).collect::<std::result::Result<_, _>>()?;
        }
        let (b, l) = (parts[0].dim(0), parts[0].dim(1));
        // Norms act per head, before the heads move to axis 1.
        let to_heads = |y: &Array, h: i32, norm: &Option<RmsNorm>| -> Result<Array> {
            let y = if y.ndim() == 3 { y.reshape(&[b, l, h, hd])? } else { y.share() };
            let y = match norm {
                Some(n) => n.forward(&y)?,
                None => y,
            };
            Ok(y.transpose(&[0, 2, 1, 3])?)
        };
        let q = self.rope.forward(&to_heads(&parts[0], nq, &self.q_norm)?, pos)?;
        let k = self.rope.forward(&to_heads(&parts[1], nkv, &self.k_norm)?, pos)?;
        Ok([q, k, to_heads(&parts[2], nkv, &None)?])
    }

    /// Attention of rotated `[b, heads, l, head_dim]` queries, keys and
    /// values through `cache`; `[b, l, heads * head_dim]`.
    fn attend(&self, q: Array, k: Array, v: Array, cache: &mut LayerCache, masks: &Masks) -> Result<Array> {
        Ok(match (self.window, cache) {
            (Some(w), LayerCache::Ring(c)) if c.window() == w => {
                let (keys, values) = c.update_and_fetch(&k, &v)?;
                match (self.kernels, masks.causal_window) {
                    (Kernels::Auto, Some(cw)) if cw == w => {
                        fused_sdpa_merged(&q, &keys, &values, self.scale, Mask::Causal, Some(w))?
                    }
                    _ => KvView::Dense { keys, values }.attend_merged(&q, self.scale, masks.window()?, self.kernels)?,
                }
            }
            // Causal over each row's own length (and window), whatever the masks.
            (w, LayerCache::Paged(c)) if c.layer().window == w => {
                c.update_with(&k, &v, self.kernels)?.attend_merged(&q, self.scale, &AttnMask::Causal, self.kernels)?
            }
            (None, c) => c.kv_mut()?.update_with(&k, &v, self.kernels)?.attend_merged(&q, self.scale, masks.full()?, self.kernels)?,
            (Some(w), _) => return Err(Error::internal(format!("a layer with a window of {w} got no ring of that size"))),
        })
    }

    /// The output projection of the attention result (gated if the layer is).
    fn output(&self, o: Array, gate: Option<Array>) -> Result<Array> {
        match gate {
            Some(g) => self.o.forward(&o.multiply(&g.sigmoid()?)?),
            None => self.o.forward(&o),
        }
    }

    /// The shape of this layer's cache entries.
    pub fn kv_layer(&self) -> KvLayer {
        KvLayer { kv_heads: self.kv_heads, k_dim: self.head_dim, v_dim: self.head_dim, window: self.window }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = self.qkv.arrays();
        v.extend(self.o.arrays());
        v.extend(self.q_norm.iter().chain(self.k_norm.iter()).map(|n| &n.w));
        v
    }
}

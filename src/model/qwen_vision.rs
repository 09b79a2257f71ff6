//! Qwen3-VL's vision tower, op for op as mlx-vlm's qwen3_vl (vision.py):
//! - patch embedding: a stride-equals-kernel 3-D convolution over
//!   `temporal × patch × patch` pixels, as one matmul over the processor's
//!   patch rows;
//! - a learned square table of position embeddings, bilinearly interpolated
//!   to each image's patch grid;
//! - pre-LayerNorm blocks of full attention within each image (2-D RoPE:
//!   half of each head rotated by the patch row, half by its column) and a
//!   tanh-GELU MLP;
//! - the merger: LayerNorm, then each 2×2 group of patches concatenated and
//!   projected (exact GELU) into the language model's width; "deepstack"
//!   mergers (the LayerNorm after the concatenation) give the outputs of some
//!   blocks too, which the language model adds after its first layers.
//! Tensor names are the checkpoint's (`vision_tower.…`).

use super::layers::{gelu, gelu_tanh, LayerNorm, Linear};
use super::media::{Encoded, Tower};
use super::weights::Weights;
use crate::error::{Error, Result};
use crate::media::MediaItem;
use crate::mlx::fast::{self, Mask};
use crate::mlx::Array;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
struct VisionConfig {
    depth: i32,
    hidden_size: i32,
    intermediate_size: i32,
    out_hidden_size: i32,
    num_heads: i32,
    patch_size: i32,
    #[serde(default = "two")]
    spatial_merge_size: i32,
    #[serde(default = "two")]
    temporal_patch_size: i32,
    #[serde(default = "three")]
    in_channels: i32,
    num_position_embeddings: i32,
    #[serde(default)]
    deepstack_visual_indexes: Vec<i32>,
}

fn two() -> i32 {
    2
}
fn three() -> i32 {
    3
}

struct Block {
    norm1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// LayerNorm (before or after concatenating each merge group), fc1, exact
/// GELU, fc2.
struct Merger {
    norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    postshuffle: bool,
}

impl Merger {
    fn load(w: &mut Weights, p: &str, hidden: i32, merged: i32, out: i32, postshuffle: bool) -> Result<Merger> {
        Ok(Merger {
            norm: LayerNorm::load(w, &format!("{p}.norm"), if postshuffle { merged } else { hidden }, 1e-6)?,
            fc1: w.linear(&format!("{p}.linear_fc1"), merged, merged, true)?,
            fc2: w.linear(&format!("{p}.linear_fc2"), merged, out, true)?,
            postshuffle,
        })
    }

    fn forward(&self, x: &Array, merged: i32) -> Result<Array> {
        let x = if self.postshuffle {
            self.norm.forward(&x.reshape(&[-1, merged])?)?
        } else {
            self.norm.forward(x)?.reshape(&[-1, merged])?
        };
        self.fc2.forward(&gelu(&self.fc1.forward(&x)?)?)
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![&self.norm.w, &self.norm.b];
        v.extend(self.fc1.arrays());
        v.extend(self.fc2.arrays());
        v
    }
}

pub struct QwenVision {
    /// `[temporal · patch · patch · channels, hidden]`.
    patch_w: Array,
    patch_b: Array,
    /// `[side², hidden]`.
    pos_embed: Array,
    side: i32,
    blocks: Vec<Block>,
    merger: Merger,
    /// The blocks whose output a deepstack merger takes, and the mergers.
    deepstack: Vec<(usize, Merger)>,
    heads: i32,
    hidden: i32,
    patch: i32,
    temporal: i32,
    merge: i32,
    channels: i32,
    /// RoPE inverse frequencies of the patch rows and columns (`head_dim / 4`).
    inv_freq: Array,
}

impl QwenVision {
    /// Builds the tower when `config` has a `vision_config` and the
    /// checkpoint its tensors (`None` otherwise).
    pub fn load(config: &Value, text_hidden: i32, w: &mut Weights) -> Result<Option<QwenVision>> {
        let Some(vc) = config.get("vision_config").filter(|v| v.is_object()) else { return Ok(None) };
        if !w.contains("vision_tower.patch_embed.proj.weight") {
            return Ok(None);
        }
        let cfg: VisionConfig =
            serde_json::from_value(vc.clone()).map_err(|e| Error::model(format!("config.json vision_config: {e}")))?;
        let (d, p, t, c, m) = (cfg.hidden_size, cfg.patch_size, cfg.temporal_patch_size, cfg.in_channels, cfg.spatial_merge_size);
        let side = (cfg.num_position_embeddings as f64).sqrt() as i32;
        let hd = d / cfg.num_heads.max(1);
        if p <= 0 || t <= 0 || m <= 0 || c <= 0 || side * side != cfg.num_position_embeddings || d % cfg.num_heads.max(1) != 0 || hd % 4 != 0 {
            return Err(Error::model("config.json: vision_config's sizes do not fit together"));
        }
        if cfg.out_hidden_size != text_hidden {
            return Err(Error::model(format!("vision_config.out_hidden_size {} is not the text hidden size {text_hidden}", cfg.out_hidden_size)));
        }
        let v = "vision_tower";
        // MLX's Conv3d weight: [out, t, p, p, in].
        let patch_w = w.take_shaped(&format!("{v}.patch_embed.proj.weight"), &[d, t, p, p, c])?;
        let patch_b = w.take_shaped(&format!("{v}.patch_embed.proj.bias"), &[d])?;
        let pos_embed = w.take_shaped(&format!("{v}.pos_embed.weight"), &[side * side, d])?;
        let mut blocks = vec![];
        for i in 0..cfg.depth {
            let b = format!("{v}.blocks.{i}");
            blocks.push(Block {
                norm1: LayerNorm::load(w, &format!("{b}.norm1"), d, 1e-6)?,
                qkv: w.linear(&format!("{b}.attn.qkv"), d, 3 * d, true)?,
                proj: w.linear(&format!("{b}.attn.proj"), d, d, true)?,
                norm2: LayerNorm::load(w, &format!("{b}.norm2"), d, 1e-6)?,
                fc1: w.linear(&format!("{b}.mlp.linear_fc1"), d, cfg.intermediate_size, true)?,
                fc2: w.linear(&format!("{b}.mlp.linear_fc2"), cfg.intermediate_size, d, true)?,
            });
        }
        let merged = d * m * m;
        let merger = Merger::load(w, &format!("{v}.merger"), d, merged, cfg.out_hidden_size, false)?;
        let mut deepstack = vec![];
        for (j, &layer) in cfg.deepstack_visual_indexes.iter().enumerate() {
            if layer < 0 || layer >= cfg.depth {
                return Err(Error::model(format!("vision_config.deepstack_visual_indexes: no block {layer}")));
            }
            let p = format!("{v}.deepstack_merger_list.{j}");
            deepstack.push((layer as usize, Merger::load(w, &p, d, merged, cfg.out_hidden_size, true)?));
        }
        // VisionRotaryEmbedding(head_dim / 2): 1 / 10000^(2i / dim).
        let dim = hd / 2;
        let inv: Vec<f32> = (0..dim).step_by(2).map(|i| 1.0 / 10000f32.powf(i as f32 / dim as f32)).collect();
        Ok(Some(QwenVision {
            patch_w: patch_w.reshape(&[d, t * p * p * c])?.transpose(&[1, 0])?,
            patch_b,
            pos_embed,
            side,
            blocks,
            merger,
            deepstack,
            heads: cfg.num_heads,
            hidden: d,
            patch: p,
            temporal: t,
            merge: m,
            channels: c,
            inv_freq: Array::from_f32(&inv, &[inv.len() as i32])?,
        }))
    }

    /// The deepstack layers (the language model adds their rows after its
    /// first as many layers).
    pub fn deepstack_layers(&self) -> usize {
        self.deepstack.len()
    }

    /// Patches per side of one soft token.
    pub fn merge(&self) -> usize {
        self.merge as usize
    }

    /// Per patch (merge-group order, as the processor lays them out): its
    /// row and column in the grid `(h, w)`.
    fn coordinates(&self, h: usize, w: usize) -> Vec<(usize, usize)> {
        let m = self.merge as usize;
        let mut out = Vec::with_capacity(h * w);
        for bh in 0..h / m {
            for bw in 0..w / m {
                for ih in 0..m {
                    for iw in 0..m {
                        out.push((bh * m + ih, bw * m + iw));
                    }
                }
            }
        }
        out
    }

    /// The position table interpolated to a `h × w` grid (bilinear, as
    /// mlx-vlm's `fast_pos_embed_interpolate`), rows in `coordinates` order,
    /// repeated for `t` frames.
    fn positions(&self, t: usize, h: usize, w: usize) -> Result<Array> {
        let n = self.side as usize;
        // mx.linspace(0, n - 1, k) in f32: (i / (k - 1)) * (n - 1).
        let grid = |k: usize| -> Vec<f32> {
            (0..k).map(|i| if k == 1 { 0.0 } else { (i as f32 / (k - 1) as f32) * (n - 1) as f32 }).collect()
        };
        let (hs, ws) = (grid(h), grid(w));
        let mut idx = vec![Vec::with_capacity(h * w); 4];
        let mut wt = vec![Vec::with_capacity(h * w); 4];
        for (r, c) in self.coordinates(h, w) {
            let (y, x) = (hs[r], ws[c]);
            let (y0, x0) = (y as usize, x as usize);
            let (y1, x1) = ((y0 + 1).min(n - 1), (x0 + 1).min(n - 1));
            let (dy, dx) = (y - y0 as f32, x - x0 as f32);
            for (k, (i, wgt)) in [
                (y0 * n + x0, (1.0 - dy) * (1.0 - dx)),
                (y0 * n + x1, (1.0 - dy) * dx),
                (y1 * n + x0, dy * (1.0 - dx)),
                (y1 * n + x1, dy * dx),
            ]
            .into_iter()
            .enumerate()
            {
                idx[k].push(i as i32);
                wt[k].push(wgt);
            }
        }
        let rows = (h * w) as i32;
        let mut sum: Option<Array> = None;
        for k in 0..4 {
            let e = self.pos_embed.take(&Array::from_i32(&idx[k], &[rows])?, 0)?;
            let e = e.multiply(&Array::from_f32(&wt[k], &[rows, 1])?.astype(e.dtype())?)?;
            sum = Some(match sum {
                Some(s) => s.add(&e)?,
                None => e,
            });
        }
        let pos = sum.expect("four terms");
        Ok(if t > 1 { Array::concatenate(&vec![&pos; t], 0)? } else { pos })
    }

    /// The 2-D RoPE angles of a `h × w` grid's patches (`[t·h·w, head_dim / 2]`:
    /// row angles, then column angles).
    fn angles(&self, t: usize, h: usize, w: usize) -> Result<Array> {
        let coords = self.coordinates(h, w);
        let n = coords.len() as i32;
        let rows: Vec<f32> = coords.iter().map(|&(r, _)| r as f32).collect();
        let cols: Vec<f32> = coords.iter().map(|&(_, c)| c as f32).collect();
        let f = |v: &[f32]| -> Result<Array> { Ok(Array::from_f32(v, &[n, 1])?.multiply(&self.inv_freq)?) };
        let a = Array::concatenate(&[&f(&rows)?, &f(&cols)?], 1)?;
        Ok(if t > 1 { Array::concatenate(&vec![&a; t], 0)? } else { a })
    }
}

/// `x * cos + rotate_half(x) * sin` over the last axis (`cos`, `sin`
/// broadcast against `x`).
fn rotate(x: &Array, cos: &Array, sin: &Array) -> Result<Array> {
    let d = x.dim(-1);
    let (a, b) = (x.slice_axis(-1, 0, d / 2)?, x.slice_axis(-1, d / 2, d)?);
    let half = Array::concatenate(&[&b.negative()?, &a], -1)?;
    Ok(x.multiply(cos)?.add(&half.multiply(sin)?)?)
}

impl Tower for QwenVision {
    /// Items are the processor's patch rows `[t·h·w, channels · temporal ·
    /// patch²]` with their grid `(t, h, w)`; all run in one batch, attention
    /// within each image.
    fn encode(&self, items: &[&MediaItem]) -> Result<Vec<Encoded>> {
        let (c, t, p, d) = (self.channels, self.temporal, self.patch, self.hidden);
        let row = (c * t * p * p) as usize;
        let mut data = vec![];
        let (mut pos, mut ang, mut lens) = (vec![], vec![], vec![]);
        for it in items {
            let [gt, gh, gw] = it.grid;
            let m = self.merge as usize;
            if it.shape != [gt * gh * gw, row] || gh % m != 0 || gw % m != 0 {
                return Err(Error::internal(format!("patches {:?} of grid {:?} do not fit the tower", it.shape, it.grid)));
            }
            data.extend_from_slice(&it.data);
            pos.push(self.positions(gt, gh, gw)?);
            ang.push(self.angles(gt, gh, gw)?);
            lens.push((gt * gh * gw) as i32);
        }
        let n: i32 = lens.iter().sum();
        // The processor's (c, t, p, p) rows in the kernel's (t, p, p, c) order.
        let x = Array::from_f32(&data, &[n, c, t, p, p])?.transpose(&[0, 2, 3, 4, 1])?.reshape(&[n, -1])?;
        let mut x = x.addmm(&self.patch_w, &self.patch_b)?;
        x = x.add(&Array::concatenate(&pos.iter().collect::<Vec<_>>(), 0)?)?;
        let ang = Array::concatenate(&ang.iter().collect::<Vec<_>>(), 0)?;
        let ang = Array::concatenate(&[&ang, &ang], 1)?.expand_dims(1)?; // [n, 1, head_dim]
        let (cos, sin) = (ang.cos()?, ang.sin()?);
        let hd = d / self.heads;
        let mut deep = vec![];
        for (i, b) in self.blocks.iter().enumerate() {
            let qkv = b.qkv.forward(&b.norm1.forward(&x)?)?.reshape(&[n, 3, self.heads, hd])?;
            let part = |k: i32| qkv.slice_axis(1, k, k + 1).and_then(|a| a.squeeze(1));
            let (q, k, v) = (rotate(&part(0)?, &cos, &sin)?, rotate(&part(1)?, &cos, &sin)?, part(2)?);
            let mut outs = vec![];
            let mut at = 0;
            for &l in &lens {
                let one = |a: &Array| -> Result<Array> { Ok(a.slice_axis(0, at, at + l)?.transpose(&[1, 0, 2])?.expand_dims(0)?) };
                let o = fast::scaled_dot_product_attention(&one(&q)?, &one(&k)?, &one(&v)?, (hd as f32).powf(-0.5), Mask::None)?;
                outs.push(o.squeeze(0)?.transpose(&[1, 0, 2])?.reshape(&[l, d])?);
                at += l;
            }
            let o = if outs.len() == 1 { outs.pop().expect("one") } else { Array::concatenate(&outs.iter().collect::<Vec<_>>(), 0)? };
            x = x.add(&b.proj.forward(&o)?)?;
            x = x.add(&b.fc2.forward(&gelu_tanh(&b.fc1.forward(&b.norm2.forward(&x)?)?)?)?)?;
            for (_, m) in self.deepstack.iter().filter(|(layer, _)| *layer == i) {
                deep.push(m.forward(&x, d * self.merge * self.merge)?);
            }
        }
        let merged = self.merger.forward(&x, d * self.merge * self.merge)?;
        let group = self.merge * self.merge;
        let mut out = vec![];
        let mut at = 0;
        for &l in &lens {
            let k = l / group;
            let slice = |a: &Array| -> Result<Array> { Ok(a.slice_axis(0, at, at + k)?.contiguous()?) };
            out.push(Encoded { rows: slice(&merged)?, deepstack: deep.iter().map(slice).collect::<Result<_>>()? });
            at += k;
        }
        Ok(out)
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = vec![&self.patch_w, &self.patch_b, &self.pos_embed, &self.inv_freq];
        for b in &self.blocks {
            v.extend([&b.norm1.w, &b.norm1.b, &b.norm2.w, &b.norm2.b]);
            for l in [&b.qkv, &b.proj, &b.fc1, &b.fc2] {
                v.extend(l.arrays());
            }
        }
        v.extend(self.merger.arrays());
        for (_, m) in &self.deepstack {
            v.extend(m.arrays());
        }
        v
    }
}

//! Gemma 4's vision tower, op for op as mlx-vlm's gemma4 (vision.py,
//! gemma4.py's `embed_vision`):
//! - patches of `patch × patch` pixels (`2 (x - 0.5)`), a linear embedding,
//!   plus a learned embedding of the patch column and one of its row;
//! - blocks of full bidirectional attention within the image (RMS-normed
//!   queries, keys and values, scale 1, 2-D RoPE: half of each head rotated
//!   by the column, half by the row) and a GeGLU MLP, with Gemma's four
//!   norms around them; linears optionally clipped to stored bounds;
//! - average pooling of `pool × pool` patches, times √hidden, optional
//!   standardization;
//! - the projector: a scale-free RMSNorm and a linear map into the language
//!   model's width.
//! Tensor names are the checkpoint's (`vision_tower.…`, `embed_vision.…`).

use super::layers::{gelu_tanh, Linear, RmsNorm};
use super::media::{Encoded, Tower};
use super::weights::Weights;
use crate::error::{Error, Result};
use crate::media::MediaItem;
use crate::mlx::fast::{self, Mask};
use crate::mlx::Array;
use serde_json::Value;

/// A linear layer whose input and output are clamped to bounds stored in
/// the checkpoint (`input_min`, … beside `linear.weight`), when the config
/// says so.
pub(crate) struct ClippedLinear {
    linear: Linear,
    /// (input min, input max, output min, output max).
    bounds: Option<[Array; 4]>,
}

impl ClippedLinear {
    pub(crate) fn load(w: &mut Weights, prefix: &str, in_dim: i32, out_dim: i32, clipped: bool) -> Result<ClippedLinear> {
        let linear = w.linear(&format!("{prefix}.linear"), in_dim, out_dim, false)?;
        let names = ["input_min", "input_max", "output_min", "output_max"].map(|n| format!("{prefix}.{n}"));
        let bounds = if clipped {
            let [a, b, c, d] = &names;
            Some([w.take(a)?, w.take(b)?, w.take(c)?, w.take(d)?])
        } else {
            // Unused bounds, as mlx-vlm's sanitize drops them.
            for n in &names {
                if w.contains(n) {
                    w.take(n)?;
                }
            }
            None
        };
        Ok(ClippedLinear { linear, bounds })
    }

    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        let Some([imin, imax, omin, omax]) = &self.bounds else { return self.linear.forward(x) };
        let y = self.linear.forward(&x.maximum(imin)?.minimum(imax)?)?;
        Ok(y.maximum(omin)?.minimum(omax)?)
    }

    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.linear.arrays();
        v.extend(self.bounds.iter().flatten());
        v
    }
}

struct Block {
    q: ClippedLinear,
    k: ClippedLinear,
    v: ClippedLinear,
    o: ClippedLinear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    gate: ClippedLinear,
    up: ClippedLinear,
    down: ClippedLinear,
    input_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ff_norm: RmsNorm,
    post_ff_norm: RmsNorm,
}

pub struct Gemma4Vision {
    /// `[3 · patch², hidden]` over (y, x, channel) patch rows.
    input_proj: Array,
    /// The column and row tables, `[positions, hidden]` each.
    columns: Array,
    rows: Array,
    blocks: Vec<Block>,
    /// `(bias, scale)` of the optional standardization.
    standardize: Option<(Array, Array)>,
    projection: Linear,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    hidden: i32,
    patch: usize,
    pool: usize,
    eps: f32,
    rope_base: f32,
}

impl Gemma4Vision {
    /// Builds the tower when `config` has a `vision_config` and the
    /// checkpoint its tensors (`None` otherwise).
    pub fn load(config: &Value, text_hidden: i32, w: &mut Weights) -> Result<Option<Gemma4Vision>> {
        let Some(vc) = config.get("vision_config").filter(|v| v.is_object()) else { return Ok(None) };
        let v = "vision_tower";
        if !w.contains(&format!("{v}.patch_embedder.input_proj.weight")) {
            return Ok(None);
        }
        let int = |k: &str, default: i64| vc.get(k).and_then(Value::as_i64).unwrap_or(default) as i32;
        let d = int("hidden_size", 768);
        let (heads, kv_heads, hd) = (int("num_attention_heads", 12), int("num_key_value_heads", 12), int("head_dim", 64));
        let (inter, layers) = (int("intermediate_size", 3072), int("num_hidden_layers", 16));
        let (patch, pos_size, pool) = (int("patch_size", 16), int("position_embedding_size", 10240), int("pooling_kernel_size", 3));
        let eps = vc.get("rms_norm_eps").and_then(Value::as_f64).unwrap_or(1e-6) as f32;
        let clipped = vc.get("use_clipped_linears").and_then(Value::as_bool).unwrap_or(false);
        let rope_base = vc.get("rope_parameters").and_then(|r| r.get("rope_theta")).and_then(Value::as_f64).unwrap_or(100.0) as f32;
        if d <= 0 || heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || hd % 4 != 0 || patch <= 0 || pool <= 0 || pos_size <= 0 {
            return Err(Error::model("config.json: vision_config's sizes do not fit together"));
        }
        let input_proj = w.take_shaped(&format!("{v}.patch_embedder.input_proj.weight"), &[d, 3 * patch * patch])?;
        let table = w.take_shaped(&format!("{v}.patch_embedder.position_embedding_table"), &[2, pos_size, d])?;
        let norm = |w: &mut Weights, name: &str, n: i32| -> Result<RmsNorm> { Ok(RmsNorm { w: w.take_shaped(&format!("{name}.weight"), &[n])?, eps }) };
        let mut blocks = vec![];
        for i in 0..layers {
            let b = format!("{v}.encoder.layers.{i}");
            let lin = |w: &mut Weights, n: &str, i: i32, o: i32| ClippedLinear::load(w, &format!("{b}.{n}"), i, o, clipped);
            blocks.push(Block {
                q: lin(w, "self_attn.q_proj", d, heads * hd)?,
                k: lin(w, "self_attn.k_proj", d, kv_heads * hd)?,
                v: lin(w, "self_attn.v_proj", d, kv_heads * hd)?,
                o: lin(w, "self_attn.o_proj", heads * hd, d)?,
                q_norm: norm(w, &format!("{b}.self_attn.q_norm"), hd)?,
                k_norm: norm(w, &format!("{b}.self_attn.k_norm"), hd)?,
                gate: lin(w, "mlp.gate_proj", d, inter)?,
                up: lin(w, "mlp.up_proj", d, inter)?,
                down: lin(w, "mlp.down_proj", inter, d)?,
                input_norm: norm(w, &format!("{b}.input_layernorm"), d)?,
                post_attn_norm: norm(w, &format!("{b}.post_attention_layernorm"), d)?,
                pre_ff_norm: norm(w, &format!("{b}.pre_feedforward_layernorm"), d)?,
                post_ff_norm: norm(w, &format!("{b}.post_feedforward_layernorm"), d)?,
            });
        }
        let standardize = if vc.get("standardize").and_then(Value::as_bool).unwrap_or(false) {
            Some((w.take_shaped(&format!("{v}.std_bias"), &[d])?, w.take_shaped(&format!("{v}.std_scale"), &[d])?))
        } else {
            None
        };
        let projection = w.linear("embed_vision.embedding_projection", d, text_hidden, false)?;
        let part = |i: i32| table.slice_axis(0, i, i + 1).and_then(|a| a.squeeze(0));
        Ok(Some(Gemma4Vision {
            input_proj: input_proj.transpose(&[1, 0])?,
            columns: part(0)?,
            rows: part(1)?,
            blocks,
            standardize,
            projection,
            heads,
            kv_heads,
            head_dim: hd,
            hidden: d,
            patch: patch as usize,
            pool: pool as usize,
            eps,
            rope_base,
        }))
    }

    /// Pixels per patch side and patches per pooled token side (the
    /// processor sizes pictures to multiples of their product).
    pub fn patch_and_pool(&self) -> (usize, usize) {
        (self.patch, self.pool)
    }

    /// One image `[3, H, W]` (rescaled to 0..1) → `[tokens, text hidden]`.
    fn encode_one(&self, it: &MediaItem) -> Result<Array> {
        let [_, gh, gw] = it.grid;
        let (p, k, d) = (self.patch, self.pool, self.hidden);
        if it.shape != [3, gh * p, gw * p] || gh % k != 0 || gw % k != 0 {
            return Err(Error::internal(format!("an image {:?} of grid {:?} does not fit the tower", it.shape, it.grid)));
        }
        let (pi, n) = (p as i32, (gh * gw) as i32);
        // [3, H, W] -> [gh, gw, p, p, 3] -> [n, p·p·3]
        let px = Array::from_f32(&it.data, &[3, gh as i32, pi, gw as i32, pi])?.transpose(&[1, 3, 2, 4, 0])?.reshape(&[n, -1])?;
        let px = px.subtract(&px.scalar_like(0.5)?)?.multiply(&px.scalar_like(2.0)?)?;
        let cols: Vec<i32> = (0..n).map(|i| i % gw as i32).collect();
        let rows: Vec<i32> = (0..n).map(|i| i / gw as i32).collect();
        let (ca, ra) = (Array::from_i32(&cols, &[n])?, Array::from_i32(&rows, &[n])?);
        let pos = self.columns.take(&ca, 0)?.add(&self.rows.take(&ra, 0)?)?;
        let mut x = px.matmul(&self.input_proj)?.add(&pos)?.expand_dims(0)?;
        let (cos, sin) = self.rope_tables(&cols, &rows)?;
        let hd = self.head_dim;
        for b in &self.blocks {
            let h = b.input_norm.forward(&x)?;
            let heads = |t: Array, n_h: i32| t.reshape(&[1, n, n_h, hd]);
            let q = rope(&b.q_norm.forward(&heads(b.q.forward(&h)?, self.heads)?)?, &cos, &sin)?;
            let kk = rope(&b.k_norm.forward(&heads(b.k.forward(&h)?, self.kv_heads)?)?, &cos, &sin)?;
            let v = fast::rms_norm_plain(&heads(b.v.forward(&h)?, self.kv_heads)?, self.eps)?;
            let t = |a: Array| a.transpose(&[0, 2, 1, 3]);
            let o = fast::scaled_dot_product_attention(&t(q)?, &t(kk)?, &t(v)?, 1.0, Mask::None)?;
            let o = b.o.forward(&o.transpose(&[0, 2, 1, 3])?.reshape(&[1, n, self.heads * hd])?)?;
            x = x.add(&b.post_attn_norm.forward(&o)?)?;
            let h = b.pre_ff_norm.forward(&x)?;
            let f = b.down.forward(&gelu_tanh(&b.gate.forward(&h)?)?.multiply(&b.up.forward(&h)?)?)?;
            x = x.add(&b.post_ff_norm.forward(&f)?)?;
        }
        // Average pooling by positions: token (y / k) · (gw / k) + x / k
        // takes each of its k² patches with weight 1 / k².
        let (th, tw) = (gh / k, gw / k);
        let tokens = th * tw;
        let mut weights = vec![0f32; tokens * gh * gw];
        for i in 0..gh * gw {
            let (r, c) = (i / gw, i % gw);
            weights[((r / k) * tw + c / k) * gh * gw + i] = 1.0 / (k * k) as f32;
        }
        let pool = Array::from_f32(&weights, &[tokens as i32, n])?;
        let mut y = pool.matmul(&x.squeeze(0)?)?;
        y = y.multiply(&y.scalar_like((d as f64).sqrt() as f32)?)?;
        if let Some((bias, scale)) = &self.standardize {
            y = y.subtract(bias)?.multiply(scale)?;
        }
        self.projection.forward(&fast::rms_norm_plain(&y, self.eps)?)
    }

    /// The 2-D RoPE's cos and sin (`[1, n, 1, head_dim]`): the first half
    /// of each head by the patch column, the second by its row, each with
    /// `base^(-2 i / (head_dim / 2))` frequencies, halves doubled.
    fn rope_tables(&self, cols: &[i32], rows: &[i32]) -> Result<(Array, Array)> {
        let n = cols.len() as i32;
        let part = self.head_dim / 2;
        let half = part / 2;
        let exps = Array::arange(0, half)?.astype(crate::mlx::Dtype::F32)?;
        let exps = exps.multiply(&exps.scalar_like(2.0 / part as f32)?)?;
        let timescale = exps.scalar_like(self.rope_base)?.power(&exps)?;
        let angles = |v: &[i32]| -> Result<Array> {
            let pos = Array::from_i32(v, &[n, 1])?.astype(crate::mlx::Dtype::F32)?;
            let a = pos.divide(&timescale)?;
            Ok(Array::concatenate(&[&a, &a], 1)?)
        };
        let a = Array::concatenate(&[&angles(cols)?, &angles(rows)?], 1)?.reshape(&[1, n, 1, self.head_dim])?;
        Ok((a.cos()?, a.sin()?))
    }
}

/// `x * cos + rotate_half(x) * sin` within each half of the head (the
/// column half and the row half rotate apart).
fn rope(x: &Array, cos: &Array, sin: &Array) -> Result<Array> {
    let hd = x.dim(-1);
    let q = hd / 4;
    let s = |a: i32, b: i32| x.slice_axis(-1, a, b);
    let (a0, a1, b0, b1) = (s(0, q)?, s(q, 2 * q)?, s(2 * q, 3 * q)?, s(3 * q, hd)?);
    let half = Array::concatenate(&[&a1.negative()?, &a0, &b1.negative()?, &b0], -1)?;
    Ok(x.multiply(cos)?.add(&half.multiply(sin)?)?)
}

impl Tower for Gemma4Vision {
    /// Items are `[3, H, W]` pixels in 0..1 with their patch grid; each image
    /// runs alone (their sizes differ).
    fn encode(&self, items: &[&MediaItem]) -> Result<Vec<Encoded>> {
        items.iter().map(|it| Ok(Encoded { rows: self.encode_one(it)?, deepstack: vec![] })).collect()
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = vec![&self.input_proj, &self.columns, &self.rows];
        for b in &self.blocks {
            for l in [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down] {
                v.extend(l.arrays());
            }
            for n in [&b.q_norm, &b.k_norm, &b.input_norm, &b.post_attn_norm, &b.pre_ff_norm, &b.post_ff_norm] {
                v.push(&n.w);
            }
        }
        if let Some((b, s)) = &self.standardize {
            v.extend([b, s]);
        }
        v.extend(self.projection.arrays());
        v
    }
}

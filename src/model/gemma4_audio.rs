//! Gemma 4's audio tower, op for op as mlx-vlm's gemma4 (audio.py,
//! gemma4.py's `embed_audio`): a Conformer over log-mel frames.
//! - subsampling: two stride-2 3×3 convolutions (LayerNorm over channels,
//!   ReLU; padded frames zeroed first), flattened and projected;
//! - blocks: a half-step feed-forward, chunked local self-attention
//!   (chunks of `attention_chunk_size` queries see the `context_left - 1`
//!   frames before them; relative position logits from sinusoids, logits
//!   soft-capped), a light convolution (GLU, causal depthwise conv, SiLU),
//!   a second half-step feed-forward, RMSNorm; linears clipped to stored
//!   bounds;
//! - an output projection, then the projector: a scale-free RMSNorm and a
//!   linear map into the language model's width.
//! Tensor names are the checkpoint's (`audio_tower.…`, `embed_audio.…`).

use super::gemma4_vision::ClippedLinear;
use super::layers::{LayerNorm, Linear, RmsNorm};
use super::media::{Encoded, Tower};
use super::weights::Weights;
use crate::error::{Error, Result};
use crate::media::MediaItem;
use crate::mlx::{conv1d, conv2d, fast, Array, Dtype};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct AudioConfig {
    hidden_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    subsampling_conv_channels: Vec<i32>,
    conv_kernel_size: i32,
    residual_weight: f32,
    attention_chunk_size: i32,
    attention_context_left: i32,
    attention_context_right: i32,
    attention_logit_cap: f32,
    attention_invalid_logits_value: f32,
    rms_norm_eps: f32,
    gradient_clipping: f32,
    output_proj_dims: Option<i32>,
}

/// mlx-vlm's defaults (gemma4/config.py).
impl Default for AudioConfig {
    fn default() -> AudioConfig {
        AudioConfig {
            hidden_size: 1024,
            num_hidden_layers: 12,
            num_attention_heads: 8,
            subsampling_conv_channels: vec![128, 32],
            conv_kernel_size: 5,
            residual_weight: 0.5,
            attention_chunk_size: 12,
            attention_context_left: 13,
            attention_context_right: 0,
            attention_logit_cap: 50.0,
            attention_invalid_logits_value: -1e9,
            rms_norm_eps: 1e-6,
            gradient_clipping: 1e10,
            output_proj_dims: Some(1536),
        }
    }
}

/// The mel features the subsampling reads.
const MEL_BINS: i32 = 128;

struct FeedForward {
    pre_norm: RmsNorm,
    up: ClippedLinear,
    down: ClippedLinear,
    post_norm: RmsNorm,
}

struct Attention {
    q: ClippedLinear,
    k: ClippedLinear,
    v: ClippedLinear,
    post: ClippedLinear,
    relative_k: Linear,
    /// `q_scale · softplus(per_dim_scale)`.
    q_mul: Array,
}

struct LightConv {
    pre_norm: RmsNorm,
    start: ClippedLinear,
    /// `[hidden, kernel, 1]`, depthwise.
    conv: Array,
    conv_norm: RmsNorm,
    end: ClippedLinear,
}

struct Block {
    ff1: FeedForward,
    attn: Attention,
    conv: LightConv,
    ff2: FeedForward,
    norm_pre_attn: RmsNorm,
    norm_post_attn: RmsNorm,
    norm_out: RmsNorm,
}

pub struct Gemma4Audio {
    /// The two subsampling convolutions `[C_out, 3, 3, C_in]` and their
    /// channel norms.
    convs: [(Array, LayerNorm); 2],
    input_proj: Linear,
    blocks: Vec<Block>,
    output_proj: Option<Linear>,
    projection: Linear,
    cfg: AudioConfig,
    /// Sinusoids of the relative positions `context_left - 1 ..= -context_right`
    /// (`[1, S, hidden]`).
    timing: Array,
    /// Which of a chunk's context frames each of its queries may see
    /// (`[chunk, context]`).
    local: Array,
}

impl Gemma4Audio {
    /// Builds the tower when `config` has an `audio_config` and the
    /// checkpoint its tensors (`None` otherwise).
    pub fn load(config: &Value, text_hidden: i32, w: &mut Weights) -> Result<Option<Gemma4Audio>> {
        let Some(ac) = config.get("audio_config").filter(|v| v.is_object()) else { return Ok(None) };
        let a = "audio_tower";
        if !w.contains(&format!("{a}.subsample_conv_projection.layer0.conv.weight")) {
            return Ok(None);
        }
        let cfg: AudioConfig = serde_json::from_value(ac.clone()).map_err(|e| Error::model(format!("config.json audio_config: {e}")))?;
        let (d, heads, k) = (cfg.hidden_size, cfg.num_attention_heads, cfg.conv_kernel_size);
        let chans = &cfg.subsampling_conv_channels;
        if d <= 0 || heads <= 0 || d % heads != 0 || chans.len() != 2 || chans.iter().any(|&c| c <= 0) || k <= 0 || cfg.attention_chunk_size <= 0 || cfg.attention_context_left < 1 || cfg.attention_context_right < 0 {
            return Err(Error::model("config.json: audio_config's sizes do not fit together"));
        }
        let eps = cfg.rms_norm_eps;
        let norm = |w: &mut Weights, name: &str, n: i32, eps: f32| -> Result<RmsNorm> { Ok(RmsNorm { w: w.take_shaped(&format!("{name}.weight"), &[n])?, eps }) };
        let lin = |w: &mut Weights, name: &str, i: i32, o: i32| ClippedLinear::load(w, name, i, o, true);
        let s = format!("{a}.subsample_conv_projection");
        let conv = |w: &mut Weights, i: usize, cin: i32| -> Result<(Array, LayerNorm)> {
            let c = chans[i];
            let weight = w.take_shaped(&format!("{s}.layer{i}.conv.weight"), &[c, 3, 3, cin])?;
            let nw = w.take_shaped(&format!("{s}.layer{i}.norm.weight"), &[c])?;
            let zeros = Array::zeros(&[c], nw.dtype())?;
            Ok((weight, LayerNorm::new(nw, zeros, eps)))
        };
        let convs = [conv(w, 0, 1)?, conv(w, 1, chans[0])?];
        let mut freq = MEL_BINS;
        for _ in 0..2 {
            freq = (freq + 2 - 3) / 2 + 1;
        }
        let input_proj = w.linear(&format!("{s}.input_proj_linear"), freq * chans[1], d, false)?;
        let hd = d / heads;
        let mut blocks = vec![];
        for i in 0..cfg.num_hidden_layers {
            let b = format!("{a}.layers.{i}");
            let ff = |w: &mut Weights, n: &str| -> Result<FeedForward> {
                Ok(FeedForward {
                    pre_norm: norm(w, &format!("{b}.{n}.pre_layer_norm"), d, 1e-6)?,
                    up: lin(w, &format!("{b}.{n}.ffw_layer_1"), d, 4 * d)?,
                    down: lin(w, &format!("{b}.{n}.ffw_layer_2"), 4 * d, d)?,
                    post_norm: norm(w, &format!("{b}.{n}.post_layer_norm"), d, 1e-6)?,
                })
            };
            let ff1 = ff(w, "feed_forward1")?;
            let at = format!("{b}.self_attn");
            let pds = w.take_shaped(&format!("{at}.per_dim_scale"), &[hd])?;
            // nn.softplus: logaddexp(x, 0).
            let softplus = pds.logaddexp(&pds.scalar_like(0.0)?)?;
            let q_scale = ((hd as f64).powf(-0.5) / std::f64::consts::LN_2) as f32;
            let attn = Attention {
                q: lin(w, &format!("{at}.q_proj"), d, d)?,
                k: lin(w, &format!("{at}.k_proj"), d, d)?,
                v: lin(w, &format!("{at}.v_proj"), d, d)?,
                post: lin(w, &format!("{at}.post"), d, d)?,
                relative_k: w.linear(&format!("{at}.relative_k_proj"), d, d, false)?,
                q_mul: softplus.scalar_like(q_scale)?.multiply(&softplus)?,
            };
            let c = format!("{b}.lconv1d");
            let conv = LightConv {
                pre_norm: norm(w, &format!("{c}.pre_layer_norm"), d, eps)?,
                start: lin(w, &format!("{c}.linear_start"), d, 2 * d)?,
                conv: w.take_shaped(&format!("{c}.depthwise_conv1d.weight"), &[d, k, 1])?,
                conv_norm: norm(w, &format!("{c}.conv_norm"), d, eps)?,
                end: lin(w, &format!("{c}.linear_end"), d, d)?,
            };
            blocks.push(Block {
                ff1,
                attn,
                conv,
                ff2: ff(w, "feed_forward2")?,
                norm_pre_attn: norm(w, &format!("{b}.norm_pre_attn"), d, 1e-6)?,
                norm_post_attn: norm(w, &format!("{b}.norm_post_attn"), d, 1e-6)?,
                norm_out: norm(w, &format!("{b}.norm_out"), d, 1e-6)?,
            });
        }
        let out_dims = cfg.output_proj_dims.unwrap_or(d);
        let output_proj = match cfg.output_proj_dims {
            Some(o) => Some(w.linear(&format!("{a}.output_proj"), d, o, true)?),
            None => None,
        };
        let projection = w.linear("embed_audio.embedding_projection", out_dims, text_hidden, false)?;
        let (timing, local) = (timing(&cfg)?, local_mask(&cfg)?);
        Ok(Some(Gemma4Audio { convs, input_proj, blocks, output_proj, projection, cfg, timing, local }))
    }

    /// One clip's mel frames `[frames, 128]` (the first `valid` real) →
    /// `[tokens, text hidden]`.
    fn encode_one(&self, it: &MediaItem) -> Result<Array> {
        let frames = it.shape[0] as i32;
        if it.shape != [it.shape[0], MEL_BINS as usize] || it.valid > it.shape[0] || it.valid == 0 {
            return Err(Error::internal(format!("audio features {:?} do not fit the tower", it.shape)));
        }
        let mut valid: Vec<bool> = (0..frames as usize).map(|t| t < it.valid).collect();
        let mut x = Array::from_f32(&it.data, &[1, frames, MEL_BINS, 1])?;
        for (weight, norm) in &self.convs {
            x = x.multiply(&flags(&valid, &[1, valid.len() as i32, 1, 1])?.astype(x.dtype())?)?;
            x = pad(&pad(&x, 1, 1, 1)?, 2, 1, 1)?;
            x = conv2d(&x, weight, (2, 2), (0, 0))?;
            let t = x.dim(1) as usize;
            valid = valid.iter().step_by(2).take(t).copied().collect();
            x = norm.forward(&x)?;
            x = x.maximum(&x.scalar_like(0.0)?)?;
        }
        let s = x.shape();
        let mut x = self.input_proj.forward(&x.reshape(&[1, s[1], s[2] * s[3]])?)?;
        let keep = flags(&valid, &[1, valid.len() as i32, 1])?.astype(x.dtype())?;
        for b in &self.blocks {
            x = self.block(b, &x, &valid, &keep)?;
        }
        if let Some(p) = &self.output_proj {
            x = p.forward(&x)?;
        }
        let x = x.multiply(&keep)?.squeeze(0)?;
        // mlx-vlm scatters the encoder's rows in order over the soft tokens,
        // from the first again if there are fewer.
        let t = x.dim(0);
        let idx: Vec<i32> = (0..it.tokens as i32).map(|i| i % t).collect();
        let x = x.take(&Array::from_i32(&idx, &[idx.len() as i32])?, 0)?;
        self.projection.forward(&fast::rms_norm_plain(&x, self.cfg.rms_norm_eps)?)
    }

    fn clip(&self, x: &Array) -> Result<Array> {
        let g = self.cfg.gradient_clipping;
        Ok(x.maximum(&x.scalar_like(-g)?)?.minimum(&x.scalar_like(g)?)?)
    }

    fn feed_forward(&self, f: &FeedForward, x: &Array) -> Result<Array> {
        let h = f.up.forward(&f.pre_norm.forward(&self.clip(x)?)?)?.silu()?;
        let h = f.post_norm.forward(&self.clip(&f.down.forward(&h)?)?)?;
        Ok(x.add(&h.multiply(&h.scalar_like(self.cfg.residual_weight)?)?)?)
    }

    fn block(&self, b: &Block, x: &Array, valid: &[bool], keep: &Array) -> Result<Array> {
        let x = self.feed_forward(&b.ff1, x)?;
        let a = self.attention(&b.attn, &b.norm_pre_attn.forward(&self.clip(&x)?)?, valid)?;
        let x = x.add(&b.norm_post_attn.forward(&self.clip(&a)?)?)?.multiply(keep)?;
        let c = &b.conv;
        let h = c.start.forward(&c.pre_norm.forward(&x)?)?;
        let d = self.cfg.hidden_size;
        let h = h.slice_axis(-1, 0, d)?.multiply(&h.slice_axis(-1, d, 2 * d)?.sigmoid()?)?;
        let h = pad(&h, 1, self.cfg.conv_kernel_size - 1, 0)?;
        let h = conv1d(&h, &c.conv, 1, 0, 1, d)?;
        let h = c.end.forward(&c.conv_norm.forward(&self.clip(&h)?)?.silu()?)?;
        let x = self.feed_forward(&b.ff2, &x.add(&h)?)?;
        b.norm_out.forward(&self.clip(&x)?)
    }

    /// Chunked local attention (`x` `[1, T, hidden]`).
    fn attention(&self, a: &Attention, x: &Array, valid: &[bool]) -> Result<Array> {
        let cfg = &self.cfg;
        let (n, d) = (cfg.num_attention_heads, cfg.hidden_size);
        let h = d / n;
        let t = x.dim(1);
        let (w, past, future) = (cfg.attention_chunk_size, cfg.attention_context_left - 1, cfg.attention_context_right);
        let c = w + past + future;
        let u = (t + w - 1) / w;
        let heads = |y: Array| -> Result<Array> { Ok(y.astype(Dtype::F32)?.reshape(&[1, t, n, h])?) };
        let q = heads(a.q.forward(x)?)?.multiply(&a.q_mul)?;
        let k_scale = ((1.0 + std::f64::consts::E).ln() / std::f64::consts::LN_2) as f32;
        let k = heads(a.k.forward(x)?)?;
        let k = k.multiply(&k.scalar_like(k_scale)?)?;
        let v = heads(a.v.forward(x)?)?;
        // Queries in chunks [1, U, W, N, H]; keys and values in each chunk's
        // context [1, U, C, N, H].
        let qb = pad(&q, 1, 0, u * w - t)?.reshape(&[1, u, w, n, h])?;
        let idx: Vec<i32> = (0..u).flat_map(|b| (0..c).map(move |o| b * w + o)).collect();
        let idx = Array::from_i32(&idx, &[u * c])?;
        let context = |y: &Array| -> Result<Array> {
            let p = pad(y, 1, past, future + w - 1)?;
            Ok(p.take(&idx, 1)?.reshape(&[1, u, c, n, h])?)
        };
        let (kb, vb) = (context(&k)?, context(&v)?);
        let mut vpad = vec![false; past as usize];
        vpad.extend_from_slice(valid);
        vpad.resize((past + t + future + w - 1) as usize, false);
        let ok: Vec<bool> = (0..u).flat_map(|b| (0..c).map(move |o| (b * w + o) as usize)).map(|i| vpad[i]).collect();
        let condition = flags(&ok, &[1, 1, u, 1, c])?.logical_and(&self.local.reshape(&[1, 1, 1, w, c])?)?;
        // Content logits and relative position logits.
        let qp = qb.transpose(&[0, 3, 1, 2, 4])?; // [1, N, U, W, H]
        let ac = qp.matmul(&kb.transpose(&[0, 3, 1, 4, 2])?)?; // [1, N, U, W, C]
        let span = self.timing.dim(1);
        let rel = a.relative_k.forward(&self.timing)?.reshape(&[span, n, h])?.transpose(&[1, 2, 0])?; // [N, H, S]
        let bd = qp.reshape(&[1, n, u * w, h])?.matmul(&rel)?.reshape(&[1, n, u, w, span])?;
        // Relative shift: row i's offsets become context columns.
        let bd = pad(&bd, 4, 0, c + 1 - span)?.reshape(&[1, n, u, w * (c + 1)])?;
        let bd = bd.slice_axis(3, 0, w * c)?.reshape(&[1, n, u, w, c])?;
        let logits = ac.add(&bd)?;
        let cap = logits.scalar_like(cfg.attention_logit_cap)?;
        let logits = logits.divide(&cap)?.tanh()?.multiply(&cap)?;
        let logits = Array::select(&condition, &logits, &logits.scalar_like(cfg.attention_invalid_logits_value)?)?;
        let probs = logits.softmax(-1, false)?;
        let ctx = probs.matmul(&vb.transpose(&[0, 3, 1, 2, 4])?)?; // [1, N, U, W, H]
        let ctx = ctx.transpose(&[0, 2, 3, 1, 4])?.reshape(&[1, u * w, n * h])?.slice_axis(1, 0, t)?;
        a.post.forward(&ctx)
    }
}

/// Booleans of `shape`.
fn flags(v: &[bool], shape: &[i32]) -> Result<Array> {
    let ints: Vec<i32> = v.iter().map(|&b| b as i32).collect();
    Ok(Array::from_i32(&ints, shape)?.greater(&Array::scalar_i32(0)?)?)
}

/// `x` with `before` and `after` zeros along `axis`.
fn pad(x: &Array, axis: i32, before: i32, after: i32) -> Result<Array> {
    let mut parts = vec![];
    let zeros = |n: i32| -> Result<Array> {
        let mut s = x.shape();
        s[axis as usize] = n;
        Ok(Array::zeros(&s, x.dtype())?)
    };
    let (b, a) = (zeros(before)?, zeros(after)?);
    if before > 0 {
        parts.push(&b);
    }
    parts.push(x);
    if after > 0 {
        parts.push(&a);
    }
    if parts.len() == 1 {
        return Ok(x.share());
    }
    Ok(Array::concatenate(&parts, axis)?)
}

/// `[sin, cos]` of the relative positions `context_left - 1` down to
/// `-context_right` at the timescales 1..10⁴ (`[1, S, hidden]`).
fn timing(cfg: &AudioConfig) -> Result<Array> {
    let (past, future, d) = (cfg.attention_context_left - 1, cfg.attention_context_right, cfg.hidden_size);
    let half = d / 2;
    let increment = (10_000f64).ln() / (half - 1).max(1) as f64;
    let steps = Array::arange(0, half)?.astype(Dtype::F32)?;
    let inv = steps.multiply(&steps.scalar_like(-increment as f32)?)?.exp()?.reshape(&[1, 1, half])?;
    let pos: Vec<i32> = (-future..=past).rev().collect();
    let s = pos.len() as i32;
    let scaled = Array::from_i32(&pos, &[1, s, 1])?.astype(Dtype::F32)?.multiply(&inv)?;
    Ok(Array::concatenate(&[&scaled.sin()?, &scaled.cos()?], -1)?)
}

/// A chunk's query `i` sees context frame `j` when `0 <= i + past - j <
/// past` (or within the future horizon).
fn local_mask(cfg: &AudioConfig) -> Result<Array> {
    let (w, past, future) = (cfg.attention_chunk_size, cfg.attention_context_left - 1, cfg.attention_context_right);
    let c = w + past + future;
    let ok: Vec<bool> = (0..w)
        .flat_map(|i| {
            (0..c).map(move |j| {
                let dist = i + past - j;
                (dist >= 0 && dist < past) || (dist < 0 && -dist < future)
            })
        })
        .collect();
    flags(&ok, &[w, c])
}

impl Tower for Gemma4Audio {
    /// Items are log-mel frames `[frames, 128]`; each clip runs alone.
    fn encode(&self, items: &[&MediaItem]) -> Result<Vec<Encoded>> {
        items.iter().map(|it| Ok(Encoded { rows: self.encode_one(it)?, deepstack: vec![] })).collect()
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = vec![&self.timing, &self.local];
        for (w, n) in &self.convs {
            v.extend([w, &n.w, &n.b]);
        }
        v.extend(self.input_proj.arrays());
        for b in &self.blocks {
            for f in [&b.ff1, &b.ff2] {
                v.extend([&f.pre_norm.w, &f.post_norm.w]);
                v.extend(f.up.arrays());
                v.extend(f.down.arrays());
            }
            for l in [&b.attn.q, &b.attn.k, &b.attn.v, &b.attn.post, &b.conv.start, &b.conv.end] {
                v.extend(l.arrays());
            }
            v.extend(b.attn.relative_k.arrays());
            v.extend([&b.attn.q_mul, &b.conv.conv, &b.conv.pre_norm.w, &b.conv.conv_norm.w]);
            v.extend([&b.norm_pre_attn.w, &b.norm_post_attn.w, &b.norm_out.w]);
        }
        if let Some(p) = &self.output_proj {
            v.extend(p.arrays());
        }
        v.extend(self.projection.arrays());
        v
    }
}

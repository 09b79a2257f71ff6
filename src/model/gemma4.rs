//! Gemma 4 (text), as mlx-lm's gemma4_text:
//! - sliding-window and full attention layers (`layer_types`, or every
//!   `sliding_window_pattern`-th layer full), full layers with their own head
//!   size (`global_head_dim`), KV heads and "proportional" RoPE over part of
//!   each head; attention scale 1 (queries and keys are RMS-normalized, values
//!   too, without a learned scale);
//! - K = V on full layers where configured (no `v_proj`: the key projection,
//!   before its norm, is also the value);
//! - the last `num_kv_shared_layers` layers compute no keys and values: each
//!   reuses those of the last earlier layer of its type (and has no cache);
//! - per-layer input embeddings where present: a second embedding table
//!   gives every layer its own small input, mixed with a projection of the
//!   token embedding and gated into the residual stream after the MLP;
//! - optional MoE block beside the MLP (router with its own norm and
//!   per-expert scales, GeGLU experts); a learned scalar per layer;
//! - final logits soft-capped: `tanh(x / cap) * cap`.
//!
//! Sliding layers keep a ring of their last `sliding_window` positions
//! (`RingCache`), as in gemma3.rs; a KV-shared sliding layer attends to the
//! keys its donor's ring returned, with the same mask.
//!
//! Media prompts (mlx-vlm's gemma4 `get_input_embeddings`): the towers' rows
//! replace the scaled embeddings of the soft tokens, whose per-layer inputs
//! take token 0; each image's tokens attend to one another both ways
//! (`MediaInput::blocks`).

use super::layers::{gelu_tanh, Act, Embedding, FusedLinear, Head, Kernels, Linear, LinearGroup, Mlp, RmsNorm, Rope};
use super::load::FamilyConfig;
use super::moe::SwitchGlu;
use super::pass::Pass;
use super::weights::Weights;
use super::attention::Masks;
use super::{Group, LanguageModel, MediaInput, ModelInfo, Output};
use crate::cache::kv::bytes_per_position;
use crate::cache::{AttnMask, KvCache, KvView, LayerCache, RingCache};
use crate::error::{Error, Result};
use crate::mlx::{fast, Array, Dtype};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct Config {
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    head_dim: i32,
    global_head_dim: Option<i32>,
    rms_norm_eps: f32,
    vocab_size: i32,
    vocab_size_per_layer_input: Option<i32>,
    num_key_value_heads: i32,
    num_global_key_value_heads: Option<i32>,
    num_kv_shared_layers: i32,
    hidden_size_per_layer_input: i32,
    rope_traditional: bool,
    rope_parameters: Option<Value>,
    sliding_window: i32,
    sliding_window_pattern: i32,
    max_position_embeddings: Option<i64>,
    attention_k_eq_v: bool,
    final_logit_softcapping: Option<f32>,
    use_double_wide_mlp: bool,
    enable_moe_block: bool,
    num_experts: Option<i32>,
    top_k_experts: Option<i32>,
    moe_intermediate_size: Option<i32>,
    layer_types: Option<Vec<String>>,
    tie_word_embeddings: bool,
}

impl FamilyConfig for Config {
    const REQUIRED: &'static [&'static str] =
        &["hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "vocab_size"];
}

/// mlx-lm's defaults (gemma4_text.py: those of the smallest Gemma 4).
impl Default for Config {
    fn default() -> Config {
        Config {
            hidden_size: 0,
            num_hidden_layers: 0,
            intermediate_size: 0,
            num_attention_heads: 0,
            head_dim: 256,
            global_head_dim: Some(512),
            rms_norm_eps: 1e-6,
            vocab_size: 0,
            vocab_size_per_layer_input: Some(262_144),
            num_key_value_heads: 1,
            num_global_key_value_heads: None,
            num_kv_shared_layers: 20,
            hidden_size_per_layer_input: 256,
            rope_traditional: false,
            rope_parameters: None,
            sliding_window: 512,
            sliding_window_pattern: 5,
            max_position_embeddings: None,
            attention_k_eq_v: false,
            final_logit_softcapping: Some(30.0),
            use_double_wide_mlp: true,
            enable_moe_block: false,
            num_experts: None,
            top_k_experts: None,
            moe_intermediate_size: None,
            layer_types: None,
            tie_word_embeddings: true,
        }
    }
}

struct Attn {
    /// q, then k and v (or k alone when K = V) unless keys are shared.
    proj: LinearGroup,
    has_kv: bool,
    k_eq_v: bool,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: Option<RmsNorm>,
    eps: f32,
    rope: Rope,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    sliding: bool,
    kernels: Kernels,
}

impl Attn {
    /// Attends through layer `layer`'s cache of each of the pass's row sets,
    /// or through `shared` (per row set, the keys and values the donor layer
    /// attended to). Returns the output and, per row set, the keys and values
    /// it attended to (for the layers that share them).
    fn forward(&self, x: &Array, pass: &mut Pass, layer: usize, shared: Option<&[KvView]>) -> Result<(Array, Vec<KvView>)> {
        let s = x.shape();
        let (b, l, hd) = (s[0], s[1], self.head_dim);
        let parts = self.proj.forward(x)?;
        let q = self.q_norm.forward(&parts[0].reshape(&[b, l, self.heads, hd])?)?;
        let inputs = match (shared, self.has_kv) {
            (Some(_), _) => vec![q],
            (None, false) => return Err(Error::internal("a KV-shared layer got no keys")),
            (None, true) => {
                let k = parts[1].reshape(&[b, l, self.kv_heads, hd])?;
                let v = if self.k_eq_v { k.share() } else { parts[2].reshape(&[b, l, self.kv_heads, hd])? };
                let k = self.k_norm.as_ref().expect("layers with keys have k_norm").forward(&k)?;
                vec![q, k, fast::rms_norm_plain(&v, self.eps)?]
            }
        };
        let mut views = vec![];
        let o = pass.each(inputs, |g, x, cache, ctx| {
            let (rows, len) = (x[0].dim(0), x[0].dim(1));
            let mut x = x.into_iter();
            let q = self.rope.forward(&x.next().expect("q").transpose(&[0, 2, 1, 3])?, &ctx.pos)?;
            let kv = match shared {
                Some(kvs) => kvs[g].share(),
                None => {
                    let k = self.rope.forward(&x.next().expect("k").transpose(&[0, 2, 1, 3])?, &ctx.pos)?;
                    let v = x.next().expect("v").transpose(&[0, 2, 1, 3])?;
                    // A ring returns only the keys inside the new queries'
                    // windows; the layers sharing them see the same.
                    match (cache.get_mut(layer), self.sliding) {
                        (Some(LayerCache::Ring(c)), true) => {
                            let (keys, values) = c.update_and_fetch(&k, &v)?;
                            KvView::Dense { keys, values }
                        }
                        (Some(LayerCache::Paged(c)), _) => c.update_with(&k, &v, self.kernels)?,
                        (Some(c), false) => c.kv_mut()?.update_with(&k, &v, self.kernels)?,
                        _ => return Err(Error::internal("a layer with keys got no cache of its kind")),
                    }
                }
            };
            let mask = if self.sliding { ctx.masks.window()? } else { ctx.masks.full()? };
            let o = kv.attend(&q, 1.0, mask, self.kernels)?;
            views.push(kv);
            Ok(o.transpose(&[0, 2, 1, 3])?.reshape(&[rows, len, self.heads * hd])?)
        })?;
        Ok((self.o.forward(&o)?, views))
    }
}

struct Moe {
    proj: Linear,
    /// `scale * hidden^-½`, the router norm's weight.
    norm_w: Array,
    per_expert_scale: Array,
    experts: SwitchGlu,
    top_k: i32,
    num_experts: i32,
    pre_norm: RmsNorm,
    post_norm_1: RmsNorm,
    post_norm_2: RmsNorm,
}

struct PerLayerInput {
    gate: Linear,
    projection: Linear,
    norm: RmsNorm,
}

struct Block {
    attn: Attn,
    mlp: Mlp,
    moe: Option<Moe>,
    per_layer: Option<PerLayerInput>,
    input_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ff_norm: RmsNorm,
    post_ff_norm: RmsNorm,
    layer_scalar: Array,
    /// The layer whose keys and values this one uses (itself unless shared).
    kv_from: usize,
    eps: f32,
}

/// Per-layer input embeddings: a table of `layers × size` per token.
struct PerLayerEmbed {
    table: Embedding,
    model_projection: Linear,
    projection_norm: RmsNorm,
    size: i32,
}

pub struct Gemma4 {
    embed: Embedding,
    embed_scale: f32,
    per_layer: Option<PerLayerEmbed>,
    blocks: Vec<Block>,
    norm: RmsNorm,
    head: Head,
    softcap: Option<f32>,
    window: i32,
    /// Layers with a cache of their own (the first ones; the rest share).
    cached_layers: usize,
    info: ModelInfo,
}

pub fn load(config: &Value, w: &mut Weights, mut info: ModelInfo) -> Result<Box<dyn LanguageModel>> {
    let cfg: Config = super::load::from_config("gemma4_text", config)?;
    let n = cfg.num_hidden_layers;
    let types: Vec<String> = match &cfg.layer_types {
        Some(t) if t.len() as i32 == n => t.clone(),
        Some(t) => return Err(Error::model(format!("config.json: {} layer_types for {n} layers", t.len()))),
        None => {
            let p = cfg.sliding_window_pattern.max(1);
            (0..n).map(|i| if (i + 1) % p == 0 { "full_attention" } else { "sliding_attention" }.to_string()).collect()
        }
    };
    if let Some(bad) = types.iter().find(|t| !matches!(t.as_str(), "full_attention" | "sliding_attention")) {
        return Err(Error::unsupported(format!("gemma4_text layer type `{bad}` is not supported")));
    }
    let first_shared = n - cfg.num_kv_shared_layers;
    if first_shared <= 0 && cfg.num_kv_shared_layers > 0 {
        return Err(Error::model("config.json: every layer shares its keys; none computes them"));
    }
    let (d, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
    let norm = |w: &mut Weights, name: &str, n: i32| -> Result<RmsNorm> { Ok(RmsNorm { w: w.take_shaped(name, &[n])?, eps }) };
    let rope_params = |kind: &str| -> Value {
        match cfg.rope_parameters.as_ref().and_then(|r| r.get(kind)) {
            Some(v) => v.clone(),
            None if kind == "full_attention" => {
                serde_json::json!({"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"})
            }
            None => serde_json::json!({"partial_rotary_factor": 1.0, "rope_theta": 10_000.0, "rope_type": "default"}),
        }
    };
    let embed = w.embedding("model.embed_tokens", cfg.vocab_size, d)?;
    let hpl = cfg.hidden_size_per_layer_input;
    let per_layer = if hpl > 0 {
        Some(PerLayerEmbed {
            table: w.embedding("model.embed_tokens_per_layer", cfg.vocab_size_per_layer_input.unwrap_or(cfg.vocab_size), n * hpl)?,
            model_projection: w.linear("model.per_layer_model_projection", d, n * hpl, false)?,
            projection_norm: norm(w, "model.per_layer_projection_norm.weight", hpl)?,
            size: hpl,
        })
    } else {
        None
    };
    let mut blocks: Vec<Block> = vec![];
    let mut last_of_type = std::collections::HashMap::new();
    let mut kv_bytes = 0;
    for i in 0..n {
        let p = format!("model.layers.{i}");
        let sliding = types[i as usize] == "sliding_attention";
        let hd = match cfg.global_head_dim {
            Some(g) if !sliding && g > 0 => g,
            _ => cfg.head_dim,
        };
        let k_eq_v = cfg.attention_k_eq_v && !sliding;
        let kv_heads = match cfg.num_global_key_value_heads {
            Some(h) if k_eq_v => h,
            _ => cfg.num_key_value_heads,
        };
        let has_kv = i < first_shared;
        let nh = cfg.num_attention_heads;
        let a = format!("{p}.self_attn");
        let mut parts = vec![(w.linear(&format!("{a}.q_proj"), d, nh * hd, false)?, nh * hd)];
        if has_kv {
            parts.push((w.linear(&format!("{a}.k_proj"), d, kv_heads * hd, false)?, kv_heads * hd));
            if !k_eq_v {
                parts.push((w.linear(&format!("{a}.v_proj"), d, kv_heads * hd, false)?, kv_heads * hd));
            }
            kv_bytes += bytes_per_position(kv_heads, hd, Dtype::F32);
        } else {
            // Full checkpoints keep these for KV-shared layers; mlx-lm drops them.
            for m in ["k_proj", "v_proj", "k_norm"] {
                w.discard(&format!("{a}.{m}"));
            }
        }
        let rp = rope_params(&types[i as usize]);
        let theta = rp.get("rope_theta").and_then(Value::as_f64).unwrap_or(10_000.0) as f32;
        let rope = match rp.get("rope_type").or_else(|| rp.get("type")).and_then(Value::as_str).unwrap_or("default") {
            "proportional" => {
                let partial = rp.get("partial_rotary_factor").and_then(Value::as_f64).unwrap_or(1.0);
                let factor = rp.get("factor").and_then(Value::as_f64).unwrap_or(1.0) as f32;
                Rope::proportional(hd, (hd as f64 * partial) as i32, theta, factor, cfg.rope_traditional)?
            }
            _ => Rope::new(hd, theta, cfg.rope_traditional, Some(&rp), cfg.max_position_embeddings)?,
        };
        let attn = Attn {
            proj: FusedLinear::new(parts)?,
            has_kv,
            k_eq_v,
            o: w.linear(&format!("{a}.o_proj"), nh * hd, d, false)?,
            q_norm: norm(w, &format!("{a}.q_norm.weight"), hd)?,
            k_norm: if has_kv { Some(norm(w, &format!("{a}.k_norm.weight"), hd)?) } else { None },
            eps,
            rope,
            heads: nh,
            kv_heads,
            head_dim: hd,
            sliding,
            kernels: w.kernels(),
        };
        let kv_from = if has_kv {
            last_of_type.insert(sliding, i as usize);
            i as usize
        } else {
            *last_of_type.get(&sliding).ok_or_else(|| Error::model(format!("layer {i} shares keys with no earlier layer of its type")))?
        };
        let wide = cfg.use_double_wide_mlp && !has_kv && first_shared > 0;
        let inter = cfg.intermediate_size * if wide { 2 } else { 1 };
        let moe = if cfg.enable_moe_block {
            let (e, k, mi) = match (cfg.num_experts, cfg.top_k_experts, cfg.moe_intermediate_size) {
                (Some(e), Some(k), Some(mi)) if k > 0 && k <= e => (e, k, mi),
                _ => return Err(Error::model("config.json: the MoE block needs num_experts, top_k_experts, moe_intermediate_size")),
            };
            let scale = w.take_shaped(&format!("{p}.router.scale"), &[d])?;
            let root = scale.scalar_like((d as f64).powf(-0.5) as f32)?;
            Some(Moe {
                proj: w.linear(&format!("{p}.router.proj"), d, e, false)?,
                norm_w: scale.multiply(&root)?,
                per_expert_scale: w.take_shaped(&format!("{p}.router.per_expert_scale"), &[e])?,
                experts: SwitchGlu::load(w, &format!("{p}.experts.switch_glu"), e, d, mi, Act::GeluTanh)?,
                top_k: k,
                num_experts: e,
                pre_norm: norm(w, &format!("{p}.pre_feedforward_layernorm_2.weight"), d)?,
                post_norm_1: norm(w, &format!("{p}.post_feedforward_layernorm_1.weight"), d)?,
                post_norm_2: norm(w, &format!("{p}.post_feedforward_layernorm_2.weight"), d)?,
            })
        } else {
            None
        };
        let per_layer_input = if hpl > 0 {
            Some(PerLayerInput {
                gate: w.linear(&format!("{p}.per_layer_input_gate"), d, hpl, false)?,
                projection: w.linear(&format!("{p}.per_layer_projection"), hpl, d, false)?,
                norm: norm(w, &format!("{p}.post_per_layer_input_norm.weight"), d)?,
            })
        } else {
            None
        };
        blocks.push(Block {
            attn,
            mlp: Mlp::load(w, &format!("{p}.mlp"), d, inter, Act::GeluTanh)?,
            moe,
            per_layer: per_layer_input,
            input_norm: norm(w, &format!("{p}.input_layernorm.weight"), d)?,
            post_attn_norm: norm(w, &format!("{p}.post_attention_layernorm.weight"), d)?,
            pre_ff_norm: norm(w, &format!("{p}.pre_feedforward_layernorm.weight"), d)?,
            post_ff_norm: norm(w, &format!("{p}.post_feedforward_layernorm.weight"), d)?,
            layer_scalar: w.take_shaped(&format!("{p}.layer_scalar"), &[1])?,
            kv_from,
            eps,
        });
    }
    let norm = norm(w, "model.norm.weight", d)?;
    let head = Head::load(w, "lm_head", Some(cfg.tie_word_embeddings), d, cfg.vocab_size)?;
    info.architecture = "gemma4_text".into();
    info.vocab_size = cfg.vocab_size;
    info.num_layers = n;
    info.hidden_size = d;
    info.context_length = cfg.max_position_embeddings.unwrap_or(0);
    info.kv_bytes_per_token = kv_bytes;
    Ok(Box::new(Gemma4 {
        embed,
        embed_scale: (d as f64).sqrt() as f32,
        per_layer,
        blocks,
        norm,
        head,
        softcap: cfg.final_logit_softcapping.filter(|&c| c > 0.0),
        window: cfg.sliding_window,
        cached_layers: first_shared.min(n) as usize,
        info,
    }))
}

impl Gemma4 {
    /// Each layer's extra input `[B, L, layers, size]` from the per-layer
    /// table and a projection of the scaled token embedding `h`.
    /// The token embeddings times the embedding scale.
    fn scaled_embeddings(&self, tokens: &Array) -> Result<Array> {
        let h = self.embed.forward(tokens)?;
        Ok(h.multiply(&h.scalar_like(self.embed_scale)?)?)
    }

    fn per_layer_inputs(&self, tokens: &Array, h: &Array) -> Result<Option<Array>> {
        let Some(p) = &self.per_layer else { return Ok(None) };
        let s = h.shape();
        let shape = [s[0], s[1], self.blocks.len() as i32, p.size];
        let e = p.table.forward(tokens)?;
        let e = e.multiply(&e.scalar_like((p.size as f64).sqrt() as f32)?)?.reshape(&shape)?;
        let proj = p.model_projection.forward(h)?;
        let proj = proj.multiply(&proj.scalar_like((s[2] as f64).powf(-0.5) as f32)?)?.reshape(&shape)?;
        let proj = p.projection_norm.forward(&proj)?;
        let mixed = proj.add(&e)?;
        Ok(Some(mixed.multiply(&mixed.scalar_like(0.5f64.sqrt() as f32)?)?))
    }

    /// The layers over the scaled input embeddings `h`, per-layer inputs
    /// from `tokens`.
    fn run(&self, tokens: &Array, mut h: Array, mut pass: Pass) -> Result<Option<Array>> {
        let per_layer = self.per_layer_inputs(tokens, &h)?;
        // Per layer with its own keys: those it attended to, per row set.
        let mut kvs: Vec<Option<Vec<KvView>>> = Vec::with_capacity(self.blocks.len());
        for (i, b) in self.blocks.iter().enumerate() {
            let own = b.kv_from == i;
            let shared = if own { None } else { kvs[b.kv_from].as_deref() };
            let (r, kv) = b.attn.forward(&b.input_norm.forward(&h)?, &mut pass, i, shared)?;
            h = h.add(&b.post_attn_norm.forward(&r)?)?;
            h = h.add(&b.post_ff_norm.forward(&b.ffn(&h)?)?)?;
            if let (Some(p), Some(inputs)) = (&b.per_layer, &per_layer) {
                let x = inputs.slice_axis(2, i as i32, i as i32 + 1)?.squeeze(2)?;
                let g = gelu_tanh(&p.gate.forward(&h)?)?.multiply(&x)?;
                h = h.add(&p.norm.forward(&p.projection.forward(&g)?)?)?;
            }
            h = h.multiply(&b.layer_scalar)?;
            pass.settle(&h)?;
            kvs.push(own.then_some(kv));
        }
        pass.logits(h, |h| {
            let logits = self.head.forward(&self.norm.forward(h)?, &self.embed)?;
            Ok(match self.softcap {
                Some(c) => {
                    let cap = logits.scalar_like(c)?;
                    logits.divide(&cap)?.tanh()?.multiply(&cap)?
                }
                None => logits,
            })
        })
    }
}

impl Block {
    fn ffn(&self, h: &Array) -> Result<Array> {
        let Some(m) = &self.moe else {
            return self.mlp.forward(&self.pre_ff_norm.forward(h)?);
        };
        let h1 = m.post_norm_1.forward(&self.mlp.forward(&self.pre_ff_norm.forward(h)?)?)?;
        // Router: its own norm, top-k of the raw scores, softmax over the k,
        // times each chosen expert's scale.
        let scores = m.proj.forward(&fast::rms_norm(h, &m.norm_w, self.eps)?)?;
        let part = scores.argpartition(m.num_experts - m.top_k, -1)?;
        let e = part.dim(-1);
        let idx = part.slice_axis(-1, e - m.top_k, e)?;
        let weights = scores.take_along_axis(&idx, -1)?.softmax(-1, false)?;
        let weights = weights.multiply(&m.per_expert_scale.take(&idx, 0)?)?;
        let y = m.experts.forward(&m.pre_norm.forward(h)?, &idx)?;
        let h2 = m.post_norm_2.forward(&weights.expand_dims(-1)?.multiply(&y)?.sum(-2, false)?)?;
        Ok(h1.add(&h2)?)
    }
}

impl LanguageModel for Gemma4 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self, rows: usize) -> Vec<LayerCache> {
        self.blocks[..self.cached_layers]
            .iter()
            .map(|b| match b.attn.sliding {
                true => LayerCache::Ring(RingCache::new(rows, self.window)),
                false => LayerCache::Kv(KvCache::new(rows)),
            })
            .collect()
    }

    fn kv_layers(&self) -> Vec<Option<crate::cache::scheme::KvLayer>> {
        let layer = |a: &Attn| crate::cache::scheme::KvLayer {
            kv_heads: a.kv_heads,
            k_dim: a.head_dim,
            v_dim: a.head_dim,
            window: a.sliding.then_some(self.window),
        };
        self.blocks[..self.cached_layers].iter().map(|b| Some(layer(&b.attn))).collect()
    }

    fn forward(&self, tokens: &Array, cache: &mut [LayerCache], out: Output) -> Result<Option<Array>> {
        self.run(tokens, self.scaled_embeddings(tokens)?, Pass::single(cache, tokens.dim(1), out, self.cached_layers)?)
    }

    fn supports_mixed(&self) -> bool {
        true
    }

    fn forward_mixed(&self, tokens: &Array, groups: &mut [Group]) -> Result<Option<Array>> {
        self.run(tokens, self.scaled_embeddings(tokens)?, Pass::mixed(tokens, groups, self.cached_layers)?)
    }

    /// The towers' rows in place of the soft tokens' embeddings (whose
    /// per-layer inputs take token 0); each image's tokens attend to one
    /// another both ways.
    fn forward_media(&self, tokens: &Array, media: &MediaInput, cache: &mut [LayerCache], out: Output) -> Result<Option<Array>> {
        let h = media.splice(&self.scaled_embeddings(tokens)?)?;
        let mut ids = tokens.to_vec_i32()?;
        for &p in &media.at {
            ids[p] = 0;
        }
        let ids = Array::from_i32(&ids, &tokens.shape())?;
        let n = tokens.dim(1);
        let both_ways = match (n > 1, &media.blocks[..]) {
            (true, [_, ..]) => Some(bidirectional_masks(cache, n, &media.blocks, self.window)?),
            _ => None,
        };
        let mut pass = Pass::single(cache, n, out, self.cached_layers)?;
        if let Some((full, window)) = both_ways {
            pass.set_masks(Masks::given(full, window))?;
        }
        self.run(&ids, h, pass)
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = self.embed.arrays();
        if let Some(p) = &self.per_layer {
            v.extend(p.table.arrays());
            v.extend(p.model_projection.arrays());
            v.push(&p.projection_norm.w);
        }
        for b in &self.blocks {
            v.extend(b.attn.proj.arrays());
            v.extend(b.attn.o.arrays());
            v.push(&b.attn.q_norm.w);
            v.extend(b.attn.k_norm.iter().map(|n| &n.w));
            v.extend(b.mlp.arrays());
            if let Some(m) = &b.moe {
                v.extend(m.proj.arrays());
                v.extend([&m.norm_w, &m.per_expert_scale]);
                v.extend(m.experts.arrays());
                v.extend([&m.pre_norm.w, &m.post_norm_1.w, &m.post_norm_2.w]);
            }
            if let Some(p) = &b.per_layer {
                v.extend(p.gate.arrays());
                v.extend(p.projection.arrays());
                v.push(&p.norm.w);
            }
            v.extend([&b.input_norm.w, &b.post_attn_norm.w, &b.pre_ff_norm.w, &b.post_ff_norm.w, &b.layer_scalar]);
        }
        v.push(&self.norm.w);
        v.extend(self.head.arrays());
        v
    }
}

/// The (full, sliding) masks of a one-row prefill chunk of `n` tokens in
/// which the tokens of each of `blocks` (chunk positions) also see each
/// other: causal (within the window for sliding layers) or in the same
/// block, over the keys each kind of cache returns (`KvCache`: every
/// position; `RingCache`: from the first one the window lets a new query
/// see).
fn bidirectional_masks(cache: &[LayerCache], n: i32, blocks: &[std::ops::Range<usize>], window: i32) -> Result<(AttnMask, AttnMask)> {
    let t = cache[0].timeline();
    if t.rows() != 1 || t.pads()[0] != 0 {
        return Err(Error::internal("a media prompt prefills alone, unpadded"));
    }
    // Paged attention bounds every query causally (the kernels read no mask).
    if cache.iter().any(|c| matches!(c, LayerCache::Paged(_))) {
        return Err(Error::unsupported("Gemma 4 images attend both ways, which paged KV (kv_paging) does not do yet"));
    }
    let len = t.len();
    let block = |j: i32| blocks.iter().position(|b| b.contains(&(j as usize)));
    let mask = |start: i32, window: Option<i32>| -> Result<AttnMask> {
        let keys = len + n - start;
        let mut allowed = Vec::with_capacity((n * keys) as usize);
        for i in 0..n {
            let q = len + i;
            for k in start..len + n {
                let causal = k <= q && window.is_none_or(|w| k + w > q);
                let same = k >= len && block(i).is_some() && block(i) == block(k - len);
                allowed.push((causal || same) as i32);
            }
        }
        let a = Array::from_i32(&allowed, &[1, 1, n, keys])?;
        Ok(AttnMask::Array(a.greater(&Array::scalar_i32(0)?)?))
    };
    Ok((mask(0, None)?, mask((len - window + 1).max(0), Some(window))?))
}

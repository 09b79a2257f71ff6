//! The Llama architecture (also SmolLM, Llama 2/3.x, Mistral-style dense
//! configs): pre-norm decoder blocks with grouped-query attention, RoPE and a
//! SwiGLU MLP. Tensor names follow the Hugging Face checkpoint.

use super::layers::{gated_mlp_hidden, Either, Embedding, FusedLinear, Kernels, Linear, RmsNorm, Rope};
use super::weights::Weights;
use super::{LanguageModel, ModelInfo, Output};
use crate::cache::{AttnMask, KvCache, Positions};
use crate::error::{Error, Result};
use crate::mlx::fast;
use crate::cache::kv::bytes_per_position;
use crate::mlx::{Array, Dtype};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
pub struct LlamaConfig {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
}

fn default_theta() -> f32 {
    10000.0
}

impl LlamaConfig {
    fn kv_heads(&self) -> i32 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }
    fn head_dim(&self) -> i32 {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads)
    }
    fn validate(&self) -> Result<()> {
        let pos = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("vocab_size", self.vocab_size),
            ("head_dim", self.head_dim()),
        ];
        for (name, v) in pos {
            if v <= 0 {
                return Err(Error::model(format!("config.json: `{name}` must be positive, got {v}")));
            }
        }
        if self.num_attention_heads % self.kv_heads() != 0 {
            return Err(Error::model(format!(
                "config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.kv_heads()
            )));
        }
        Ok(())
    }
}

struct Attention {
    /// q, k and v projections.
    qkv: Either,
    o: Linear,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    scale: f32,
}

impl Attention {
    fn forward(&self, x: &Array, cache: &mut KvCache, rope: &Rope, pos: &Positions, mask: &AttnMask) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let split = |y: Array, h: i32| -> Result<Array> {
            Ok(y.reshape(&[b, l, h, self.head_dim])?.transpose(&[0, 2, 1, 3])?)
        };
        let mut qkv = self.qkv.forward(x)?.into_iter();
        let mut next = || qkv.next().expect("three projections");
        let q = split(next(), self.heads)?;
        let k = split(next(), self.kv_heads)?;
        let v = split(next(), self.kv_heads)?;
        let q = rope.forward(&q, pos)?;
        let k = rope.forward(&k, pos)?;
        let (k, v) = cache.update_and_fetch(&k, &v)?;
        let o = fast::scaled_dot_product_attention(&q, &k, &v, self.scale, mask.as_mask())?;
        let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, self.heads * self.head_dim])?;
        self.o.forward(&o)
    }
}

struct Mlp {
    /// gate and up projections.
    gate_up: Either,
    down: Linear,
    /// Auto: mlxrt's one-node SwiGLU on the CPU; Stock: MLX's ops.
    kernels: Kernels,
}

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        let h = gated_mlp_hidden(&self.gate_up, x, self.kernels)?;
        self.down.forward(&h)
    }
}

struct Block {
    attn: Attention,
    mlp: Mlp,
    input_norm: RmsNorm,
    post_norm: RmsNorm,
}

pub struct Llama {
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    rope: Rope,
    info: ModelInfo,
}

impl Llama {
    pub fn load(cfg: &LlamaConfig, w: &mut Weights, mut info: ModelInfo) -> Result<Llama> {
        cfg.validate()?;
        let (d, hd) = (cfg.hidden_size, cfg.head_dim());
        let (nh, nkv) = (cfg.num_attention_heads, cfg.kv_heads());
        let norm = |w: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm { w: w.take_shaped(name, &[d])?, eps: cfg.rms_norm_eps })
        };
        let embed = w.embedding("model.embed_tokens", cfg.vocab_size, d)?;
        let mut blocks = Vec::with_capacity(cfg.num_hidden_layers as usize);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let ab = cfg.attention_bias;
            let attn = Attention {
                qkv: FusedLinear::new(vec![
                    (w.linear(&format!("{p}.self_attn.q_proj"), d, nh * hd, ab)?, nh * hd),
                    (w.linear(&format!("{p}.self_attn.k_proj"), d, nkv * hd, ab)?, nkv * hd),
                    (w.linear(&format!("{p}.self_attn.v_proj"), d, nkv * hd, ab)?, nkv * hd),
                ])?,
                o: w.linear(&format!("{p}.self_attn.o_proj"), nh * hd, d, ab)?,
                heads: nh,
                kv_heads: nkv,
                head_dim: hd,
                scale: (hd as f32).powf(-0.5),
            };
            let f = cfg.intermediate_size;
            let mb = cfg.mlp_bias;
            let mlp = Mlp {
                gate_up: FusedLinear::new(vec![
                    (w.linear(&format!("{p}.mlp.gate_proj"), d, f, mb)?, f),
                    (w.linear(&format!("{p}.mlp.up_proj"), d, f, mb)?, f),
                ])?,
                down: w.linear(&format!("{p}.mlp.down_proj"), f, d, mb)?,
                kernels: w.kernels(),
            };
            blocks.push(Block {
                attn,
                mlp,
                input_norm: norm(w, &format!("{p}.input_layernorm.weight"))?,
                post_norm: norm(w, &format!("{p}.post_attention_layernorm.weight"))?,
            });
        }
        let norm = norm(w, "model.norm.weight")?;
        let tie = cfg.tie_word_embeddings.unwrap_or(!w.contains("lm_head.weight"));
        let lm_head = if tie { None } else { Some(w.linear("lm_head", d, cfg.vocab_size, false)?) };
        let rope = Rope::new(hd, cfg.rope_theta, cfg.rope_traditional, cfg.rope_scaling.as_ref(), cfg.max_position_embeddings)?;
        info.architecture = "llama".into();
        info.vocab_size = cfg.vocab_size;
        info.num_layers = cfg.num_hidden_layers;
        info.hidden_size = d;
        info.kv_bytes_per_token = cfg.num_hidden_layers as usize * bytes_per_position(nkv, hd, Dtype::F32);
        if let Some(n) = cfg.max_position_embeddings {
            info.context_length = n;
        }
        Ok(Llama { embed, blocks, norm, lm_head, rope, info })
    }
}

impl LanguageModel for Llama {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self, rows: usize) -> Vec<KvCache> {
        (0..self.blocks.len()).map(|_| KvCache::new(rows)).collect()
    }

    fn forward(&self, tokens: &Array, cache: &mut [KvCache], out: Output) -> Result<Option<Array>> {
        if cache.len() != self.blocks.len() {
            return Err(Error::internal("cache has the wrong number of layers"));
        }
        let pos = cache[0].positions()?;
        let mask = cache[0].mask(tokens.dim(1))?;
        let mut h = self.embed.forward(tokens)?;
        for (blk, c) in self.blocks.iter().zip(cache.iter_mut()) {
            let a = blk.attn.forward(&blk.input_norm.forward(&h)?, c, &self.rope, &pos, &mask)?;
            h = h.add(&a)?;
            let m = blk.mlp.forward(&blk.post_norm.forward(&h)?)?;
            h = h.add(&m)?;
        }
        let h = match out {
            Output::CacheOnly => return Ok(None),
            Output::AllLogits => h,
            Output::LastLogits => {
                let l = h.dim(1);
                h.slice_axis(1, l - 1, l)?
            }
        };
        let h = self.norm.forward(&h)?;
        let logits = match &self.lm_head {
            Some(head) => head.forward(&h)?,
            None => self.embed.as_linear(&h)?,
        };
        Ok(Some(logits))
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = self.embed.arrays();
        for b in &self.blocks {
            v.extend(b.attn.qkv.arrays());
            v.extend(b.mlp.gate_up.arrays());
            v.extend(b.attn.o.arrays());
            v.extend(b.mlp.down.arrays());
            v.push(&b.input_norm.w);
            v.push(&b.post_norm.w);
        }
        v.push(&self.norm.w);
        if let Some(h) = &self.lm_head {
            v.extend(h.arrays());
        }
        v
    }
}

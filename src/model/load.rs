//! Loading a model from a Hugging Face MLX-format folder or a single GGUF file
//! into an architecture plus the text assets (tokenizer, chat template, EOS
//! ids). Weights are evaluated here, so a bad file fails the load, not the
//! first request.

use super::check;
use super::layers::{Kernels, QuantSpec};
use super::llama::{self, LlamaConfig};
use super::gemma4_audio::Gemma4Audio;
use super::gemma4_vision::Gemma4Vision;
use super::qwen_vision::QwenVision;
use super::siglip::Gemma3Vision;
use super::media::Towers;
use super::weights::{QuantConfig, Weights};
use super::{LanguageModel, ModelInfo};
use crate::error::{Error, Result};
use crate::media::MediaSpec;
use crate::mlx::io::{Meta, TensorFile};
use crate::mlx::{self, Array, Dtype};
use crate::text::{ChatTemplate, GgufVocab, Tokenizer};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Load progress: called with the fraction done (0..=1) and the phase
/// ("reading", "building", "evaluating"); returning false aborts the load.
pub type Progress = std::sync::Arc<dyn Fn(f32, &str) -> bool + Send + Sync>;

#[derive(Clone)]
pub struct LoadOptions {
    /// Cast quantization scales/biases to f32 when running on the CPU device
    /// (lossless, and much faster for MLX's CPU kernels), for the layers
    /// MLX's kernels run: all of them under `Kernels::Stock`, MoE experts
    /// otherwise (mlxrt's quantized matmul reads f16 scales as stored).
    pub cpu_f32_scales: bool,
    pub kernels: Kernels,
    pub progress: Option<Progress>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { cpu_f32_scales: true, kernels: Kernels::Auto, progress: None }
    }
}

impl LoadOptions {
    fn report(&self, fraction: f32, phase: &str) -> Result<()> {
        match &self.progress {
            Some(p) if !p(fraction, phase) => {
                Err(Error::new(crate::ErrorKind::Aborted, "the model load was aborted by the progress callback"))
            }
            _ => Ok(()),
        }
    }
}

/// Tokenizer, template and stop ids: plain data usable from any thread.
pub struct TextAssets {
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub eos_ids: Vec<u32>,
    /// How to prepare media, when the model has a tower.
    pub media: Option<Arc<MediaSpec>>,
}

pub struct LoadedModel {
    pub model: Box<dyn LanguageModel>,
    pub text: TextAssets,
    /// Bytes of all parameters as loaded.
    pub parameter_bytes: usize,
    /// Identifies the checkpoint's files (names, sizes, first and last MiB),
    /// so state saved for one model is never loaded for another.
    pub fingerprint: String,
    /// The checkpoint's towers (scheduler thread; `text.media` then says how
    /// to prepare media for them).
    pub towers: Towers,
}

type Parts = (Box<dyn LanguageModel>, TextAssets, Towers);

/// Loads `path`: a `.gguf` file or a folder with `config.json`.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    let ctx = || format!("loading model {}", path.display());
    if !path.exists() {
        return Err(Error::model(format!("model path {} does not exist", path.display())));
    }
    let scale_dtype = (opts.cpu_f32_scales && !mlx::device::default_is_gpu()).then_some(Dtype::F32);
    opts.report(0.0, "reading")?;
    let loaded = if path.is_dir() {
        load_folder(path, scale_dtype, opts).map_err(|e| e.context(ctx()))?
    } else {
        load_gguf(path, scale_dtype, opts).map_err(|e| e.context(ctx()))?
    };
    let (model, text, towers) = loaded;
    opts.report(0.4, "evaluating")?;
    // Materialize the weights in about ten steps, reporting progress.
    let mut params = model.parameters();
    params.extend(towers.parameters());
    let step = params.len().div_ceil(10).max(1);
    for (i, group) in params.chunks(step).enumerate() {
        mlx::eval(group).map_err(|e| Error::model(e.to_string()).context(ctx()))?;
        opts.report(0.4 + 0.6 * ((i + 1) * step).min(params.len()) as f32 / params.len().max(1) as f32, "evaluating")?;
    }
    let parameter_bytes = params.iter().map(|a| a.nbytes()).sum();
    drop(params);
    let fingerprint = fingerprint(path).map_err(|e| Error::from(e).context(ctx()))?;
    Ok(LoadedModel { model, text, parameter_bytes, fingerprint, towers })
}

/// CRC-32 over the name, size, first and last MiB of each checkpoint file.
fn fingerprint(path: &Path) -> std::io::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut files: Vec<PathBuf> = if path.is_dir() {
        std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors" || x == "json"))
            .collect()
    } else {
        vec![path.to_path_buf()]
    };
    files.sort();
    let mut h = crc32fast::Hasher::new();
    const MIB: u64 = 1 << 20;
    for f in files {
        let mut file = std::fs::File::open(&f)?;
        let len = file.metadata()?.len();
        h.update(f.file_name().unwrap_or_default().as_encoded_bytes());
        h.update(&len.to_le_bytes());
        let mut buf = vec![0u8; len.min(MIB) as usize];
        file.read_exact(&mut buf)?;
        h.update(&buf);
        if len > MIB {
            file.seek(SeekFrom::Start(len - len.min(MIB)))?;
            file.read_exact(&mut buf)?;
            h.update(&buf);
        }
    }
    Ok(format!("{:08x}", h.finalize()))
}

// ---------------------------------------------------------------- folders

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::model(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| Error::model(format!("{} is not valid JSON: {e}", path.display())))
}

fn load_folder(dir: &Path, scale_dtype: Option<Dtype>, opts: &LoadOptions) -> Result<Parts> {
    let config = read_json(&dir.join("config.json"))?;
    let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("");
    check_supported(model_type)?;
    check::config::check(&config)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::model(format!("no .safetensors files in {}", dir.display())));
    }
    let mut tensors = HashMap::new();
    for f in &files {
        check::safetensors::check_file(f)?;
        let mut tf = TensorFile::load_safetensors(&f.to_string_lossy())
            .map_err(|e| Error::model(format!("{}: {}", f.display(), e.0)))?;
        for name in tf.names()? {
            let a = tf.take(&name)?;
            tensors.insert(name, a);
        }
    }
    let quant = quant_config(&config)?;
    let mut weights = Weights::new(tensors, quant, scale_dtype, opts.kernels);
    opts.report(0.3, "building")?;
    let info = ModelInfo { format: "mlx-folder".into(), ..Default::default() };
    let model = build(model_type, &config, &mut weights, info)?;
    let mut text = folder_text_assets(dir, &config)?;
    let towers = build_towers(model_type, dir, &config, model.info(), &mut weights, &mut text)?;
    weights.finish(model_type)?;
    Ok((model, text, towers))
}

/// The towers of a multimodal checkpoint whose config and tensors have
/// them (none for a text-only folder of the same family), and how to
/// prepare media for them (`text.media`). Their tensors are then read
/// strictly: a missing or left-over one fails the load.
fn build_towers(model_type: &str, dir: &Path, config: &Value, info: &ModelInfo, w: &mut Weights, text: &mut TextAssets) -> Result<Towers> {
    let mut towers = Towers::default();
    match model_type {
        "gemma3" => {
            if let Some(v) = Gemma3Vision::load(config, info.hidden_size, w)? {
                text.media = Some(Arc::new(MediaSpec::gemma3(dir, config, text, v.tokens_per_image)?));
                towers.image = Some(Box::new(v));
                w.finish_prefixes(&["vision_tower.", "multi_modal_projector."])?;
            }
        }
        "qwen3_vl" => {
            if let Some(v) = QwenVision::load(config, info.hidden_size, w)? {
                if v.deepstack_layers() > info.num_layers as usize {
                    return Err(Error::model("config.json: more deepstack layers than the language model has"));
                }
                text.media = Some(Arc::new(MediaSpec::qwen3_vl(dir, config, text, v.merge())?));
                towers.image = Some(Box::new(v));
                w.finish_prefixes(&["vision_tower."])?;
            }
        }
        "gemma4" => {
            let vision = Gemma4Vision::load(config, info.hidden_size, w)?;
            let audio = Gemma4Audio::load(config, info.hidden_size, w)?;
            if vision.is_some() || audio.is_some() {
                let patch_pool = vision.as_ref().map(Gemma4Vision::patch_and_pool);
                text.media = Some(Arc::new(MediaSpec::gemma4(dir, config, text, patch_pool, audio.is_some())?));
            }
            if vision.is_some() {
                w.finish_prefixes(&["vision_tower.", "embed_vision."])?;
            }
            if audio.is_some() {
                w.finish_prefixes(&["audio_tower.", "embed_audio."])?;
            }
            towers.image = vision.map(|v| Box::new(v) as Box<dyn super::Tower>);
            towers.audio = audio.map(|a| Box::new(a) as Box<dyn super::Tower>);
        }
        _ => {}
    }
    Ok(towers)
}

/// `model_type`s a folder may have (mlx-lm's names).
const FOLDER_ARCHITECTURES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "qwen3_vl",
    "gemma3_text",
    "gemma3",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "gemma4_text",
    "gemma4",
];

/// Fails early, before reading weights, for a `model_type` we cannot build.
fn check_supported(model_type: &str) -> Result<()> {
    match model_type {
        "" => Err(Error::model("config.json has no `model_type`")),
        t if FOLDER_ARCHITECTURES.contains(&t) => Ok(()),
        other => Err(Error::unsupported(format!(
            "model_type `{other}` is not supported (supported: {})",
            FOLDER_ARCHITECTURES.join(", ")
        ))),
    }
}

/// Builds the architecture `model_type` names (checked by `check_supported`).
fn build(model_type: &str, config: &Value, w: &mut Weights, info: ModelInfo) -> Result<Box<dyn LanguageModel>> {
    use super::{gemma3, gemma4, qwen2, qwen3, qwen3_5, qwen3_moe};
    Ok(match model_type {
        "llama" | "mistral" => Box::new(llama::load(&parse_config(model_type, config)?, w, info)?),
        "qwen2" => Box::new(qwen2::load(config, w, info)?),
        "qwen3" => Box::new(qwen3::load(config, w, info)?),
        "qwen3_moe" => Box::new(qwen3_moe::load(config, w, info)?),
        "gemma3_text" => Box::new(gemma3::load(config, w, info)?),
        "qwen3_next" | "qwen3_5" | "qwen3_5_moe" => qwen3_5::load(model_type, config, w, info)?,
        "gemma4_text" => gemma4::load(config, w, info)?,
        // Multimodal Gemma checkpoints: their text model alone (mlx-lm's
        // gemma3.py / gemma4.py defaults); `weights::ignorable` lets the
        // towers pass unread.
        "gemma3" => {
            w.strip_prefix("language_model.");
            Box::new(gemma3::load(&text_config(config, 262_208, 8, 4), w, info)?)
        }
        "gemma4" => {
            w.strip_prefix("language_model.");
            gemma4::load(&text_config(config, 262_144, 8, 1), w, info)?
        }
        "qwen3_vl" => {
            w.strip_prefix("language_model.");
            Box::new(qwen3::load_vl(config, w, info)?)
        }
        other => return check_supported(other).and(Err(Error::internal(format!("no builder for `{other}`")))),
    })
}

/// The `text_config` of a multimodal config with the top-level vocabulary
/// size and default head counts filled in.
fn text_config(config: &Value, vocab: i64, heads: i64, kv_heads: i64) -> Value {
    let mut t = config.get("text_config").cloned().filter(Value::is_object).unwrap_or_else(|| serde_json::json!({}));
    let o = t.as_object_mut().expect("an object");
    o.insert("vocab_size".into(), config.get("vocab_size").cloned().unwrap_or(vocab.into()));
    o.entry("num_attention_heads").or_insert(heads.into());
    o.entry("num_key_value_heads").or_insert(kv_heads.into());
    t
}

/// A family's config struct: `#[serde(default)]` over an `impl Default` that
/// holds the defaults for keys config.json may omit, and the keys it must
/// have (checked before parsing, so their placeholders in `Default` are
/// never used).
pub(crate) trait FamilyConfig: serde::de::DeserializeOwned + Default {
    const REQUIRED: &'static [&'static str];
}

/// Reads a family's config struct from config.json. Newer Hugging Face
/// configs nest `rope_theta` (and the scaling) under `rope_parameters`; they
/// are lifted to the top level first.
pub(crate) fn parse_config<T: FamilyConfig>(model_type: &str, config: &Value) -> Result<T> {
    let mut c = config.clone();
    if let Some(o) = c.as_object_mut() {
        if let Some(rp) = o.get("rope_parameters").cloned().filter(Value::is_object) {
            if !o.contains_key("rope_theta") {
                if let Some(t) = rp.get("rope_theta") {
                    o.insert("rope_theta".into(), t.clone());
                }
            }
            if !o.contains_key("rope_scaling") {
                o.insert("rope_scaling".into(), rp);
            }
        }
    }
    from_config(model_type, &c)
}

/// Reads a family's config struct from `config` as it is.
pub(crate) fn from_config<T: FamilyConfig>(model_type: &str, config: &Value) -> Result<T> {
    if let Some(key) = T::REQUIRED.iter().find(|k| config.get(**k).is_none()) {
        return Err(Error::model(format!("config.json for {model_type}: missing field `{key}`")));
    }
    T::deserialize(config).map_err(|e| Error::model(format!("config.json for {model_type}: {e}")))
}

fn quant_config(config: &Value) -> Result<QuantConfig> {
    let Some(q) = config.get("quantization").or_else(|| config.get("quantization_config")) else {
        return Ok(QuantConfig::default());
    };
    let spec = |v: &Value| -> Option<QuantSpec> {
        Some(QuantSpec {
            group_size: v.get("group_size")?.as_i64()? as i32,
            bits: v.get("bits")?.as_i64()? as i32,
        })
    };
    if let Some(mode) = q.get("mode").and_then(Value::as_str) {
        if mode != "affine" {
            return Err(Error::unsupported(format!("quantization mode `{mode}` is not supported (only affine)")));
        }
    }
    let default = spec(q);
    let overrides = q
        .as_object()
        .map(|m| m.iter().filter_map(|(k, v)| spec(v).map(|s| (k.clone(), s))).collect())
        .unwrap_or_default();
    Ok(QuantConfig { default, overrides })
}

fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|x| x as u32)).collect(),
        _ => vec![],
    }
}

fn folder_text_assets(dir: &Path, config: &Value) -> Result<TextAssets> {
    let tok_path = dir.join("tokenizer.json");
    if !tok_path.exists() {
        return Err(Error::model(format!("{} is missing", tok_path.display())));
    }
    let tokenizer = Tokenizer::from_file(&tok_path).map_err(|e| Error::model(e.to_string()))?;
    let tc_path = dir.join("tokenizer_config.json");
    let tc = if tc_path.exists() { read_json(&tc_path)? } else { Value::Null };
    let jinja = dir.join("chat_template.jinja");
    let source = if jinja.exists() {
        Some(std::fs::read_to_string(&jinja)?)
    } else {
        tc.get("chat_template").and_then(Value::as_str).map(str::to_owned)
    };
    let bos = token_string(tc.get("bos_token"));
    let eos = token_string(tc.get("eos_token"));
    let template = source
        .map(|s| ChatTemplate::new(&s, bos.as_deref(), eos.as_deref()))
        .transpose()
        .map_err(|e| Error::model(format!("chat template: {e}")))?;
    let mut eos_ids = ids_of(config.get("eos_token_id"));
    let gen = dir.join("generation_config.json");
    if gen.exists() {
        eos_ids.extend(ids_of(read_json(&gen)?.get("eos_token_id")));
    }
    if let Some(id) = eos.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
        eos_ids.push(id);
    }
    eos_ids.sort_unstable();
    eos_ids.dedup();
    Ok(TextAssets { tokenizer: Arc::new(tokenizer), template, eos_ids, media: None })
}

// ---------------------------------------------------------------- GGUF

fn meta_u32(f: &TensorFile, key: &str) -> Result<Option<u32>> {
    match f.meta(key)? {
        Some(Meta::Arr(a)) => Ok(Some(a.to_vec_i32()?.first().copied().unwrap_or(0) as u32)),
        _ => Ok(None),
    }
}

fn meta_f32(f: &TensorFile, key: &str) -> Result<Option<f32>> {
    match f.meta(key)? {
        Some(Meta::Arr(a)) => Ok(a.to_vec_f32()?.first().copied()),
        _ => Ok(None),
    }
}

fn meta_string(f: &TensorFile, key: &str) -> Result<Option<String>> {
    match f.meta(key)? {
        Some(Meta::Str(s)) => Ok(Some(s)),
        _ => Ok(None),
    }
}

/// HF module path for a GGUF tensor base name (without `.weight` etc.).
fn hf_module(base: &str) -> Option<String> {
    match base {
        "token_embd" => return Some("model.embed_tokens".into()),
        "output_norm" => return Some("model.norm".into()),
        "output" => return Some("lm_head".into()),
        _ => {}
    }
    let rest = base.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let hf = match part {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

/// GGUF stores Llama Q/K rows interleaved for traditional RoPE; this restores
/// the Hugging Face half-split order (rows only, so it is exact for packed
/// weights, scales and biases alike).
fn unpermute_rows(a: &Array, heads: i32) -> Result<Array> {
    let s = a.shape();
    let rows = s[0];
    let hd = rows / heads;
    let mut split = vec![heads, hd / 2, 2];
    split.extend_from_slice(&s[1..]);
    Ok(a.reshape(&split)?.swapaxes(1, 2)?.reshape(&s)?)
}

fn load_gguf(path: &Path, scale_dtype: Option<Dtype>, opts: &LoadOptions) -> Result<Parts> {
    check::gguf::check_file(path)?;
    let mut f = TensorFile::load_gguf(&path.to_string_lossy()).map_err(|e| Error::model(e.0))?;
    let arch = meta_string(&f, "general.architecture")?.unwrap_or_default();
    if arch != "llama" {
        return Err(Error::unsupported(format!("GGUF architecture `{arch}` is not supported (only llama)")));
    }
    let need = |key: &str, v: Option<u32>| v.ok_or_else(|| Error::model(format!("GGUF metadata `{arch}.{key}` is missing")));
    let k = |s: &str| format!("{arch}.{s}");
    let heads = need("attention.head_count", meta_u32(&f, &k("attention.head_count"))?)? as i32;
    let kv_heads = meta_u32(&f, &k("attention.head_count_kv"))?.map_or(heads, |v| v as i32);
    let hidden = need("embedding_length", meta_u32(&f, &k("embedding_length"))?)? as i32;
    let layers = need("block_count", meta_u32(&f, &k("block_count"))?)? as i32;
    let ffn = need("feed_forward_length", meta_u32(&f, &k("feed_forward_length"))?)? as i32;
    let head_dim = meta_u32(&f, &k("attention.key_length"))?.map(|v| v as i32);
    let context = meta_u32(&f, &k("context_length"))?.map(i64::from);
    let vocab = meta_u32(&f, &k("vocab_size"))?.map(|v| v as i32);
    // The sizes as config.json would give them, checked before anything
    // (the Q/K unpermute below divides by the head counts) uses them.
    let sizes = [
        ("hidden_size", "embedding_length", Some(hidden)),
        ("num_hidden_layers", "block_count", Some(layers)),
        ("intermediate_size", "feed_forward_length", Some(ffn)),
        ("num_attention_heads", "attention.head_count", Some(heads)),
        ("num_key_value_heads", "attention.head_count_kv", Some(kv_heads)),
        ("head_dim", "attention.key_length", head_dim),
        ("vocab_size", "vocab_size", vocab),
    ];
    let mut as_config: serde_json::Map<String, Value> =
        sizes.iter().filter_map(|(hf, _, v)| Some(((*hf).to_string(), (*v)?.into()))).collect();
    if let Some(c) = context {
        as_config.insert("max_position_embeddings".into(), c.into());
    }
    check::config::check(&Value::Object(as_config)).map_err(|e| {
        let mut m = e.message.replace("config.json", "GGUF metadata").replace("`max_position_embeddings`", &format!("`{arch}.context_length`"));
        for (hf, key, _) in sizes {
            m = m.replace(&format!("`{hf}`"), &format!("`{arch}.{key}`"));
        }
        Error::model(m)
    })?;

    let mut tensors = HashMap::new();
    let mut quant = QuantConfig::default();
    for name in f.names()? {
        let (base, suffix) = name.rsplit_once('.').unwrap_or((&name, ""));
        let Some(module) = hf_module(base) else {
            return Err(Error::model(format!("unexpected GGUF tensor `{name}`")));
        };
        let mut a = f.take(&name)?;
        if module.ends_with("q_proj") {
            a = unpermute_rows(&a, heads)?;
        } else if module.ends_with("k_proj") {
            a = unpermute_rows(&a, kv_heads)?;
        }
        tensors.insert(format!("{module}.{suffix}"), a);
    }
    // MLX's GGUF loader turns Q4_0/Q4_1/Q8_0 into affine groups of 32; the
    // bit width follows from the packed width over the number of groups.
    for (name, s) in tensors.iter().filter(|(n, _)| n.ends_with(".scales")) {
        let module = name.trim_end_matches(".scales");
        let w = tensors
            .get(&format!("{module}.weight"))
            .ok_or_else(|| Error::model(format!("GGUF tensor `{module}` has scales but no weight")))?;
        let bits = w.dim(-1) / s.dim(-1);
        quant.overrides.insert(module.to_string(), QuantSpec { group_size: 32, bits });
    }
    let vocab_size = match vocab {
        Some(v) => v,
        None => tensors.get("model.embed_tokens.weight").map(|a| a.dim(0)).unwrap_or(0),
    };
    let cfg = LlamaConfig {
        hidden_size: hidden,
        num_hidden_layers: layers,
        intermediate_size: ffn,
        num_attention_heads: heads,
        rms_norm_eps: meta_f32(&f, &k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
        vocab_size,
        head_dim,
        max_position_embeddings: context,
        num_key_value_heads: Some(kv_heads),
        attention_bias: false,
        mlp_bias: false,
        rope_theta: meta_f32(&f, &k("rope.freq_base"))?.unwrap_or(10000.0),
        rope_traditional: false,
        rope_scaling: None,
        tie_word_embeddings: Some(!tensors.contains_key("lm_head.weight")),
    };
    let mut weights = Weights::new(tensors, quant, scale_dtype, opts.kernels);
    opts.report(0.3, "building")?;
    let info = ModelInfo { format: "gguf".into(), ..Default::default() };
    let model: Box<dyn LanguageModel> = Box::new(llama::load(&cfg, &mut weights, info)?);
    weights.finish(&arch)?;

    let vocab = GgufVocab::from_tensor_file(&f).map_err(|e| Error::model(e.to_string()))?;
    let tokenizer = Tokenizer::from_gguf(&vocab).map_err(|e| Error::model(e.to_string()))?;
    let name_of = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i));
    let template = vocab
        .chat_template
        .as_deref()
        .map(|s| ChatTemplate::new(s, name_of(vocab.bos_id).as_deref(), name_of(vocab.eos_id).as_deref()))
        .transpose()
        .map_err(|e| Error::model(format!("chat template: {e}")))?;
    let eos_ids = vocab.eos_id.into_iter().collect();
    Ok((model, TextAssets { tokenizer: Arc::new(tokenizer), template, eos_ids, media: None }, Towers::default()))
}

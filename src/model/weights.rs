//! A checkpoint's tensors by name, taken one by one while a model is built, so
//! a missing or misshapen tensor fails the load with its name, and one the
//! model never took fails it too (`Weights::finish`).

use super::layers::{implied_biases, Embedding, Kernels, Linear, QuantSpec};
use super::moe::SwitchLinear;
use crate::error::{Error, Result};
use crate::mlx::{pack_panels, packable, Array, Dtype};
use std::collections::HashMap;

/// Per-checkpoint quantization settings: a default and per-module overrides
/// (keyed by module path, e.g. `model.embed_tokens`), as in MLX configs.
#[derive(Debug, Clone, Default)]
pub struct QuantConfig {
    pub default: Option<QuantSpec>,
    pub overrides: HashMap<String, QuantSpec>,
}

impl QuantConfig {
    fn spec_for(&self, module: &str) -> Option<QuantSpec> {
        self.overrides.get(module).copied().or(self.default)
    }
}

pub struct Weights {
    tensors: HashMap<String, Array>,
    quant: QuantConfig,
    /// Quantization scales/biases of layers MLX's own kernels run are cast
    /// to this dtype at load (f32 on the CPU device, where MLX's kernels take
    /// a much slower path for f16 scales). mlxrt's quantized matmul widens
    /// f16 scales exactly itself, so under `Kernels::Auto`/`Int8` linear
    /// layers and embeddings keep them as stored (GGUF's Q4: 98 MB of
    /// parameters for SmolLM2-135M instead of 115, the same results).
    scale_dtype: Option<Dtype>,
    kernels: Kernels,
    /// Whether quantized linear layers and embeddings drop biases that are
    /// exactly `-2^(bits-1)` times their scales (GGUF's Q4_0 and Q8_0, which
    /// store none): mlxrt's CPU kernel derives them, the same values, so
    /// they cost no memory or bandwidth (SmolLM2-135M Q4_0: 98.3 -> 89.9 MB). Not under
    /// `Kernels::Stock` or on a GPU, where MLX's kernels take stored biases.
    drop_symmetric_biases: bool,
}

impl Weights {
    pub fn new(tensors: HashMap<String, Array>, quant: QuantConfig, scale_dtype: Option<Dtype>, kernels: Kernels) -> Weights {
        let drop_symmetric_biases = kernels != Kernels::Stock && !crate::mlx::device::default_is_gpu();
        Weights { tensors, quant, scale_dtype, kernels, drop_symmetric_biases }
    }

    /// The kernels the model's layers use (other than its quantized
    /// matmuls, which see `Kernels::Int8` as given).
    pub fn kernels(&self) -> Kernels {
        self.kernels.except_qmm()
    }

    /// Renames every tensor (and quantization override) under `prefix` to
    /// its name without it: the text model of a multimodal checkpoint
    /// (`language_model.model.…`) read as a text-only one. Other tensors stay
    /// as they are (and must be `ignorable` by `finish`).
    pub fn strip_prefix(&mut self, prefix: &str) {
        let names: Vec<String> = self.tensors.keys().filter(|k| k.starts_with(prefix)).cloned().collect();
        for n in names {
            let a = self.tensors.remove(&n).expect("listed above");
            self.tensors.insert(n[prefix.len()..].to_string(), a);
        }
        let ov = std::mem::take(&mut self.quant.overrides);
        self.quant.overrides = ov.into_iter().map(|(k, v)| (k.strip_prefix(prefix).map(str::to_owned).unwrap_or(k), v)).collect();
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The shape of a tensor still held, if any.
    pub fn peek_shape(&self, name: &str) -> Option<Vec<i32>> {
        self.tensors.get(name).map(Array::shape)
    }

    pub fn take(&mut self, name: &str) -> Result<Array> {
        self.tensors
            .remove(name)
            .ok_or_else(|| Error::model(format!("checkpoint is missing tensor `{name}`")))
    }

    /// Takes a tensor and checks its shape.
    pub fn take_shaped(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let a = self.take(name)?;
        check_shape(name, &a, shape)?;
        Ok(a)
    }

    fn take_optional(&mut self, name: &str, shape: &[i32]) -> Result<Option<Array>> {
        if self.contains(name) {
            self.take_shaped(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Scales or biases `name`, cast to `scale_dtype` unless `own_kernel`
    /// (a layer mlxrt's quantized matmul runs, which reads them as stored).
    fn take_scales(&mut self, name: &str, shape: &[i32], own_kernel: bool) -> Result<Array> {
        let a = self.take_shaped(name, shape)?;
        match self.scale_dtype {
            Some(dt) if a.dtype() != dt && !(own_kernel && self.kernels != Kernels::Stock) => Ok(a.astype(dt)?),
            _ => Ok(a),
        }
    }

    /// A linear layer `prefix` mapping `in_dim` → `out_dim`, quantized when the
    /// checkpoint has `prefix.scales`.
    pub fn linear(&mut self, prefix: &str, in_dim: i32, out_dim: i32, bias: bool) -> Result<Linear> {
        let b = if bias {
            Some(self.take_shaped(&format!("{prefix}.bias"), &[out_dim])?)
        } else {
            self.take_optional(&format!("{prefix}.bias"), &[out_dim])?
        };
        if !self.contains(&format!("{prefix}.scales")) {
            let w = self.take_shaped(&format!("{prefix}.weight"), &[out_dim, in_dim])?;
            return Ok(Linear::Dense { w, b, kernels: self.kernels });
        }
        let (w, scales, biases, spec) = self.quantized(prefix, in_dim, out_dim)?;
        // Int8 activations on a CPU that runs packed panels: rearranged once
        // here (docs/cpu-kernels.md, "Packed panels").
        if self.kernels == Kernels::Int8 && packable(out_dim, in_dim, spec.group_size, spec.bits) {
            let (w, scales, biases) = pack_panels(&w, &scales, biases.as_ref(), spec.bits)?;
            return Ok(Linear::Quantized { w, scales, biases, b, spec, kernels: self.kernels, packed: true });
        }
        Ok(Linear::Quantized { w, scales, biases, b, spec, kernels: self.kernels, packed: false })
    }

    /// A token embedding table `prefix` of `vocab` rows × `dim`.
    pub fn embedding(&mut self, prefix: &str, vocab: i32, dim: i32) -> Result<Embedding> {
        if !self.contains(&format!("{prefix}.scales")) {
            let w = self.take_shaped(&format!("{prefix}.weight"), &[vocab, dim])?;
            return Ok(Embedding::Dense { w });
        }
        let (w, scales, biases, spec) = self.quantized(prefix, dim, vocab)?;
        // Looked-up rows are dequantized by MLX: in `scale_dtype`, as before.
        let rows = self.scale_dtype.filter(|d| *d != scales.dtype());
        Ok(Embedding::Quantized { w, scales, biases, spec, kernels: self.kernels, rows })
    }

    /// Experts' linear layers stacked `[experts, out_dim, in_dim]` (MoE).
    pub fn switch_linear(&mut self, prefix: &str, experts: i32, in_dim: i32, out_dim: i32) -> Result<SwitchLinear> {
        if !self.contains(&format!("{prefix}.scales")) {
            let w = self.take_shaped(&format!("{prefix}.weight"), &[experts, out_dim, in_dim])?;
            return Ok(SwitchLinear::Dense { w });
        }
        let spec = self.spec(prefix, in_dim)?;
        let w = self.take_shaped(&format!("{prefix}.weight"), &[experts, out_dim, in_dim * spec.bits / 32])?;
        if w.dtype() != Dtype::U32 {
            return Err(Error::model(format!("`{prefix}.weight` is {:?}, expected packed uint32", w.dtype())));
        }
        let groups = in_dim / spec.group_size;
        // MLX's gather_qmm runs these.
        let scales = self.take_scales(&format!("{prefix}.scales"), &[experts, out_dim, groups], false)?;
        let biases = self.take_scales(&format!("{prefix}.biases"), &[experts, out_dim, groups], false)?;
        Ok(SwitchLinear::Quantized { w, scales, biases, spec })
    }

    fn spec(&self, prefix: &str, in_dim: i32) -> Result<QuantSpec> {
        let spec = self.quant.spec_for(prefix).ok_or_else(|| {
            Error::model(format!(
                "`{prefix}` has quantization scales but the config has no quantization settings for it"
            ))
        })?;
        if in_dim % spec.group_size != 0 || (in_dim * spec.bits) % 32 != 0 {
            return Err(Error::model(format!(
                "`{prefix}`: input size {in_dim} does not fit group size {} / {} bits",
                spec.group_size, spec.bits
            )));
        }
        Ok(spec)
    }

    fn quantized(&mut self, prefix: &str, in_dim: i32, out_dim: i32) -> Result<(Array, Array, Option<Array>, QuantSpec)> {
        let spec = self.spec(prefix, in_dim)?;
        let w = self.take_shaped(&format!("{prefix}.weight"), &[out_dim, in_dim * spec.bits / 32])?;
        if w.dtype() != Dtype::U32 {
            return Err(Error::model(format!("`{prefix}.weight` is {:?}, expected packed uint32", w.dtype())));
        }
        let groups = in_dim / spec.group_size;
        let scales = self.take_scales(&format!("{prefix}.scales"), &[out_dim, groups], true)?;
        let biases = self.take_scales(&format!("{prefix}.biases"), &[out_dim, groups], true)?;
        let symmetric = self.drop_symmetric_biases && implied_biases(&scales, spec.bits)?.equal(&biases)?.all()?;
        Ok((w, scales, (!symmetric).then_some(biases), spec))
    }

    /// Drops the tensors of module `prefix` (`.weight`, `.scales`,
    /// `.biases`, `.bias`) that a checkpoint carries but the model does not
    /// use: a tied `lm_head`, keys of KV-shared layers (as mlx-lm drops them).
    pub fn discard(&mut self, prefix: &str) {
        for suffix in ["weight", "scales", "biases", "bias"] {
            self.tensors.remove(&format!("{prefix}.{suffix}"));
        }
    }

    /// Fails naming a tensor under one of `prefixes` that is still held: a
    /// tower that was built must have read all of its tensors.
    pub fn finish_prefixes(&self, prefixes: &[&str]) -> Result<()> {
        let mut left: Vec<&String> = self.tensors.keys().filter(|n| prefixes.iter().any(|p| n.starts_with(p))).collect();
        left.sort();
        match left.first() {
            Some(n) => Err(Error::model(format!("the checkpoint has {} tower tensor(s) the tower does not use, e.g. `{n}`", left.len()))),
            None => Ok(()),
        }
    }

    /// Fails naming the first few tensors (sorted) that the model did not
    /// take and `ignorable` does not cover: loading is strict, as in mlx-lm,
    /// so a checkpoint built for another architecture (a Qwen3 labelled
    /// `llama`, whose q/k norms a Llama would never read) fails instead of
    /// running without some of its weights.
    pub fn finish(self, model_type: &str) -> Result<()> {
        let mut left: Vec<&String> = self.tensors.keys().filter(|n| !ignorable(n)).collect();
        if left.is_empty() {
            return Ok(());
        }
        left.sort();
        const SHOWN: usize = 5;
        let names: Vec<String> = left.iter().take(SHOWN).map(|n| format!("`{n}`")).collect();
        let more = if left.len() > SHOWN { format!(" and {} more", left.len() - SHOWN) } else { String::new() };
        Err(Error::model(format!(
            "the checkpoint has {} tensor(s) a `{model_type}` model does not use: {}{more} (is `model_type` right?)",
            left.len(),
            names.join(", ")
        )))
    }
}

/// Tensors a checkpoint may carry that no text model reads, dropped as
/// mlx-lm's `sanitize` methods drop them:
/// - precomputed rotary frequencies (`…rotary_emb.inv_freq`; recomputed
///   from the config);
/// - the vision and audio towers, their projectors and embedders of a
///   multimodal checkpoint (`vision_tower.`, `multi_modal_projector.`,
///   `audio_tower.`, `embed_vision.`, `embed_audio.`, `vision_embedder.`,
///   `visual.`, with or without a leading `model.`): only the text model is
///   loaded;
/// - multi-token-prediction heads (`mtp.`, Qwen3-Next and Qwen3.5);
/// - Gemma 4's activation clipping bounds (`input_min`, `input_max`,
///   `output_min`, `output_max`).
pub fn ignorable(name: &str) -> bool {
    const TOWERS: &[&str] = &[
        "vision_tower.",
        "multi_modal_projector.",
        "audio_tower.",
        "embed_vision.",
        "embed_audio.",
        "vision_embedder.",
        "visual.",
    ];
    const CLIPS: &[&str] = &["input_min", "input_max", "output_min", "output_max"];
    let unprefixed = name.strip_prefix("model.").unwrap_or(name);
    name.contains("rotary_emb.")
        || TOWERS.iter().any(|t| unprefixed.starts_with(t))
        || name.starts_with("mtp.")
        || name.contains(".mtp.")
        || CLIPS.iter().any(|c| name.ends_with(c))
}

pub fn check_shape(name: &str, a: &Array, want: &[i32]) -> Result<()> {
    let got = a.shape();
    if got != want {
        return Err(Error::model(format!("tensor `{name}` has shape {got:?}, expected {want:?}")));
    }
    Ok(())
}

//! How attention layers store their keys and values: dense (the
//! activations' dtype, f32 on the CPU, or f16) or quantized, and from which
//! position on (`start`, mlx-lm's `quantized_kv_start`).
//!
//! One storage format per engine: rows batched together must share it. The
//! start may differ per request (a row's forward over its positions
//! `[a, a + L)` uses float KV iff `a < start`; see `KvCache`).

use crate::error::{Error, Result};

/// The storage format of the KV cache of full-attention layers
/// (sliding-window layers stay dense, as in mlx-lm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvScheme {
    /// Keys and values as computed.
    Dense,
    /// MLX's affine quantization (`mx.quantize`) of each key and value
    /// vector in groups of `group_size` along the head dimension, as
    /// mlx-lm's `QuantizedKVCache`; attention runs on the packed form.
    Affine { bits: i32, group_size: i32 },
    /// TurboQuant (`cache/turbo.rs`): keys affine-quantized per 32
    /// coordinates, values rotated (seeded sign flip + Hadamard) and
    /// quantized with the Gaussian Lloyd–Max codebook, e.g. k8v3.
    TurboQuant { key_bits: i32, value_bits: i32 },
}

/// The element type of a dense cache of full-attention layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvFloat {
    /// The activations' dtype (f32 on the CPU: logit parity with mlx-lm).
    #[default]
    Compute,
    /// f16 (half the bytes; llama.cpp's default KV type). Attention widens
    /// it to f32 exactly, so only the rounding of each stored key and value
    /// differs from `Compute`.
    F16,
}

/// The KV storage of an engine: the scheme, the default position from
/// which a row's cache is quantized (0 = from the first token; mlx-lm's own
/// default is 5000 and, unlike mlxrt, it keeps its first prefill chunk float
/// even with start 0), and the element type of dense full-attention caches
/// (sliding-window rings keep the activations' dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvQuant {
    pub scheme: KvScheme,
    pub start: i32,
    pub float: KvFloat,
}

impl Default for KvQuant {
    fn default() -> KvQuant {
        KvQuant { scheme: KvScheme::Dense, start: 0, float: KvFloat::Compute }
    }
}

/// The shape of one layer cache's keys and values, and its window (None for
/// a full-attention layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayer {
    pub kv_heads: i32,
    pub k_dim: i32,
    pub v_dim: i32,
    pub window: Option<i32>,
}

/// Bytes of one dense element (f32: the CPU keeps KV in f32 unless
/// `KvFloat::F16`).
const DENSE_ELEM: usize = 4;

impl KvScheme {
    /// Whether keys and values are stored packed.
    pub fn is_quantized(&self) -> bool {
        !matches!(self, KvScheme::Dense)
    }

    /// A short name: `none`, `affine:b4:g64`, `turboquant:k8v3`.
    pub fn name(&self) -> String {
        match self {
            KvScheme::Dense => "none".into(),
            KvScheme::Affine { bits, group_size } => format!("affine:b{bits}:g{group_size}"),
            KvScheme::TurboQuant { key_bits, value_bits } => format!("turboquant:k{key_bits}v{value_bits}"),
        }
    }

    /// What packed planes made with this scheme depend on (the prompt
    /// cache's compatibility key): the name, and for TurboQuant the seed of
    /// the value rotation's sign table.
    pub fn stored_form(&self) -> String {
        match self {
            KvScheme::TurboQuant { .. } => format!("{};signs={}", self.name(), super::turbo::SIGN_SEED),
            _ => self.name(),
        }
    }

    /// Checks the scheme's parameters and that every layer it applies to
    /// (full-attention layers) can be stored with it.
    pub fn validate(&self, layers: &[Option<KvLayer>]) -> Result<()> {
        match *self {
            KvScheme::Dense => Ok(()),
            KvScheme::Affine { bits, group_size } => {
                if ![2, 3, 4, 5, 6, 8].contains(&bits) {
                    return Err(Error::invalid(format!("kv_bits must be 2, 3, 4, 5, 6 or 8, got {bits}")));
                }
                if ![32, 64, 128].contains(&group_size) {
                    return Err(Error::invalid(format!("kv_group_size must be 32, 64 or 128, got {group_size}")));
                }
                for (i, l) in layers.iter().enumerate() {
                    let Some(l) = l.filter(|l| l.window.is_none()) else { continue };
                    for (what, d) in [("key", l.k_dim), ("value", l.v_dim)] {
                        if d % group_size != 0 {
                            return Err(Error::invalid(format!(
                                "cannot quantize the KV cache of layer {i} in groups of {group_size}: its {what} head \
                                 dimension is {d} (kv_group_size must divide it; MLX allows 32, 64, 128)"
                            )));
                        }
                    }
                }
                Ok(())
            }
            KvScheme::TurboQuant { key_bits, value_bits } => {
                super::turbo::check(key_bits, value_bits, 64, 64)?;
                for (i, l) in layers.iter().enumerate() {
                    let Some(l) = l.filter(|l| l.window.is_none()) else { continue };
                    super::turbo::check(key_bits, value_bits, l.k_dim, l.v_dim)
                        .map_err(|e| e.context(format_args!("cannot store the KV cache of layer {i}")))?;
                }
                Ok(())
            }
        }
    }

    /// Bytes one layer's cache takes for `positions` positions of one row,
    /// stored with this scheme (sliding-window layers: a dense ring of at
    /// most one window), plus the float copy kept for the first `start`
    /// positions until the row converts.
    pub fn bytes(&self, layer: &KvLayer, positions: usize, start: i32) -> usize {
        let (h, dk, dv) = (layer.kv_heads as usize, layer.k_dim as usize, layer.v_dim as usize);
        let dense = |p: usize| p * h * (dk + dv) * DENSE_ELEM;
        if let Some(w) = layer.window {
            return dense(positions.min(w.max(0) as usize));
        }
        let float_tail = dense(positions.min(start.max(0) as usize));
        match *self {
            KvScheme::Dense => dense(positions),
            KvScheme::Affine { bits, group_size } => {
                let (b, g) = (bits as usize, group_size as usize);
                // Packed words, then an f32 scale and bias per group.
                let per = |d: usize| d * b / 8 + 2 * DENSE_ELEM * d / g;
                positions * h * (per(dk) + per(dv)) + float_tail
            }
            KvScheme::TurboQuant { key_bits, value_bits } => {
                // f16 scale and zero per 32 keys, f16 scale per 32 values.
                let per = super::turbo::bytes_per_position(key_bits, value_bits, layer.k_dim, layer.v_dim);
                positions * h * per + float_tail
            }
        }
    }
}

impl KvQuant {
    pub fn validate(&self, layers: &[Option<KvLayer>]) -> Result<()> {
        if self.start < 0 {
            return Err(Error::invalid(format!("quantized_kv_start must be >= 0, got {}", self.start)));
        }
        if self.float == KvFloat::F16 && self.scheme.is_quantized() {
            return Err(Error::invalid("an f16 KV cache is dense: it cannot be combined with a quantized kv_scheme"));
        }
        self.scheme.validate(layers)
    }

    /// A short name of the storage: the scheme's, or `f16`.
    pub fn name(&self) -> String {
        match self.float {
            KvFloat::F16 => "f16".into(),
            KvFloat::Compute => self.scheme.name(),
        }
    }

    /// `KvScheme::bytes`, with an f16 dense cache at 2 bytes an element
    /// (sliding-window rings stay in the activations' dtype).
    pub fn bytes(&self, layer: &KvLayer, positions: usize, start: i32) -> usize {
        let b = self.scheme.bytes(layer, positions, start);
        match self.float {
            KvFloat::F16 if layer.window.is_none() => b / 2,
            _ => b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: KvLayer = KvLayer { kv_heads: 3, k_dim: 64, v_dim: 64, window: None };

    #[test]
    fn affine_bytes_are_the_packed_cost() {
        let dense = KvScheme::Dense.bytes(&L, 1000, 0);
        assert_eq!(dense, 1000 * 3 * 128 * 4);
        let a4 = KvScheme::Affine { bits: 4, group_size: 64 }.bytes(&L, 1000, 0);
        let a8 = KvScheme::Affine { bits: 8, group_size: 64 }.bytes(&L, 1000, 0);
        // bits/32 + 2/g of f32: 0.15625 and 0.28125 (0.3125, 0.5625 of f16).
        assert_eq!(a4 * 64, dense * 10);
        assert_eq!(a8 * 64, dense * 18);
        // The float copy of the positions before start counts too.
        let late = KvScheme::Affine { bits: 4, group_size: 64 }.bytes(&L, 1000, 100);
        assert_eq!(late, a4 + dense / 10);
        let sliding = KvLayer { window: Some(16), ..L };
        // Sliding layers are dense rings of one window.
        assert_eq!(KvScheme::Affine { bits: 4, group_size: 64 }.bytes(&sliding, 1000, 0), dense / 1000 * 16);
        assert_eq!(KvScheme::Dense.bytes(&sliding, 10, 0), dense / 100);
    }

    #[test]
    fn turboquant_bytes_are_the_packed_cost() {
        let tq = KvScheme::TurboQuant { key_bits: 8, value_bits: 3 }.bytes(&L, 1000, 0);
        // Per head and position: 64 + 8 key bytes, 24 + 4 value bytes = 100
        // against 256 of f16 (0.39) and 512 of f32.
        assert_eq!(tq, 1000 * 3 * 100);
        assert_eq!(KvScheme::TurboQuant { key_bits: 8, value_bits: 3 }.bytes(&L, 1000, 10), tq + 10 * 3 * 128 * 4);
    }

    #[test]
    fn stored_form_names_what_the_planes_depend_on() {
        assert_eq!(KvScheme::Affine { bits: 4, group_size: 64 }.stored_form(), "affine:b4:g64");
        // The sign table of TurboQuant's value rotation shapes its packed values.
        assert_eq!(KvScheme::TurboQuant { key_bits: 8, value_bits: 3 }.stored_form(), "turboquant:k8v3;signs=42");
    }

    #[test]
    fn validation_names_the_layer() {
        let a = KvScheme::Affine { bits: 4, group_size: 64 };
        assert!(a.validate(&[Some(L), None]).is_ok());
        let small = KvLayer { k_dim: 32, v_dim: 32, ..L };
        let e = a.validate(&[Some(L), Some(small)]).unwrap_err();
        assert!(e.to_string().contains("layer 1") && e.to_string().contains("32"), "{e}");
        assert!(KvScheme::Affine { bits: 4, group_size: 32 }.validate(&[Some(small)]).is_ok());
        // Sliding layers stay dense, so their shape does not matter.
        assert!(a.validate(&[Some(KvLayer { window: Some(8), ..small })]).is_ok());
        assert!(KvScheme::Affine { bits: 7, group_size: 64 }.validate(&[]).is_err());
        assert!(KvScheme::Affine { bits: 4, group_size: 16 }.validate(&[]).is_err());
        let k8v3 = KvScheme::TurboQuant { key_bits: 8, value_bits: 3 };
        assert!(k8v3.validate(&[Some(L), Some(KvLayer { k_dim: 96, v_dim: 96, ..L })]).is_ok());
        let e = k8v3.validate(&[Some(L), Some(KvLayer { k_dim: 80, v_dim: 80, ..L })]).unwrap_err();
        assert!(e.to_string().contains("layer 1") && e.to_string().contains("80"), "{e}");
        assert!(KvScheme::TurboQuant { key_bits: 8, value_bits: 5 }.validate(&[]).is_err());
        assert!(KvQuant { start: -1, ..KvQuant::default() }.validate(&[]).is_err());
        let f16 = KvQuant { float: KvFloat::F16, ..KvQuant::default() };
        assert!(f16.validate(&[Some(L)]).is_ok());
        assert!(KvQuant { scheme: a, ..f16 }.validate(&[Some(L)]).is_err());
        // Half the bytes of f32 for full-attention layers; rings as computed.
        assert_eq!(f16.bytes(&L, 1000, 0) * 2, KvScheme::Dense.bytes(&L, 1000, 0));
        let ring = KvLayer { window: Some(16), ..L };
        assert_eq!(f16.bytes(&ring, 1000, 0), KvScheme::Dense.bytes(&ring, 1000, 0));
        assert_eq!((f16.name(), KvQuant::default().name()), ("f16".to_string(), "none".to_string()));
    }
}

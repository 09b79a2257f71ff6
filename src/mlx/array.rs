//! The safe `Array` handle. It owns one `mlx::core::array` (itself a cheap,
//! reference-counted handle to a lazily evaluated node). `Array` is neither
//! `Send` nor `Sync`: the opaque C++ type is not, so arrays can never leave the
//! thread that made them, which is what MLX's per-thread streams require.

use super::sys::ffi;
use cxx::UniquePtr;
use std::fmt;

/// An error raised by MLX (its exception message) or by the binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlxError(pub String);

impl fmt::Display for MlxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MLX: {}", self.0)
    }
}

impl std::error::Error for MlxError {}

impl From<cxx::Exception> for MlxError {
    fn from(e: cxx::Exception) -> Self {
        MlxError(e.what().to_string())
    }
}

pub type Result<T> = std::result::Result<T, MlxError>;

/// Element types. The numeric codes are shared with `to_dtype` in shim.cc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Dtype {
    Bool = 0,
    U8 = 1,
    U16 = 2,
    U32 = 3,
    U64 = 4,
    I8 = 5,
    I16 = 6,
    I32 = 7,
    I64 = 8,
    F16 = 9,
    F32 = 10,
    F64 = 11,
    BF16 = 12,
    C64 = 13,
}

impl Dtype {
    pub fn from_code(c: u8) -> Option<Dtype> {
        use Dtype::*;
        Some(match c {
            0 => Bool,
            1 => U8,
            2 => U16,
            3 => U32,
            4 => U64,
            5 => I8,
            6 => I16,
            7 => I32,
            8 => I64,
            9 => F16,
            10 => F32,
            11 => F64,
            12 => BF16,
            13 => C64,
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::F32 | Dtype::F64 | Dtype::BF16)
    }

    /// The name used in safetensors headers and MLX's Python API.
    pub fn name(self) -> &'static str {
        use Dtype::*;
        match self {
            Bool => "bool",
            U8 => "uint8",
            U16 => "uint16",
            U32 => "uint32",
            U64 => "uint64",
            I8 => "int8",
            I16 => "int16",
            I32 => "int32",
            I64 => "int64",
            F16 => "float16",
            F32 => "float32",
            F64 => "float64",
            BF16 => "bfloat16",
            C64 => "complex64",
        }
    }
}

pub struct Array(pub(crate) UniquePtr<ffi::array>);

pub(crate) fn wrap(r: std::result::Result<UniquePtr<ffi::array>, cxx::Exception>) -> Result<Array> {
    let p = r?;
    if p.is_null() {
        return Err(MlxError("MLX returned a null array".into()));
    }
    Ok(Array(p))
}

impl Array {
    pub(crate) fn raw(&self) -> &ffi::array {
        self.0.as_ref().expect("Array is never null")
    }

    pub fn from_f32(data: &[f32], shape: &[i32]) -> Result<Array> {
        wrap(ffi::from_f32(data, shape))
    }
    pub fn from_i32(data: &[i32], shape: &[i32]) -> Result<Array> {
        wrap(ffi::from_i32(data, shape))
    }
    pub fn from_u32(data: &[u32], shape: &[i32]) -> Result<Array> {
        wrap(ffi::from_u32(data, shape))
    }
    /// Builds an array from raw little-endian bytes of `dtype`.
    pub fn from_bytes(data: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        wrap(ffi::from_bytes(data, shape, dtype as u8))
    }
    pub fn scalar_f32(v: f32) -> Result<Array> {
        wrap(ffi::scalar_f32(v))
    }
    pub fn scalar_i32(v: i32) -> Result<Array> {
        wrap(ffi::scalar_i32(v))
    }
    pub fn arange(start: i32, stop: i32) -> Result<Array> {
        wrap(ffi::arange_i32(start, stop))
    }
    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
        wrap(ffi::zeros(shape, dtype as u8))
    }
    /// An evaluated array whose contents are undefined until written (e.g.
    /// by `slice_update`, which writes in place into a buffer only it holds).
    /// For capacity reserved ahead: on CPU, pages not yet written take no
    /// resident memory. Never read what was not written.
    pub fn uninit(shape: &[i32], dtype: Dtype) -> Result<Array> {
        wrap(ffi::uninit(shape, dtype as u8))
    }

    /// Another handle to the same node (no data copy).
    pub fn share(&self) -> Array {
        wrap(ffi::clone_arr(self.raw())).expect("copying an array handle cannot fail")
    }

    pub fn shape(&self) -> Vec<i32> {
        ffi::shape_of(self.raw()).expect("reading a shape cannot fail")
    }
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }
    pub fn dim(&self, axis: i32) -> i32 {
        let s = self.shape();
        let i = if axis < 0 { s.len() as i32 + axis } else { axis };
        s[i as usize]
    }
    pub fn size(&self) -> usize {
        self.shape().iter().map(|&d| d as usize).product()
    }
    pub fn dtype(&self) -> Dtype {
        Dtype::from_code(ffi::dtype_of(self.raw()).expect("reading a dtype cannot fail"))
            .expect("MLX returned an unknown dtype")
    }
    pub fn nbytes(&self) -> usize {
        ffi::nbytes_of(self.raw()).expect("reading a size cannot fail")
    }

    /// Evaluates and copies out as f32 (any dtype is converted).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        Ok(ffi::to_vec_f32(self.raw())?)
    }
    /// Evaluates and copies out as i32 (any dtype is converted).
    pub fn to_vec_i32(&self) -> Result<Vec<i32>> {
        Ok(ffi::to_vec_i32(self.raw())?)
    }
    /// Evaluates and copies out the raw bytes in row-major order.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        Ok(ffi::to_bytes(self.raw())?)
    }
    pub fn item_f32(&self) -> Result<f32> {
        self.to_vec_f32()?
            .first()
            .copied()
            .ok_or_else(|| MlxError("item() of an empty array".into()))
    }
    pub fn item_i32(&self) -> Result<i32> {
        self.to_vec_i32()?
            .first()
            .copied()
            .ok_or_else(|| MlxError("item() of an empty array".into()))
    }

    pub fn eval(&self) -> Result<()> {
        Ok(ffi::eval_one(self.raw())?)
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array({:?}, {:?})", self.shape(), self.dtype())
    }
}

/// A list of arrays passed to or returned from MLX in one call.
pub(crate) struct ArrVec(pub(crate) UniquePtr<ffi::ArrVec>);

impl ArrVec {
    pub(crate) fn from_refs(arrays: &[&Array]) -> Result<ArrVec> {
        let mut v = ffi::vec_new()?;
        for a in arrays {
            ffi::vec_push(v.pin_mut(), a.raw())?;
        }
        Ok(ArrVec(v))
    }
    pub(crate) fn into_arrays(self) -> Result<Vec<Array>> {
        let n = ffi::vec_len(&self.0)?;
        (0..n).map(|i| wrap(ffi::vec_get(&self.0, i))).collect()
    }
}

/// Evaluates all arrays in one graph execution.
pub fn eval(arrays: &[&Array]) -> Result<()> {
    Ok(ffi::eval_vec(&ArrVec::from_refs(arrays)?.0)?)
}

/// Schedules evaluation and returns at once; reading any of them later waits.
pub fn async_eval(arrays: &[&Array]) -> Result<()> {
    Ok(ffi::async_eval_vec(&ArrVec::from_refs(arrays)?.0)?)
}

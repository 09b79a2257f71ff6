//! Weight files: safetensors and GGUF through MLX's own loaders.

use super::array::{wrap, Array, Result};
use super::sys::ffi;
use cxx::UniquePtr;

/// Tensors and metadata of one file, held on the C++ side until taken.
pub struct TensorFile(UniquePtr<ffi::TensorFile>);

/// One GGUF metadata value.
pub enum Meta {
    Str(String),
    List(Vec<String>),
    Arr(Array),
}

impl TensorFile {
    pub fn load_safetensors(path: &str) -> Result<TensorFile> {
        Ok(TensorFile(ffi::load_safetensors(path)?))
    }
    pub fn load_gguf(path: &str) -> Result<TensorFile> {
        Ok(TensorFile(ffi::load_gguf(path)?))
    }
    pub fn new() -> Result<TensorFile> {
        Ok(TensorFile(ffi::tensor_file_new()?))
    }
    pub fn insert(&mut self, name: &str, a: &Array) -> Result<()> {
        Ok(ffi::tensor_file_insert(self.0.pin_mut(), name, a.raw())?)
    }
    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<()> {
        Ok(ffi::tensor_file_set_meta(self.0.pin_mut(), key, value)?)
    }
    pub fn save_safetensors(&self, path: &str) -> Result<()> {
        Ok(ffi::save_safetensors(path, &self.0)?)
    }
    pub fn names(&self) -> Result<Vec<String>> {
        Ok(ffi::tensor_names(&self.0)?)
    }
    /// Moves a tensor out of the file (an error names it when absent).
    pub fn take(&mut self, name: &str) -> Result<Array> {
        wrap(ffi::tensor_take(self.0.pin_mut(), name))
    }
    pub fn meta_keys(&self) -> Result<Vec<String>> {
        Ok(ffi::meta_keys(&self.0)?)
    }
    pub fn meta(&self, key: &str) -> Result<Option<Meta>> {
        Ok(match ffi::meta_kind(&self.0, key)? {
            1 => Some(Meta::Str(ffi::meta_str(&self.0, key)?)),
            2 => Some(Meta::List(ffi::meta_list(&self.0, key)?)),
            3 => Some(Meta::Arr(wrap(ffi::meta_arr(&self.0, key))?)),
            _ => None,
        })
    }
}

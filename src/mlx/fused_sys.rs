//! The cxx bridge to `fused.h` (the CPU RMSNorm and RoPE primitives). Raw
//! declarations only; the safe API is in `fused.rs`.

#[cxx::bridge(namespace = "mlxrt::fused")]
pub(crate) mod ffi {
    unsafe extern "C++" {
        include!("mlxrt/src/mlx/fused.h");

        #[namespace = "mlx::core"]
        type array = crate::mlx::sys::ffi::array;
        #[namespace = "mlxrt"]
        type ArrVec = crate::mlx::sys::ffi::ArrVec;

        fn fused_rms_norm(x: &array, w: &array, eps: f32) -> Result<UniquePtr<array>>;
        fn fused_add_rms_norm(x: &array, y: &array, w: &array, eps: f32) -> Result<UniquePtr<ArrVec>>;
        fn fused_rope(
            x: &array,
            dims: i32,
            traditional: bool,
            scale: f32,
            offset: i32,
            inv_freqs: &array,
        ) -> Result<UniquePtr<array>>;
        fn fused_rope_at(
            x: &array,
            dims: i32,
            traditional: bool,
            scale: f32,
            offsets: &array,
            inv_freqs: &array,
        ) -> Result<UniquePtr<array>>;
        /// # Safety
        /// `offsets`, `q_norm` and `k_norm` are null or point to live arrays.
        unsafe fn fused_heads(
            x: &array,
            cols: &[i32],
            heads: &[i32],
            rotate: &[u8],
            dtypes: &[u8],
            head_dim: i32,
            dims: i32,
            traditional: bool,
            scale: f32,
            offset: i32,
            offsets: *const array,
            inv_freqs: &array,
            q_norm: *const array,
            k_norm: *const array,
            eps: f32,
        ) -> Result<UniquePtr<ArrVec>>;
        fn rope_inv_freqs(dims: i32, base: f32) -> Result<UniquePtr<array>>;
        fn rope_inv_freqs_of(freqs: &array) -> Result<UniquePtr<array>>;
        fn is_fused_node(a: &array) -> bool;
    }
}

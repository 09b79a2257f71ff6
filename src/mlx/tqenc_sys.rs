//! The cxx bridge to `tqenc.h` (the CPU TurboQuant encoder and inverse
//! rotation). Raw declarations only; the safe API is in `tqenc.rs`.

#[cxx::bridge(namespace = "mlxrt::tqenc")]
pub(crate) mod ffi {
    unsafe extern "C++" {
        include!("mlxrt/src/mlx/tqenc.h");

        #[namespace = "mlx::core"]
        type array = crate::mlx::sys::ffi::array;
        #[namespace = "mlxrt"]
        type ArrVec = crate::mlx::sys::ffi::ArrVec;

        fn turbo_encode(
            k: &array,
            v: &array,
            key_bits: i32,
            value_bits: i32,
            norm: f32,
            signs: &[f32],
            boundaries: &[f32],
        ) -> Result<UniquePtr<ArrVec>>;
        fn turbo_unrotate(y: &array, norm: f32, signs: &[f32]) -> Result<UniquePtr<array>>;
        fn is_tqenc_node(a: &array) -> bool;
    }
}

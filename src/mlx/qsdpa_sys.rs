//! The cxx bridge to `qsdpa.h` (attention over an affine-quantized KV cache
//! on the CPU). Raw declarations only; the safe API is in `qsdpa.rs`.

#[cxx::bridge(namespace = "mlxrt::qsdpa")]
pub(crate) mod ffi {
    unsafe extern "C++" {
        include!("mlxrt/src/mlx/qsdpa.h");

        #[namespace = "mlx::core"]
        type array = crate::mlx::sys::ffi::array;

        #[allow(clippy::too_many_arguments)]
        fn quantized_sdpa(
            q: &array,
            kw: &array,
            ks: &array,
            kb: &array,
            vw: &array,
            vs: &array,
            vb: &array,
            scale: f32,
            mask_kind: u8,
            mask: &array,
            group_size: i32,
            bits: i32,
            isa: u8,
        ) -> Result<UniquePtr<array>>;
        fn qsdpa_node_isa(a: &array) -> u8;
    }
}

//! The cxx bridge to `tqsdpa.h` (attention over a TurboQuant KV cache on the
//! CPU). Raw declarations only; the safe API is in `tqsdpa.rs`.

#[cxx::bridge(namespace = "mlxrt::tqsdpa")]
pub(crate) mod ffi {
    unsafe extern "C++" {
        include!("mlxrt/src/mlx/tqsdpa.h");

        #[namespace = "mlx::core"]
        type array = crate::mlx::sys::ffi::array;

        #[allow(clippy::too_many_arguments)]
        fn turbo_sdpa(
            q: &array,
            ki: &array,
            ks: &array,
            kz: &array,
            vi: &array,
            vs: &array,
            book: &[f32],
            key_bits: i32,
            value_bits: i32,
            scale: f32,
            mask_kind: u8,
            mask: &array,
            isa: u8,
        ) -> Result<UniquePtr<array>>;
        fn tqsdpa_node_isa(a: &array) -> u8;
    }
}

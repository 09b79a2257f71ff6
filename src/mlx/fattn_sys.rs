//! The cxx bridge to `fattn.h` (float attention on the CPU). Raw
//! declarations only; the safe API is in `fattn.rs`.

#[cxx::bridge(namespace = "mlxrt::fattn")]
pub(crate) mod ffi {
    unsafe extern "C++" {
        include!("mlxrt/src/mlx/fattn.h");

        #[namespace = "mlx::core"]
        type array = crate::mlx::sys::ffi::array;

        #[allow(clippy::too_many_arguments)]
        fn float_sdpa(
            q: &array,
            k: &array,
            v: &array,
            scale: f32,
            mask_kind: u8,
            mask: &array,
            window: i32,
            isa: u8,
            merged: bool,
        ) -> Result<UniquePtr<array>>;
        fn fattn_node_isa(a: &array) -> u8;
    }
}

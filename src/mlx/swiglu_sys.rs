//! The cxx bridge to `swiglu.h` (the CPU SwiGLU primitive). Raw
//! declarations only; the safe API is in `swiglu.rs`.

#[cxx::bridge(namespace = "mlxrt::swiglu")]
pub(crate) mod ffi {
    unsafe extern "C++" {
        include!("mlxrt/src/mlx/swiglu.h");

        #[namespace = "mlx::core"]
        type array = crate::mlx::sys::ffi::array;

        fn fast_swiglu(gate: &array, up: &array, isa: u8) -> Result<UniquePtr<array>>;
        fn fast_swiglu_packed(gu: &array, isa: u8) -> Result<UniquePtr<array>>;
        fn swiglu_node_isa(a: &array) -> u8;
    }
}

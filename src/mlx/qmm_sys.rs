//! The cxx bridge to `qmm.h` (the CPU quantized-matmul primitive and CPU
//! backend queries). Raw declarations only; the safe API is in `qmm.rs`.

#[cxx::bridge(namespace = "mlxrt::qmm")]
pub(crate) mod ffi {
    unsafe extern "C++" {
        include!("mlxrt/src/mlx/qmm.h");

        #[namespace = "mlx::core"]
        type array = crate::mlx::sys::ffi::array;

        fn fast_quantized_matmul(
            x: &array,
            w: &array,
            scales: &array,
            biases: &array,
            group_size: i32,
            bits: i32,
            isa: u8,
            int8_x: bool,
        ) -> Result<UniquePtr<array>>;
        fn fast_quantized_matmul_symmetric(
            x: &array,
            w: &array,
            scales: &array,
            group_size: i32,
            bits: i32,
            isa: u8,
            int8_x: bool,
        ) -> Result<UniquePtr<array>>;
        fn fast_quantized_matmul_packed(
            x: &array,
            w: &array,
            scales: &array,
            biases: &array,
            group_size: i32,
        ) -> Result<UniquePtr<array>>;
        fn fast_quantized_matmul_packed_symmetric(
            x: &array,
            w: &array,
            scales: &array,
            group_size: i32,
        ) -> Result<UniquePtr<array>>;
        fn packed_weights_usable(bits: i32) -> bool;
        fn best_isa() -> u8;
        fn isa_available(isa: u8) -> bool;
        fn int8_gemm_available() -> bool;
        fn fast_node_isa(a: &array) -> u8;
        fn pool_threads() -> usize;
        fn blas_library() -> String;
        fn blas_threads() -> i32;
    }
}

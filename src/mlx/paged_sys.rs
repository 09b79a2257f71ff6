//! The cxx bridge to `paged.h` (paged KV attention and writes on the CPU).
//! Raw declarations only; the safe API is in `paged.rs`.

#[cxx::bridge(namespace = "mlxrt::paged")]
pub(crate) mod ffi {
    unsafe extern "C++" {
        include!("mlxrt/src/mlx/paged.h");

        #[namespace = "mlx::core"]
        type array = crate::mlx::sys::ffi::array;

        #[allow(clippy::too_many_arguments)]
        fn paged_float_sdpa(
            q: &array,
            k_pool: &array,
            v_pool: &array,
            table: &array,
            lens: &array,
            scale: f32,
            causal: bool,
            window: i32,
            isa: u8,
        ) -> Result<UniquePtr<array>>;
        #[allow(clippy::too_many_arguments)]
        fn paged_quantized_sdpa(
            q: &array,
            kw: &array,
            ks: &array,
            kb: &array,
            vw: &array,
            vs: &array,
            vb: &array,
            table: &array,
            lens: &array,
            scale: f32,
            causal: bool,
            window: i32,
            group: i32,
            bits: i32,
            isa: u8,
        ) -> Result<UniquePtr<array>>;
        fn paged_q_node_isa(a: &array) -> u8;
        #[allow(clippy::too_many_arguments)]
        fn paged_turbo_sdpa(
            q: &array,
            ki: &array,
            ks: &array,
            kz: &array,
            vi: &array,
            vs: &array,
            table: &array,
            lens: &array,
            book: &[f32],
            key_bits: i32,
            value_bits: i32,
            scale: f32,
            causal: bool,
            window: i32,
            isa: u8,
        ) -> Result<UniquePtr<array>>;
        fn paged_t_node_isa(a: &array) -> u8;
        fn paged_write(pool: &array, rows: &array, dest: &array, stock: bool) -> Result<UniquePtr<array>>;
        fn paged_data_address(a: &array) -> Result<u64>;
        fn paged_node_isa(a: &array) -> u8;
    }
}

//! The cxx bridge to `shim.h`. Raw declarations only; the safe API is in the
//! sibling modules.

#[cxx::bridge(namespace = "mlxrt")]
pub(crate) mod ffi {
    unsafe extern "C++" {
        include!("mlxrt/src/mlx/shim.h");

        #[namespace = "mlx::core"]
        type array;
        type ArrVec;
        type TensorFile;

        fn from_f32(data: &[f32], shape: &[i32]) -> Result<UniquePtr<array>>;
        fn from_i32(data: &[i32], shape: &[i32]) -> Result<UniquePtr<array>>;
        fn from_u32(data: &[u32], shape: &[i32]) -> Result<UniquePtr<array>>;
        fn from_bytes(data: &[u8], shape: &[i32], dtype: u8) -> Result<UniquePtr<array>>;
        fn scalar_f32(v: f32) -> Result<UniquePtr<array>>;
        fn scalar_i32(v: i32) -> Result<UniquePtr<array>>;
        fn arange_i32(start: i32, stop: i32) -> Result<UniquePtr<array>>;
        fn zeros(shape: &[i32], dtype: u8) -> Result<UniquePtr<array>>;
        fn uninit(shape: &[i32], dtype: u8) -> Result<UniquePtr<array>>;
        fn clone_arr(a: &array) -> Result<UniquePtr<array>>;
        fn shape_of(a: &array) -> Result<Vec<i32>>;
        fn dtype_of(a: &array) -> Result<u8>;
        fn nbytes_of(a: &array) -> Result<usize>;
        fn to_vec_f32(a: &array) -> Result<Vec<f32>>;
        fn to_vec_i32(a: &array) -> Result<Vec<i32>>;
        fn to_bytes(a: &array) -> Result<Vec<u8>>;

        fn vec_new() -> Result<UniquePtr<ArrVec>>;
        fn vec_push(v: Pin<&mut ArrVec>, a: &array) -> Result<()>;
        fn vec_len(v: &ArrVec) -> Result<usize>;
        fn vec_get(v: &ArrVec, i: usize) -> Result<UniquePtr<array>>;
        fn eval_vec(v: &ArrVec) -> Result<()>;
        fn async_eval_vec(v: &ArrVec) -> Result<()>;
        fn eval_one(a: &array) -> Result<()>;

        fn add(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn subtract(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn multiply(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn divide(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn maximum(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn minimum(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn power(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn greater(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn greater_equal(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn less(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn equal(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn logical_and(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn logical_or(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn logaddexp(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn floor_divide(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn where_(c: &array, a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn unary(a: &array, name: &str) -> Result<UniquePtr<array>>;
        fn bitwise_and(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn bitwise_or(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn left_shift(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn right_shift(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn hadamard_transform(a: &array, scale: f32) -> Result<UniquePtr<array>>;

        fn reshape(a: &array, shape: &[i32]) -> Result<UniquePtr<array>>;
        fn transpose(a: &array, axes: &[i32]) -> Result<UniquePtr<array>>;
        fn swapaxes(a: &array, a1: i32, a2: i32) -> Result<UniquePtr<array>>;
        fn expand_dims(a: &array, axis: i32) -> Result<UniquePtr<array>>;
        fn squeeze(a: &array, axis: i32) -> Result<UniquePtr<array>>;
        fn broadcast_to(a: &array, shape: &[i32]) -> Result<UniquePtr<array>>;
        fn astype(a: &array, dtype: u8) -> Result<UniquePtr<array>>;
        fn contiguous(a: &array) -> Result<UniquePtr<array>>;
        fn slice(a: &array, start: &[i32], stop: &[i32], strides: &[i32])
            -> Result<UniquePtr<array>>;
        fn slice_update(src: &array, upd: &array, start: &[i32], stop: &[i32])
            -> Result<UniquePtr<array>>;
        fn concatenate(v: &ArrVec, axis: i32) -> Result<UniquePtr<array>>;
        fn take(a: &array, idx: &array, axis: i32) -> Result<UniquePtr<array>>;
        fn take_along_axis(a: &array, idx: &array, axis: i32) -> Result<UniquePtr<array>>;
        fn put_along_axis(a: &array, idx: &array, vals: &array, axis: i32)
            -> Result<UniquePtr<array>>;

        fn reduce(a: &array, op: &str, axis: i32, keepdims: bool) -> Result<UniquePtr<array>>;
        fn argmax(a: &array, axis: i32, keepdims: bool) -> Result<UniquePtr<array>>;
        fn argpartition(a: &array, kth: i32, axis: i32) -> Result<UniquePtr<array>>;
        fn argsort(a: &array, axis: i32) -> Result<UniquePtr<array>>;
        fn sort(a: &array, axis: i32) -> Result<UniquePtr<array>>;
        fn cumsum(a: &array, axis: i32, reverse: bool, inclusive: bool)
            -> Result<UniquePtr<array>>;
        fn softmax(a: &array, axis: i32, precise: bool) -> Result<UniquePtr<array>>;

        fn matmul(a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn addmm(c: &array, a: &array, b: &array) -> Result<UniquePtr<array>>;
        fn quantized_matmul(
            x: &array,
            w: &array,
            scales: &array,
            biases: &array,
            transpose: bool,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<array>>;
        fn dequantize(w: &array, scales: &array, biases: &array, group_size: i32, bits: i32)
            -> Result<UniquePtr<array>>;
        fn quantize(w: &array, group_size: i32, bits: i32) -> Result<UniquePtr<ArrVec>>;
        fn rms_norm(x: &array, w: &array, eps: f32) -> Result<UniquePtr<array>>;
        fn rms_norm_plain(x: &array, eps: f32) -> Result<UniquePtr<array>>;
        fn gather_qmm(
            x: &array,
            w: &array,
            scales: &array,
            biases: &array,
            rhs_indices: &array,
            transpose: bool,
            group_size: i32,
            bits: i32,
            sorted_indices: bool,
        ) -> Result<UniquePtr<array>>;
        fn gather_mm(a: &array, b: &array, rhs_indices: &array, sorted_indices: bool)
            -> Result<UniquePtr<array>>;
        fn conv1d(x: &array, w: &array, stride: i32, padding: i32, dilation: i32, groups: i32)
            -> Result<UniquePtr<array>>;
        fn conv2d(x: &array, w: &array, stride_h: i32, stride_w: i32, pad_h: i32, pad_w: i32)
            -> Result<UniquePtr<array>>;
        fn gated_delta_update(
            q: &array,
            k: &array,
            v: &array,
            g: &array,
            beta: &array,
            state: &array,
        ) -> Result<UniquePtr<ArrVec>>;
        fn gated_delta_update_masked(
            q: &array,
            k: &array,
            v: &array,
            g: &array,
            beta: &array,
            state: &array,
            mask: &array,
        ) -> Result<UniquePtr<ArrVec>>;
        fn rope(x: &array, dims: i32, traditional: bool, base: f32, scale: f32, offset: i32)
            -> Result<UniquePtr<array>>;
        fn rope_freqs(
            x: &array,
            dims: i32,
            traditional: bool,
            scale: f32,
            offset: i32,
            freqs: &array,
        ) -> Result<UniquePtr<array>>;
        fn rope_positions(
            x: &array,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offsets: &array,
        ) -> Result<UniquePtr<array>>;
        fn rope_freqs_positions(
            x: &array,
            dims: i32,
            traditional: bool,
            scale: f32,
            offsets: &array,
            freqs: &array,
        ) -> Result<UniquePtr<array>>;
        fn sdpa(q: &array, k: &array, v: &array, scale: f32, mask_mode: &str)
            -> Result<UniquePtr<array>>;
        fn sdpa_masked(q: &array, k: &array, v: &array, scale: f32, mask: &array)
            -> Result<UniquePtr<array>>;

        fn random_key(seed: u64) -> Result<UniquePtr<array>>;
        fn random_split(key: &array) -> Result<UniquePtr<ArrVec>>;
        fn categorical(logits: &array, key: &array) -> Result<UniquePtr<array>>;

        fn load_safetensors(path: &str) -> Result<UniquePtr<TensorFile>>;
        fn load_gguf(path: &str) -> Result<UniquePtr<TensorFile>>;
        fn save_safetensors(path: &str, f: &TensorFile) -> Result<()>;
        fn tensor_file_new() -> Result<UniquePtr<TensorFile>>;
        fn tensor_file_insert(f: Pin<&mut TensorFile>, name: &str, a: &array) -> Result<()>;
        fn tensor_file_set_meta(f: Pin<&mut TensorFile>, key: &str, value: &str) -> Result<()>;
        fn tensor_names(f: &TensorFile) -> Result<Vec<String>>;
        fn tensor_take(f: Pin<&mut TensorFile>, name: &str) -> Result<UniquePtr<array>>;
        fn meta_keys(f: &TensorFile) -> Result<Vec<String>>;
        fn meta_kind(f: &TensorFile, key: &str) -> Result<u8>;
        fn meta_str(f: &TensorFile, key: &str) -> Result<String>;
        fn meta_list(f: &TensorFile, key: &str) -> Result<Vec<String>>;
        fn meta_arr(f: &TensorFile, key: &str) -> Result<UniquePtr<array>>;

        fn gpu_available() -> Result<bool>;
        fn set_default_device(gpu: bool) -> Result<()>;
        fn default_device_is_gpu() -> Result<bool>;
        fn active_memory() -> Result<usize>;
        fn peak_memory() -> Result<usize>;
        fn cache_memory() -> Result<usize>;
        fn reset_peak_memory() -> Result<()>;
        fn clear_cache() -> Result<()>;
        fn set_cache_limit(limit: usize) -> Result<usize>;
        fn mlx_version() -> Result<String>;
    }
}

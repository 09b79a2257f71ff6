// C++ side of the MLX binding. Every function is a thin wrapper around one MLX
// call; exceptions propagate to Rust as `Err` through cxx. Nothing here keeps
// state except the holder structs that carry std containers across the bridge.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "mlx/mlx.h"
#include "rust/cxx.h"

namespace mlxrt {

using mlx::core::array;
using ArrPtr = std::unique_ptr<array>;

// A growable list of arrays (inputs to concatenate / eval, outputs of split).
struct ArrVec {
  std::vector<array> v;
};

// Tensors (and string metadata) loaded from one safetensors or GGUF file.
struct TensorFile {
  std::unordered_map<std::string, array> tensors;
  std::unordered_map<std::string, std::string> str_meta;
  std::unordered_map<std::string, std::vector<std::string>> list_meta;
  std::unordered_map<std::string, array> arr_meta;
};

// The MLX dtype of a `Dtype` code (src/mlx/array.rs).
mlx::core::Dtype to_dtype(uint8_t code);

// ---- creation and inspection ----
ArrPtr from_f32(rust::Slice<const float> data, rust::Slice<const int32_t> shape);
ArrPtr from_i32(rust::Slice<const int32_t> data, rust::Slice<const int32_t> shape);
ArrPtr from_u32(rust::Slice<const uint32_t> data, rust::Slice<const int32_t> shape);
ArrPtr from_bytes(rust::Slice<const uint8_t> data, rust::Slice<const int32_t> shape, uint8_t dtype);
ArrPtr scalar_f32(float v);
ArrPtr scalar_i32(int32_t v);
ArrPtr arange_i32(int32_t start, int32_t stop);
ArrPtr zeros(rust::Slice<const int32_t> shape, uint8_t dtype);
ArrPtr uninit(rust::Slice<const int32_t> shape, uint8_t dtype);
ArrPtr clone_arr(const array& a);
rust::Vec<int32_t> shape_of(const array& a);
uint8_t dtype_of(const array& a);
size_t nbytes_of(const array& a);
rust::Vec<float> to_vec_f32(const array& a);
rust::Vec<int32_t> to_vec_i32(const array& a);
rust::Vec<uint8_t> to_bytes(const array& a);

// ---- evaluation ----
std::unique_ptr<ArrVec> vec_new();
void vec_push(ArrVec& v, const array& a);
size_t vec_len(const ArrVec& v);
ArrPtr vec_get(const ArrVec& v, size_t i);
void eval_vec(const ArrVec& v);
void async_eval_vec(const ArrVec& v);
void eval_one(const array& a);

// ---- elementwise ----
ArrPtr add(const array& a, const array& b);
ArrPtr subtract(const array& a, const array& b);
ArrPtr multiply(const array& a, const array& b);
ArrPtr divide(const array& a, const array& b);
ArrPtr maximum(const array& a, const array& b);
ArrPtr minimum(const array& a, const array& b);
ArrPtr power(const array& a, const array& b);
ArrPtr greater(const array& a, const array& b);
ArrPtr greater_equal(const array& a, const array& b);
ArrPtr less(const array& a, const array& b);
ArrPtr equal(const array& a, const array& b);
ArrPtr logical_and(const array& a, const array& b);
ArrPtr logical_or(const array& a, const array& b);
ArrPtr logaddexp(const array& a, const array& b);
ArrPtr floor_divide(const array& a, const array& b);
ArrPtr where_(const array& c, const array& a, const array& b);
ArrPtr unary(const array& a, rust::Str name);
// Integer bit operations and the Hadamard transform (TurboQuant KV codec).
ArrPtr bitwise_and(const array& a, const array& b);
ArrPtr bitwise_or(const array& a, const array& b);
ArrPtr left_shift(const array& a, const array& b);
ArrPtr right_shift(const array& a, const array& b);
ArrPtr hadamard_transform(const array& a, float scale);

// ---- shape ----
ArrPtr reshape(const array& a, rust::Slice<const int32_t> shape);
ArrPtr transpose(const array& a, rust::Slice<const int32_t> axes);
ArrPtr swapaxes(const array& a, int32_t a1, int32_t a2);
ArrPtr expand_dims(const array& a, int32_t axis);
ArrPtr squeeze(const array& a, int32_t axis);
ArrPtr broadcast_to(const array& a, rust::Slice<const int32_t> shape);
ArrPtr astype(const array& a, uint8_t dtype);
ArrPtr contiguous(const array& a);
ArrPtr slice(const array& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop,
             rust::Slice<const int32_t> strides);
ArrPtr slice_update(const array& src, const array& upd, rust::Slice<const int32_t> start,
                    rust::Slice<const int32_t> stop);
ArrPtr concatenate(const ArrVec& v, int32_t axis);
ArrPtr take(const array& a, const array& idx, int32_t axis);
ArrPtr take_along_axis(const array& a, const array& idx, int32_t axis);
ArrPtr put_along_axis(const array& a, const array& idx, const array& vals, int32_t axis);

// ---- reductions and sorting ----
ArrPtr reduce(const array& a, rust::Str op, int32_t axis, bool keepdims);
ArrPtr argmax(const array& a, int32_t axis, bool keepdims);
ArrPtr argpartition(const array& a, int32_t kth, int32_t axis);
ArrPtr argsort(const array& a, int32_t axis);
ArrPtr sort(const array& a, int32_t axis);
ArrPtr cumsum(const array& a, int32_t axis, bool reverse, bool inclusive);
ArrPtr softmax(const array& a, int32_t axis, bool precise);

// ---- linear algebra and fast kernels ----
ArrPtr matmul(const array& a, const array& b);
ArrPtr addmm(const array& c, const array& a, const array& b);
ArrPtr quantized_matmul(const array& x, const array& w, const array& scales,
                        const array& biases, bool transpose, int32_t group_size, int32_t bits);
ArrPtr dequantize(const array& w, const array& scales, const array& biases, int32_t group_size,
                  int32_t bits);
std::unique_ptr<ArrVec> quantize(const array& w, int32_t group_size, int32_t bits);
ArrPtr rms_norm(const array& x, const array& w, float eps);
ArrPtr rms_norm_plain(const array& x, float eps);
ArrPtr gather_qmm(const array& x, const array& w, const array& scales, const array& biases,
                  const array& rhs_indices, bool transpose, int32_t group_size, int32_t bits,
                  bool sorted_indices);
ArrPtr gather_mm(const array& a, const array& b, const array& rhs_indices, bool sorted_indices);
ArrPtr conv1d(const array& x, const array& w, int32_t stride, int32_t padding, int32_t dilation,
              int32_t groups);
ArrPtr conv2d(const array& x, const array& w, int32_t stride_h, int32_t stride_w, int32_t pad_h,
              int32_t pad_w);
std::unique_ptr<ArrVec> gated_delta_update(const array& q, const array& k, const array& v,
                                           const array& g, const array& beta,
                                           const array& state);
std::unique_ptr<ArrVec> gated_delta_update_masked(const array& q, const array& k,
                                                  const array& v, const array& g,
                                                  const array& beta, const array& state,
                                                  const array& mask);
ArrPtr rope(const array& x, int32_t dims, bool traditional, float base, float scale,
            int32_t offset);
ArrPtr rope_freqs(const array& x, int32_t dims, bool traditional, float scale, int32_t offset,
                  const array& freqs);
ArrPtr rope_positions(const array& x, int32_t dims, bool traditional, float base, float scale,
                      const array& offsets);
ArrPtr rope_freqs_positions(const array& x, int32_t dims, bool traditional, float scale,
                            const array& offsets, const array& freqs);
ArrPtr sdpa(const array& q, const array& k, const array& v, float scale, rust::Str mask_mode);
ArrPtr sdpa_masked(const array& q, const array& k, const array& v, float scale,
                   const array& mask);

// ---- random ----
ArrPtr random_key(uint64_t seed);
std::unique_ptr<ArrVec> random_split(const array& key);
ArrPtr categorical(const array& logits, const array& key);

// ---- files ----
std::unique_ptr<TensorFile> load_safetensors(rust::Str path);
std::unique_ptr<TensorFile> load_gguf(rust::Str path);
void save_safetensors(rust::Str path, const TensorFile& f);
std::unique_ptr<TensorFile> tensor_file_new();
void tensor_file_insert(TensorFile& f, rust::Str name, const array& a);
void tensor_file_set_meta(TensorFile& f, rust::Str key, rust::Str value);
rust::Vec<rust::String> tensor_names(const TensorFile& f);
ArrPtr tensor_take(TensorFile& f, rust::Str name);
rust::Vec<rust::String> meta_keys(const TensorFile& f);
// 0 = absent, 1 = string, 2 = list of strings, 3 = array
uint8_t meta_kind(const TensorFile& f, rust::Str key);
rust::String meta_str(const TensorFile& f, rust::Str key);
rust::Vec<rust::String> meta_list(const TensorFile& f, rust::Str key);
ArrPtr meta_arr(const TensorFile& f, rust::Str key);

// ---- device, memory, version ----
bool gpu_available();
void set_default_device(bool gpu);
bool default_device_is_gpu();
size_t active_memory();
size_t peak_memory();
size_t cache_memory();
void reset_peak_memory();
void clear_cache();
size_t set_cache_limit(size_t limit);
rust::String mlx_version();

}  // namespace mlxrt

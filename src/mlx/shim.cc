#include "mlxrt/src/mlx/shim.h"

#include <stdexcept>

namespace mx = mlx::core;

namespace mlxrt {

namespace {

ArrPtr up(array a) { return std::make_unique<array>(std::move(a)); }

mx::Shape to_shape(rust::Slice<const int32_t> s) { return mx::Shape(s.begin(), s.end()); }

std::string str(rust::Str s) { return std::string(s.data(), s.size()); }

uint8_t from_dtype(mx::Dtype d) {
  switch (d.val()) {
    case mx::Dtype::Val::bool_: return 0;
    case mx::Dtype::Val::uint8: return 1;
    case mx::Dtype::Val::uint16: return 2;
    case mx::Dtype::Val::uint32: return 3;
    case mx::Dtype::Val::uint64: return 4;
    case mx::Dtype::Val::int8: return 5;
    case mx::Dtype::Val::int16: return 6;
    case mx::Dtype::Val::int32: return 7;
    case mx::Dtype::Val::int64: return 8;
    case mx::Dtype::Val::float16: return 9;
    case mx::Dtype::Val::float32: return 10;
    case mx::Dtype::Val::float64: return 11;
    case mx::Dtype::Val::bfloat16: return 12;
    case mx::Dtype::Val::complex64: return 13;
  }
  return 255;
}

void check_count(size_t n, const mx::Shape& shape) {
  size_t want = 1;
  for (auto d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape");
    want *= static_cast<size_t>(d);
  }
  if (want != n)
    throw std::invalid_argument("data has " + std::to_string(n) + " elements, shape needs " +
                                std::to_string(want));
}

template <typename T>
rust::Vec<T> copy_out(const array& a, mx::Dtype dt) {
  array c = mx::contiguous(mx::astype(a, dt));
  c.eval();
  rust::Vec<T> out;
  out.reserve(c.size());
  const T* p = c.data<T>();
  for (size_t i = 0; i < c.size(); ++i) out.push_back(p[i]);
  return out;
}

}  // namespace

// Codes shared with `Dtype` in src/mlx/array.rs; never renumber.
mx::Dtype to_dtype(uint8_t code) {
  switch (code) {
    case 0: return mx::bool_;
    case 1: return mx::uint8;
    case 2: return mx::uint16;
    case 3: return mx::uint32;
    case 4: return mx::uint64;
    case 5: return mx::int8;
    case 6: return mx::int16;
    case 7: return mx::int32;
    case 8: return mx::int64;
    case 9: return mx::float16;
    case 10: return mx::float32;
    case 11: return mx::float64;
    case 12: return mx::bfloat16;
    case 13: return mx::complex64;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(code));
}

ArrPtr from_f32(rust::Slice<const float> data, rust::Slice<const int32_t> shape) {
  auto s = to_shape(shape);
  check_count(data.size(), s);
  return up(array(data.data(), s, mx::float32));
}
ArrPtr from_i32(rust::Slice<const int32_t> data, rust::Slice<const int32_t> shape) {
  auto s = to_shape(shape);
  check_count(data.size(), s);
  return up(array(data.data(), s, mx::int32));
}
ArrPtr from_u32(rust::Slice<const uint32_t> data, rust::Slice<const int32_t> shape) {
  auto s = to_shape(shape);
  check_count(data.size(), s);
  return up(array(data.data(), s, mx::uint32));
}
ArrPtr from_bytes(rust::Slice<const uint8_t> data, rust::Slice<const int32_t> shape,
                  uint8_t dtype) {
  auto s = to_shape(shape);
  auto dt = to_dtype(dtype);
  size_t n = data.size() / dt.size();
  if (n * dt.size() != data.size()) throw std::invalid_argument("byte length not a multiple of dtype size");
  check_count(n, s);
  array raw(data.data(), mx::Shape{static_cast<int>(data.size())}, mx::uint8);
  return up(mx::reshape(mx::view(raw, dt), s));
}
ArrPtr scalar_f32(float v) { return up(array(v)); }
ArrPtr scalar_i32(int32_t v) { return up(array(v)); }
ArrPtr arange_i32(int32_t start, int32_t stop) { return up(mx::arange(start, stop, 1)); }
ArrPtr zeros(rust::Slice<const int32_t> shape, uint8_t dtype) {
  return up(mx::zeros(to_shape(shape), to_dtype(dtype)));
}
// A buffer straight from MLX's allocator, not written: on CPU its pages are
// faulted in as they are first written, so capacity reserved ahead (KV
// caches) costs no resident memory and no zero-fill.
ArrPtr uninit(rust::Slice<const int32_t> shape, uint8_t dtype) {
  auto s = to_shape(shape);
  auto dt = to_dtype(dtype);
  size_t bytes = dt.size();
  for (auto d : s) {
    if (d < 0) throw std::invalid_argument("negative dimension");
    if (__builtin_mul_overflow(bytes, static_cast<size_t>(d), &bytes))
      throw std::invalid_argument("array too large for the address space");
  }
  auto data = mx::allocator::malloc(bytes);
  if (bytes > 0 && data.buffer().ptr() == nullptr)
    throw std::runtime_error("cannot allocate " + std::to_string(bytes) + " bytes");
  return up(array(std::move(data), s, dt));
}
ArrPtr clone_arr(const array& a) { return up(a); }
rust::Vec<int32_t> shape_of(const array& a) {
  rust::Vec<int32_t> out;
  for (auto d : a.shape()) out.push_back(d);
  return out;
}
uint8_t dtype_of(const array& a) { return from_dtype(a.dtype()); }
size_t nbytes_of(const array& a) { return a.nbytes(); }
rust::Vec<float> to_vec_f32(const array& a) { return copy_out<float>(a, mx::float32); }
rust::Vec<int32_t> to_vec_i32(const array& a) { return copy_out<int32_t>(a, mx::int32); }
rust::Vec<uint8_t> to_bytes(const array& a) {
  array c = mx::contiguous(a);
  c.eval();
  rust::Vec<uint8_t> out;
  out.reserve(c.nbytes());
  const uint8_t* p = c.data<uint8_t>();
  for (size_t i = 0; i < c.nbytes(); ++i) out.push_back(p[i]);
  return out;
}

std::unique_ptr<ArrVec> vec_new() { return std::make_unique<ArrVec>(); }
void vec_push(ArrVec& v, const array& a) { v.v.push_back(a); }
size_t vec_len(const ArrVec& v) { return v.v.size(); }
ArrPtr vec_get(const ArrVec& v, size_t i) {
  if (i >= v.v.size()) throw std::out_of_range("array list index out of range");
  return up(v.v[i]);
}
void eval_vec(const ArrVec& v) { mx::eval(v.v); }
void async_eval_vec(const ArrVec& v) { mx::async_eval(v.v); }
void eval_one(const array& a) { mx::eval({a}); }

ArrPtr add(const array& a, const array& b) { return up(mx::add(a, b)); }
ArrPtr subtract(const array& a, const array& b) { return up(mx::subtract(a, b)); }
ArrPtr multiply(const array& a, const array& b) { return up(mx::multiply(a, b)); }
ArrPtr divide(const array& a, const array& b) { return up(mx::divide(a, b)); }
ArrPtr logaddexp(const array& a, const array& b) { return up(mx::logaddexp(a, b)); }
ArrPtr floor_divide(const array& a, const array& b) { return up(mx::floor_divide(a, b)); }
ArrPtr maximum(const array& a, const array& b) { return up(mx::maximum(a, b)); }
ArrPtr minimum(const array& a, const array& b) { return up(mx::minimum(a, b)); }
ArrPtr power(const array& a, const array& b) { return up(mx::power(a, b)); }
ArrPtr greater(const array& a, const array& b) { return up(mx::greater(a, b)); }
ArrPtr greater_equal(const array& a, const array& b) { return up(mx::greater_equal(a, b)); }
ArrPtr less(const array& a, const array& b) { return up(mx::less(a, b)); }
ArrPtr equal(const array& a, const array& b) { return up(mx::equal(a, b)); }
ArrPtr logical_and(const array& a, const array& b) { return up(mx::logical_and(a, b)); }
ArrPtr logical_or(const array& a, const array& b) { return up(mx::logical_or(a, b)); }
ArrPtr where_(const array& c, const array& a, const array& b) { return up(mx::where(c, a, b)); }

ArrPtr unary(const array& a, rust::Str name) {
  auto n = str(name);
  if (n == "exp") return up(mx::exp(a));
  if (n == "log") return up(mx::log(a));
  if (n == "sigmoid") return up(mx::sigmoid(a));
  if (n == "tanh") return up(mx::tanh(a));
  if (n == "erf") return up(mx::erf(a));
  if (n == "sqrt") return up(mx::sqrt(a));
  if (n == "rsqrt") return up(mx::rsqrt(a));
  if (n == "square") return up(mx::square(a));
  if (n == "negative") return up(mx::negative(a));
  if (n == "abs") return up(mx::abs(a));
  if (n == "logical_not") return up(mx::logical_not(a));
  if (n == "stop_gradient") return up(mx::stop_gradient(a));
  if (n == "silu") return up(mx::multiply(a, mx::sigmoid(a)));
  if (n == "round") return up(mx::round(a));
  if (n == "floor") return up(mx::floor(a));
  if (n == "cos") return up(mx::cos(a));
  if (n == "sin") return up(mx::sin(a));
  throw std::invalid_argument("unknown unary op " + n);
}

ArrPtr bitwise_and(const array& a, const array& b) { return up(mx::bitwise_and(a, b)); }
ArrPtr bitwise_or(const array& a, const array& b) { return up(mx::bitwise_or(a, b)); }
ArrPtr left_shift(const array& a, const array& b) { return up(mx::left_shift(a, b)); }
ArrPtr right_shift(const array& a, const array& b) { return up(mx::right_shift(a, b)); }
ArrPtr hadamard_transform(const array& a, float scale) {
  return up(mx::hadamard_transform(a, scale));
}

ArrPtr reshape(const array& a, rust::Slice<const int32_t> shape) {
  return up(mx::reshape(a, to_shape(shape)));
}
ArrPtr transpose(const array& a, rust::Slice<const int32_t> axes) {
  return up(mx::transpose(a, std::vector<int>(axes.begin(), axes.end())));
}
ArrPtr swapaxes(const array& a, int32_t a1, int32_t a2) { return up(mx::swapaxes(a, a1, a2)); }
ArrPtr expand_dims(const array& a, int32_t axis) { return up(mx::expand_dims(a, axis)); }
ArrPtr squeeze(const array& a, int32_t axis) { return up(mx::squeeze(a, axis)); }
ArrPtr broadcast_to(const array& a, rust::Slice<const int32_t> shape) {
  return up(mx::broadcast_to(a, to_shape(shape)));
}
ArrPtr astype(const array& a, uint8_t dtype) { return up(mx::astype(a, to_dtype(dtype))); }
ArrPtr contiguous(const array& a) { return up(mx::contiguous(a)); }
ArrPtr slice(const array& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop,
             rust::Slice<const int32_t> strides) {
  return up(mx::slice(a, to_shape(start), to_shape(stop), to_shape(strides)));
}
ArrPtr slice_update(const array& src, const array& upd, rust::Slice<const int32_t> start,
                    rust::Slice<const int32_t> stop) {
  return up(mx::slice_update(src, upd, to_shape(start), to_shape(stop)));
}
ArrPtr concatenate(const ArrVec& v, int32_t axis) { return up(mx::concatenate(v.v, axis)); }
ArrPtr take(const array& a, const array& idx, int32_t axis) { return up(mx::take(a, idx, axis)); }
ArrPtr take_along_axis(const array& a, const array& idx, int32_t axis) {
  return up(mx::take_along_axis(a, idx, axis));
}
ArrPtr put_along_axis(const array& a, const array& idx, const array& vals, int32_t axis) {
  return up(mx::put_along_axis(a, idx, vals, axis));
}

ArrPtr reduce(const array& a, rust::Str op, int32_t axis, bool keepdims) {
  auto n = str(op);
  std::vector<int> axes{axis};
  if (n == "sum") return up(mx::sum(a, axes, keepdims));
  if (n == "max") return up(mx::max(a, axes, keepdims));
  if (n == "min") return up(mx::min(a, axes, keepdims));
  if (n == "mean") return up(mx::mean(a, axes, keepdims));
  if (n == "logsumexp") return up(mx::logsumexp(a, axes, keepdims));
  throw std::invalid_argument("unknown reduction " + n);
}
ArrPtr argmax(const array& a, int32_t axis, bool keepdims) {
  return up(mx::argmax(a, axis, keepdims));
}
ArrPtr argpartition(const array& a, int32_t kth, int32_t axis) {
  return up(mx::argpartition(a, kth, axis));
}
ArrPtr argsort(const array& a, int32_t axis) { return up(mx::argsort(a, axis)); }
ArrPtr sort(const array& a, int32_t axis) { return up(mx::sort(a, axis)); }
ArrPtr cumsum(const array& a, int32_t axis, bool reverse, bool inclusive) {
  return up(mx::cumsum(a, axis, reverse, inclusive));
}
ArrPtr softmax(const array& a, int32_t axis, bool precise) {
  return up(mx::softmax(a, std::vector<int>{axis}, precise));
}

ArrPtr matmul(const array& a, const array& b) { return up(mx::matmul(a, b)); }
ArrPtr addmm(const array& c, const array& a, const array& b) { return up(mx::addmm(c, a, b)); }
ArrPtr quantized_matmul(const array& x, const array& w, const array& scales,
                        const array& biases, bool transpose, int32_t group_size, int32_t bits) {
  return up(mx::quantized_matmul(x, w, scales, biases, transpose, group_size, bits, "affine"));
}
ArrPtr dequantize(const array& w, const array& scales, const array& biases, int32_t group_size,
                  int32_t bits) {
  return up(mx::dequantize(w, scales, biases, group_size, bits, "affine"));
}
std::unique_ptr<ArrVec> quantize(const array& w, int32_t group_size, int32_t bits) {
  auto out = std::make_unique<ArrVec>();
  out->v = mx::quantize(w, group_size, bits, "affine");
  return out;
}
ArrPtr rms_norm(const array& x, const array& w, float eps) {
  return up(mx::fast::rms_norm(x, w, eps));
}
ArrPtr rms_norm_plain(const array& x, float eps) {
  return up(mx::fast::rms_norm(x, std::nullopt, eps));
}
ArrPtr gather_qmm(const array& x, const array& w, const array& scales, const array& biases,
                  const array& rhs_indices, bool transpose, int32_t group_size, int32_t bits,
                  bool sorted_indices) {
  return up(mx::gather_qmm(x, w, scales, biases, std::nullopt, rhs_indices, transpose, group_size,
                           bits, "affine", std::nullopt, sorted_indices));
}
ArrPtr gather_mm(const array& a, const array& b, const array& rhs_indices, bool sorted_indices) {
  return up(mx::gather_mm(a, b, std::nullopt, rhs_indices, sorted_indices));
}
ArrPtr conv1d(const array& x, const array& w, int32_t stride, int32_t padding, int32_t dilation,
              int32_t groups) {
  return up(mx::conv1d(x, w, stride, padding, dilation, groups));
}
ArrPtr conv2d(const array& x, const array& w, int32_t stride_h, int32_t stride_w, int32_t pad_h,
              int32_t pad_w) {
  return up(mx::conv2d(x, w, {stride_h, stride_w}, {pad_h, pad_w}));
}
std::unique_ptr<ArrVec> gated_delta_update(const array& q, const array& k, const array& v,
                                           const array& g, const array& beta,
                                           const array& state) {
  auto out = std::make_unique<ArrVec>();
  out->v = mx::fast::gated_delta_update(q, k, v, g, beta, state);
  return out;
}
std::unique_ptr<ArrVec> gated_delta_update_masked(const array& q, const array& k,
                                                  const array& v, const array& g,
                                                  const array& beta, const array& state,
                                                  const array& mask) {
  auto out = std::make_unique<ArrVec>();
  out->v = mx::fast::gated_delta_update(q, k, v, g, beta, state, mask);
  return out;
}
ArrPtr rope(const array& x, int32_t dims, bool traditional, float base, float scale,
            int32_t offset) {
  return up(mx::fast::rope(x, dims, traditional, base, scale, offset));
}
ArrPtr rope_freqs(const array& x, int32_t dims, bool traditional, float scale, int32_t offset,
                  const array& freqs) {
  return up(mx::fast::rope(x, dims, traditional, std::nullopt, scale, offset, freqs));
}
ArrPtr rope_positions(const array& x, int32_t dims, bool traditional, float base, float scale,
                      const array& offsets) {
  return up(mx::fast::rope(x, dims, traditional, base, scale, offsets));
}
ArrPtr rope_freqs_positions(const array& x, int32_t dims, bool traditional, float scale,
                            const array& offsets, const array& freqs) {
  return up(mx::fast::rope(x, dims, traditional, std::nullopt, scale, offsets, freqs));
}
ArrPtr sdpa(const array& q, const array& k, const array& v, float scale, rust::Str mask_mode) {
  return up(mx::fast::scaled_dot_product_attention(q, k, v, scale, str(mask_mode)));
}
ArrPtr sdpa_masked(const array& q, const array& k, const array& v, float scale,
                   const array& mask) {
  return up(mx::fast::scaled_dot_product_attention(q, k, v, scale, "array", mask));
}

ArrPtr random_key(uint64_t seed) { return up(mx::random::key(seed)); }
std::unique_ptr<ArrVec> random_split(const array& key) {
  auto [a, b] = mx::random::split(key);
  auto out = std::make_unique<ArrVec>();
  out->v.push_back(a);
  out->v.push_back(b);
  return out;
}
ArrPtr categorical(const array& logits, const array& key) {
  return up(mx::random::categorical(logits, -1, key));
}

std::unique_ptr<TensorFile> load_safetensors(rust::Str path) {
  auto [tensors, meta] = mx::load_safetensors(str(path));
  auto f = std::make_unique<TensorFile>();
  f->tensors = std::move(tensors);
  f->str_meta = std::move(meta);
  return f;
}
std::unique_ptr<TensorFile> load_gguf(rust::Str path) {
  auto [tensors, meta] = mx::load_gguf(str(path));
  auto f = std::make_unique<TensorFile>();
  f->tensors = std::move(tensors);
  for (auto& [k, v] : meta) {
    if (auto s = std::get_if<std::string>(&v)) f->str_meta.emplace(k, *s);
    else if (auto l = std::get_if<std::vector<std::string>>(&v)) f->list_meta.emplace(k, *l);
    else if (auto a = std::get_if<array>(&v)) f->arr_meta.emplace(k, *a);
  }
  return f;
}
void save_safetensors(rust::Str path, const TensorFile& f) {
  mx::save_safetensors(str(path), f.tensors, f.str_meta);
}
std::unique_ptr<TensorFile> tensor_file_new() { return std::make_unique<TensorFile>(); }
void tensor_file_insert(TensorFile& f, rust::Str name, const array& a) {
  f.tensors.insert_or_assign(str(name), a);
}
void tensor_file_set_meta(TensorFile& f, rust::Str key, rust::Str value) {
  f.str_meta.insert_or_assign(str(key), str(value));
}
rust::Vec<rust::String> tensor_names(const TensorFile& f) {
  rust::Vec<rust::String> out;
  for (auto& [k, _] : f.tensors) out.push_back(rust::String(k));
  return out;
}
ArrPtr tensor_take(TensorFile& f, rust::Str name) {
  auto it = f.tensors.find(str(name));
  if (it == f.tensors.end()) throw std::out_of_range("no tensor named " + str(name));
  auto a = up(std::move(it->second));
  f.tensors.erase(it);
  return a;
}
rust::Vec<rust::String> meta_keys(const TensorFile& f) {
  rust::Vec<rust::String> out;
  for (auto& [k, _] : f.str_meta) out.push_back(rust::String(k));
  for (auto& [k, _] : f.list_meta) out.push_back(rust::String(k));
  for (auto& [k, _] : f.arr_meta) out.push_back(rust::String(k));
  return out;
}
uint8_t meta_kind(const TensorFile& f, rust::Str key) {
  auto k = str(key);
  if (f.str_meta.count(k)) return 1;
  if (f.list_meta.count(k)) return 2;
  if (f.arr_meta.count(k)) return 3;
  return 0;
}
rust::String meta_str(const TensorFile& f, rust::Str key) {
  auto it = f.str_meta.find(str(key));
  if (it == f.str_meta.end()) throw std::out_of_range("no string metadata " + str(key));
  return rust::String::lossy(it->second);
}
rust::Vec<rust::String> meta_list(const TensorFile& f, rust::Str key) {
  auto it = f.list_meta.find(str(key));
  if (it == f.list_meta.end()) throw std::out_of_range("no list metadata " + str(key));
  rust::Vec<rust::String> out;
  out.reserve(it->second.size());
  for (auto& s : it->second) out.push_back(rust::String::lossy(s));
  return out;
}
ArrPtr meta_arr(const TensorFile& f, rust::Str key) {
  auto it = f.arr_meta.find(str(key));
  if (it == f.arr_meta.end()) throw std::out_of_range("no array metadata " + str(key));
  return up(it->second);
}

bool gpu_available() { return mx::is_available(mx::Device::gpu); }
void set_default_device(bool gpu) {
  mx::set_default_device(gpu ? mx::Device::gpu : mx::Device::cpu);
}
bool default_device_is_gpu() { return mx::default_device() == mx::Device::gpu; }
size_t active_memory() { return mx::get_active_memory(); }
size_t peak_memory() { return mx::get_peak_memory(); }
size_t cache_memory() { return mx::get_cache_memory(); }
void reset_peak_memory() { mx::reset_peak_memory(); }
void clear_cache() { mx::clear_cache(); }
size_t set_cache_limit(size_t limit) { return mx::set_cache_limit(limit); }
rust::String mlx_version() { return rust::String(mx::version()); }

}  // namespace mlxrt

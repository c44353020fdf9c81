#include "kernels/cuda/device_weights.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"

namespace pipeline::cuda {
namespace {

bool is_tied(const LlamaWeights& w) {
  return w.lm_head.data == w.embed.data;
}

constexpr size_t kStagingBytes = size_t(64) << 20;

// Copies checkpoint tensors to the device in bf16, converting other dtypes through a bounded
// staging buffer so a float32 7B checkpoint never needs a second full copy on the device.
class Uploader {
 public:
  explicit Uploader(cudaStream_t stream) : stream_(stream), staging_(kStagingBytes) {}

  // Writes `tensor` (which must have `expected` elements) at dst.
  void copy(const TensorView& tensor, int64_t expected, bf16* dst) {
    if (tensor.numel() != expected)
      throw std::runtime_error("CUDA upload: tensor " + tensor.name + " " + tensor.shape_string() +
                               " has " + std::to_string(tensor.numel()) + " elements, expected " +
                               std::to_string(expected));
    const size_t element = dtype_size(tensor.dtype);
    const size_t chunk = kStagingBytes / element;
    const size_t n = size_t(expected);
    for (size_t done = 0; done < n; done += chunk) {
      const size_t count = std::min(chunk, n - done);
      if (tensor.dtype == DType::BF16) {  // already bf16: straight into place
        PIPELINE_CUDA_CHECK(cudaMemcpyAsync(dst + done, tensor.data + done * element,
                                            count * element, cudaMemcpyHostToDevice, stream_));
        continue;
      }
      // Stream order keeps the next chunk's copy behind this chunk's conversion.
      PIPELINE_CUDA_CHECK(cudaMemcpyAsync(staging_.data(), tensor.data + done * element,
                                          count * element, cudaMemcpyHostToDevice, stream_));
      convert_to_bf16(staging_.data(), tensor.dtype, dst + done, count, stream_);
    }
  }

  // [2 * rows, cols]: row 2j is a's row j, row 2j + 1 is b's (both [rows, cols]). Uploaded one
  // after the other, then laid out by two strided device copies.
  DeviceBuffer<bf16> interleave_rows(const TensorView& a, const TensorView& b, int64_t rows,
                                     int64_t cols) {
    DeviceBuffer<bf16> stacked(size_t(2 * rows * cols)), out(size_t(2 * rows * cols));
    copy(a, rows * cols, stacked.data());
    copy(b, rows * cols, stacked.data() + rows * cols);
    const size_t row_bytes = size_t(cols) * sizeof(bf16);
    for (int half = 0; half < 2; ++half)
      PIPELINE_CUDA_CHECK(cudaMemcpy2DAsync(
          out.data() + half * cols, 2 * row_bytes, stacked.data() + half * rows * cols, row_bytes,
          row_bytes, size_t(rows), cudaMemcpyDeviceToDevice, stream_));
    PIPELINE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // before `stacked` is freed
    return out;
  }

  DeviceBuffer<bf16> upload(const TensorView& tensor) {
    DeviceBuffer<bf16> buffer(size_t(tensor.numel()));
    copy(tensor, tensor.numel(), buffer.data());
    return buffer;
  }

 private:
  cudaStream_t stream_;
  DeviceBuffer<std::byte> staging_;
};

}  // namespace

size_t device_weight_bytes(const LlamaWeights& weights) {
  size_t elements = size_t(weights.embed.numel()) + size_t(weights.final_norm.numel());
  if (!is_tied(weights)) elements += size_t(weights.lm_head.numel());
  for (const LayerWeights& l : weights.layers)
    for (const TensorView* t :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.mlp_norm, &l.w_gate, &l.w_up, &l.w_down})
      elements += size_t(t->numel());
  return elements * sizeof(bf16);
}

size_t upload_scratch_bytes(const LlamaConfig& c) {
  return kStagingBytes + 2 * size_t(c.intermediate_size) * size_t(c.hidden_size) * sizeof(bf16);
}

size_t decode_weight_bytes(const LlamaConfig& c) {
  const size_t hidden = size_t(c.hidden_size);
  const size_t per_layer = (size_t(c.q_dim()) + 2 * size_t(c.kv_dim())) * hidden +
                           hidden * size_t(c.q_dim()) + 3 * size_t(c.intermediate_size) * hidden +
                           2 * hidden;
  return (per_layer * size_t(c.num_layers) + size_t(c.vocab_size) * hidden + hidden) * sizeof(bf16);
}

DeviceWeights upload_weights(const LlamaWeights& weights, cudaStream_t stream) {
  const LlamaConfig& c = weights.config;
  const int64_t hidden = c.hidden_size, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const int64_t inter = c.intermediate_size;
  Uploader uploader(stream);
  DeviceWeights out;
  out.embed = uploader.upload(weights.embed);
  out.final_norm = uploader.upload(weights.final_norm);
  if (is_tied(weights)) {
    out.lm_head = out.embed.data();
  } else {
    out.untied_lm_head = uploader.upload(weights.lm_head);
    out.lm_head = out.untied_lm_head.data();
  }
  for (const LayerWeights& l : weights.layers) {
    DeviceLayer d;
    d.attn_norm = uploader.upload(l.attn_norm);
    d.mlp_norm = uploader.upload(l.mlp_norm);
    d.wo = uploader.upload(l.wo);
    d.w_down = uploader.upload(l.w_down);
    // Row-major [out, in]: stacking the output rows of q, k and v is concatenating the tensors.
    d.wqkv = DeviceBuffer<bf16>(size_t((q_dim + 2 * kv_dim) * hidden));
    uploader.copy(l.wq, q_dim * hidden, d.wqkv.data());
    uploader.copy(l.wk, kv_dim * hidden, d.wqkv.data() + q_dim * hidden);
    uploader.copy(l.wv, kv_dim * hidden, d.wqkv.data() + (q_dim + kv_dim) * hidden);
    d.w_gate_up = uploader.interleave_rows(l.w_gate, l.w_up, inter, hidden);
    out.layers.push_back(std::move(d));
  }
  PIPELINE_CUDA_CHECK(cudaStreamSynchronize(stream));  // the staging buffer dies with uploader
  return out;
}

}  // namespace pipeline::cuda

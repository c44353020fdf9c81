#include "model/cpu_runner.h"

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/huge_page_buffer.h"
#include "kernels/cpu/packed_matmul.h"
#include "kernels/cpu/paged_kv.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/silu_mul.h"
#include "kernels/cpu/weight_matrix.h"
#include "model/cpu_kv_pool.h"
#include "model/sampling.h"

namespace pipeline {
namespace {

using cpu::MatmulMode;
using cpu::PackedMatrix;
using cpu::WeightMatrix;

WeightMatrix as_matrix(const TensorView& t, int64_t rows, int64_t cols) {
  if (t.data == nullptr || t.shape != std::vector<int64_t>{rows, cols}) {
    throw std::invalid_argument("make_cpu_runner: tensor '" + t.name + "' has shape " +
                                t.shape_string() + ", expected [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]");
  }
  return WeightMatrix{t.data, t.dtype, int(rows), int(cols)};
}

// Drops this process's pages of a tensor's file mapping once it has been repacked, so the
// weights are resident once, not twice. (When lm_head is tied to the embedding, the lookups
// read the packed lm_head, so those pages are not faulted back in either.)
void release_mapped_pages(const TensorView& t) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(t.data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(t.data) + t.nbytes()) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// Norm weights are tiny and read for every token: widen them to float32 once.
std::vector<float> as_float_vector(const TensorView& t, int64_t size) {
  if (t.data == nullptr || t.shape != std::vector<int64_t>{size}) {
    throw std::invalid_argument("make_cpu_runner: tensor '" + t.name + "' has shape " +
                                t.shape_string() + ", expected [" + std::to_string(size) + "]");
  }
  std::vector<float> v(static_cast<size_t>(size));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(t.data, t.dtype, i);
  return v;
}

// For a Batch that is argmax_only(): each row's argmax in place of the rows.
void keep_argmaxes_only(Logits& logits) {
  const int rows = logits.rows();
  logits.argmax.resize(size_t(rows));
  tbb::parallel_for(0, rows, [&](int r) { logits.argmax[size_t(r)] = argmax_of(logits.row(r)); });
  logits.data.clear();
}

// The weights, after checking that their config describes a model this runner can run.
std::shared_ptr<const LlamaWeights> checked(std::shared_ptr<const LlamaWeights> weights) {
  if (!weights) throw std::invalid_argument("make_cpu_runner: no weights");
  const LlamaConfig& c = weights->config;
  if (c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 ||
      c.num_kv_heads <= 0 || c.vocab_size <= 0 || c.max_position_embeddings <= 0) {
    throw std::invalid_argument("make_cpu_runner: config has a non-positive dimension");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    throw std::invalid_argument("make_cpu_runner: num_heads " + std::to_string(c.num_heads) +
                                " is not a multiple of num_kv_heads " +
                                std::to_string(c.num_kv_heads));
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0 || c.head_dim > cpu::kMaxAttentionHeadDim) {
    throw std::invalid_argument("make_cpu_runner: head_dim " + std::to_string(c.head_dim) +
                                " must be even and at most " +
                                std::to_string(cpu::kMaxAttentionHeadDim));
  }
  return weights;
}

DType checked_matmul_activations(const RunnerOptions& options) {
  if (options.matmul_activations != DType::F32 && options.matmul_activations != DType::BF16)
    throw std::invalid_argument(std::string("RunnerOptions: matmul_activations ") +
                                dtype_name(options.matmul_activations) +
                                " is not supported by the CPU runner (F32 or BF16)");
  return options.matmul_activations;
}

class CpuRunner final : public ModelRunner {
 public:
  CpuRunner(std::shared_ptr<const LlamaWeights> weights, const RunnerOptions& options);

  const LlamaConfig& config() const override { return config_; }
  const KvCacheShape& kv_shape() const override { return shape_; }
  std::string device_name() const override { return "cpu"; }
  std::vector<std::string> setup_report() const override;
  void forward(const Batch& batch, Logits& logits) override;
  void watch_pass(std::function<bool()> wanted) override { wanted_ = std::move(wanted); }

 private:
  struct Layer {
    std::vector<float> attn_norm, mlp_norm;
    PackedMatrix qkv;  // [q | k | v], each part on a panel boundary
    PackedMatrix wo;
    PackedMatrix gate_up;  // gate and up interleaved panel by panel
    PackedMatrix down;
  };

  void check_batch(const Batch& batch) const;
  void pack(const Batch& batch);
  void run_layer(int layer);
  void compute_logits(Logits& logits);
  cpu::PagedKvLayer kv_layer(int layer);
  // A checkpoint tensor and the [rows, cols] shape the config gives it.
  struct ExpectedTensor {
    const TensorView& tensor;
    int64_t rows, cols;
  };
  enum class Fuse { Stack, Interleave };  // see PackedMatrix::stack and ::interleave
  // Packs the tensors (after checking their shapes) into one matrix and, when they live in the
  // checkpoint's file mappings, releases their mapped pages.
  PackedMatrix pack_weights(std::initializer_list<ExpectedTensor> tensors,
                            Fuse fuse = Fuse::Stack) const;

  std::shared_ptr<const LlamaWeights> weights_;
  const LlamaConfig& config_;
  KvCacheShape shape_;
  DType matmul_activations_;
  cpu::RopeTable rope_;
  std::optional<tbb::task_arena> arena_;
  WeightMatrix embed_;  // read in place, one row per token, unless lm_head is tied to it
  PackedMatrix lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  // [layer][block][kv_head][...] (kernels/cpu/paged_kv.h), page-aligned.
  cpu::HugePageBuffer k_pool_, v_pool_;

  // Per-forward scratch; grows to the largest batch seen and is reused.
  std::vector<int32_t> tokens_, positions_;
  std::vector<cpu::AttentionSequence> seqs_;
  std::vector<int> logit_rows_;  // which packed rows produce logits
  cpu::ScratchArray<float> x_, xn_, qkv_, att_, gate_up_, mlp_, final_;
  std::function<bool()> wanted_;  // asked before each layer
};

CpuRunner::CpuRunner(std::shared_ptr<const LlamaWeights> weights, const RunnerOptions& options)
    : weights_(checked(std::move(weights))),
      config_(weights_->config),
      shape_(derive_cpu_kv_shape(*weights_, options)),
      matmul_activations_(checked_matmul_activations(options)),
      rope_(config_.head_dim, config_.max_position_embeddings, config_.rope_theta) {
  if (options.threads > 0) arena_.emplace(options.threads);
  const LlamaConfig& c = config_;
  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size;
  embed_ = as_matrix(weights_->embed, c.vocab_size, hidden);
  final_norm_ = as_float_vector(weights_->final_norm, hidden);
  if (int(weights_->layers.size()) != c.num_layers) {
    throw std::invalid_argument("make_cpu_runner: " + std::to_string(weights_->layers.size()) +
                                " layers of weights for num_hidden_layers " +
                                std::to_string(c.num_layers));
  }
  const size_t pool_bytes = size_t(c.num_layers) * size_t(shape_.num_blocks) *
                            size_t(shape_.block_elems()) * dtype_size(shape_.dtype);
  const auto set_up = [&] {
    // The largest tensor first, so that its mapped pages are gone before the layers are packed.
    lm_head_ = pack_weights({{weights_->lm_head, c.vocab_size, hidden}});
    for (const LayerWeights& w : weights_->layers) {
      Layer& layer = layers_.emplace_back();
      layer.attn_norm = as_float_vector(w.attn_norm, hidden);
      layer.mlp_norm = as_float_vector(w.mlp_norm, hidden);
      layer.qkv = pack_weights(
          {{w.wq, c.q_dim(), hidden}, {w.wk, c.kv_dim(), hidden}, {w.wv, c.kv_dim(), hidden}});
      layer.wo = pack_weights({{w.wo, hidden, c.q_dim()}});
      layer.gate_up =
          pack_weights({{w.w_gate, ffn, hidden}, {w.w_up, ffn, hidden}}, Fuse::Interleave);
      layer.down = pack_weights({{w.w_down, hidden, ffn}});
    }
    // The whole KV pool resident from the start, as vLLM and llama.cpp allocate theirs: left to
    // fault in as blocks are first written, a step that gave 16 sequences of llama2-110m new
    // blocks stopped on 2,304 page faults and took twice as long as the steps around it; and a
    // pool the machine cannot hold fails now rather than once the server is busy.
    k_pool_ = cpu::allocate_huge_page_buffer(pool_bytes);
    v_pool_ = cpu::allocate_huge_page_buffer(pool_bytes);
    cpu::make_resident(k_pool_.get(), pool_bytes);
    cpu::make_resident(v_pool_.get(), pool_bytes);
  };
  if (arena_) {
    arena_->execute(set_up);
  } else {
    set_up();
  }
}

PackedMatrix CpuRunner::pack_weights(std::initializer_list<ExpectedTensor> tensors,
                                     Fuse fuse) const {
  std::vector<WeightMatrix> parts;
  for (const ExpectedTensor& t : tensors) parts.push_back(as_matrix(t.tensor, t.rows, t.cols));
  PackedMatrix packed =
      fuse == Fuse::Interleave
          ? PackedMatrix::interleave(parts.at(0), parts.at(1), matmul_activations_)
          : PackedMatrix::stack(parts, matmul_activations_);
  if (weights_->checkpoint) {
    for (const ExpectedTensor& t : tensors) release_mapped_pages(t.tensor);
  }
  return packed;
}

std::vector<std::string> CpuRunner::setup_report() const {
  return {std::string("matmuls on ") + cpu::isa_name(cpu::matmul_isa(lm_head_)) +
          ", activations in " + dtype_name(lm_head_.activations())};
}

cpu::PagedKvLayer CpuRunner::kv_layer(int layer) {
  const size_t offset = size_t(layer) * size_t(shape_.num_blocks) * size_t(shape_.block_elems()) *
                        dtype_size(shape_.dtype);
  return cpu::PagedKvLayer{k_pool_.get() + offset, v_pool_.get() + offset, shape_.block_size,
                           shape_.num_kv_heads,    shape_.head_dim,        shape_.dtype};
}

void CpuRunner::check_batch(const Batch& batch) const {
  // Messages are built only on failure: checking a decode step must not allocate.
  const auto fail = [](size_t seq, const std::string& what) {
    throw std::invalid_argument("CpuRunner::forward: sequence " + std::to_string(seq) + ": " +
                                what);
  };
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SequenceChunk& seq = batch.seqs[s];
    if (seq.tokens.empty()) fail(s, "no tokens");
    if (seq.start_pos < 0) fail(s, "negative start_pos " + std::to_string(seq.start_pos));
    const int64_t end = int64_t(seq.start_pos) + int64_t(seq.tokens.size());
    if (end > config_.max_position_embeddings) {
      fail(s, "positions up to " + std::to_string(end - 1) + " exceed max_position_embeddings " +
                  std::to_string(config_.max_position_embeddings));
    }
    const int needed = shape_.blocks_for(int(end));
    if (int(seq.block_table.size()) < needed) {
      fail(s, "block table has " + std::to_string(seq.block_table.size()) + " blocks, " +
                  std::to_string(end) + " positions need " + std::to_string(needed));
    }
    for (int b = 0; b < needed; ++b) {
      if (seq.block_table[b] < 0 || seq.block_table[b] >= shape_.num_blocks) {
        fail(s, "block id " + std::to_string(seq.block_table[b]) + " outside the pool of " +
                    std::to_string(shape_.num_blocks));
      }
    }
    for (int32_t token : seq.tokens) {
      if (token < 0 || token >= config_.vocab_size) {
        fail(s, "token id " + std::to_string(token) + " outside the vocabulary [0, " +
                    std::to_string(config_.vocab_size) + ")");
      }
    }
  }
}

// Lays every sequence's new tokens end to end (ragged) and grows the scratch buffers to fit.
void CpuRunner::pack(const Batch& batch) {
  tokens_.clear();
  positions_.clear();
  seqs_.clear();
  logit_rows_.clear();
  for (const SequenceChunk& seq : batch.seqs) {
    const int first_row = int(tokens_.size());
    const int n = int(seq.tokens.size());
    tokens_.insert(tokens_.end(), seq.tokens.begin(), seq.tokens.end());
    for (int i = 0; i < n; ++i) positions_.push_back(seq.start_pos + i);
    seqs_.push_back({first_row, n, seq.start_pos, seq.block_table});
    if (seq.all_logits) {
      for (int i = 0; i < n; ++i) logit_rows_.push_back(first_row + i);
    } else {
      logit_rows_.push_back(first_row + n - 1);
    }
  }
  const size_t rows = tokens_.size();
  const LlamaConfig& c = config_;
  x_.grow(rows * c.hidden_size);
  xn_.grow(rows * c.hidden_size);
  qkv_.grow(rows * layers_[0].qkv.out_cols());
  att_.grow(rows * c.q_dim());
  gate_up_.grow(rows * layers_[0].gate_up.out_cols());
  mlp_.grow(rows * c.intermediate_size);
  final_.grow(logit_rows_.size() * c.hidden_size);
}

void CpuRunner::run_layer(int layer) {
  const LlamaConfig& c = config_;
  const Layer& w = layers_[layer];
  const int rows = int(tokens_.size());

  // Attention block: x += o_proj(attention(rope(q), rope(k), v)) over rmsnorm(x).
  const size_t ld_qkv = size_t(w.qkv.out_cols());
  float* q = qkv_.data();
  float* k = q + w.qkv.part_offset(1);
  const float* v = q + w.qkv.part_offset(2);
  cpu::rmsnorm(x_.data(), w.attn_norm.data(), rows, c.hidden_size, c.rms_norm_eps, xn_.data());
  cpu::matmul(xn_.data(), rows, w.qkv, q, ld_qkv);
  cpu::apply_rope(rope_, positions_, c.num_heads, q, ld_qkv);
  cpu::apply_rope(rope_, positions_, c.num_kv_heads, k, ld_qkv);
  const cpu::PagedKvLayer kv = kv_layer(layer);
  for (const cpu::AttentionSequence& s : seqs_) {
    const size_t at = size_t(s.first_row) * ld_qkv;
    cpu::store_kv(kv, s.block_table, s.start_pos, s.num_queries, k + at, v + at, ld_qkv);
  }
  cpu::paged_attention(kv, seqs_, c.num_heads, q, ld_qkv, att_.data());
  cpu::matmul(att_.data(), rows, w.wo, x_.data(), size_t(c.hidden_size), MatmulMode::Accumulate);

  // MLP block: x += down(silu(gate(h)) · up(h)), h = rmsnorm(x).
  const size_t ld_gate_up = size_t(w.gate_up.out_cols());
  cpu::rmsnorm(x_.data(), w.mlp_norm.data(), rows, c.hidden_size, c.rms_norm_eps, xn_.data());
  cpu::matmul(xn_.data(), rows, w.gate_up, gate_up_.data(), ld_gate_up);
  cpu::silu_mul_interleaved(gate_up_.data(), ld_gate_up, rows, c.intermediate_size,
                            cpu::kPanelWidth, mlp_.data());
  cpu::matmul(mlp_.data(), rows, w.down, x_.data(), size_t(c.hidden_size), MatmulMode::Accumulate);
}

// Final norm and lm_head, only on the rows the batch asked logits for.
void CpuRunner::compute_logits(Logits& logits) {
  const int hidden = config_.hidden_size;
  const int rows = int(logit_rows_.size());
  for (int r = 0; r < rows; ++r) {
    std::copy_n(x_.data() + size_t(logit_rows_[r]) * hidden, hidden,
                final_.data() + size_t(r) * hidden);
  }
  cpu::rmsnorm(final_.data(), final_norm_.data(), rows, hidden, config_.rms_norm_eps,
               final_.data());
  logits.vocab = config_.vocab_size;
  logits.argmax.clear();
  logits.data.resize(size_t(rows) * config_.vocab_size);
  cpu::matmul(final_.data(), rows, lm_head_, logits.data.data(), size_t(config_.vocab_size));
}

void CpuRunner::forward(const Batch& batch, Logits& logits) {
  check_batch(batch);
  pack(batch);
  const auto run = [&] {
    if (config_.tie_word_embeddings) {
      cpu::embedding_lookup(lm_head_, tokens_, x_.data());
    } else {
      cpu::embedding_lookup(embed_, tokens_, x_.data());
    }
    for (int layer = 0; layer < config_.num_layers; ++layer) {
      if (wanted_ && !wanted_())
        throw PassAbandoned("the forward pass stopped before layer " + std::to_string(layer) +
                            ": every sequence in it has ended");
      run_layer(layer);
    }
    compute_logits(logits);
    if (batch.argmax_only()) keep_argmaxes_only(logits);
  };
  if (arena_) {
    arena_->execute(run);
  } else {
    run();
  }
}

}  // namespace

std::unique_ptr<ModelRunner> make_cpu_runner(std::shared_ptr<const LlamaWeights> weights,
                                             const RunnerOptions& options) {
  return std::make_unique<CpuRunner>(std::move(weights), options);
}

}  // namespace pipeline

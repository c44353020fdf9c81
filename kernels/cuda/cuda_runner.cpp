// CudaRunner: the LLaMA forward pass on one GPU. Weights live on the device in bf16, the
// residual stream in float32, every other activation in bf16; the KV cache is a paged pool
// [layer][block][slot][kv_head][head_dim] for K and for V.
//
// Per layer: RMSNorm (fused with the previous residual add) -> one fused QKV GEMM -> RoPE and
// KV write (inside the attention kernel for decode) -> paged attention (decode: flash-decoding
// split; prefill: tiled causal) -> output GEMM -> residual add + RMSNorm -> one fused gate/up
// GEMM with SiLU*mul (in its epilogue up to 64 rows) -> down GEMM.
//
// Decode steps (one token per sequence) are captured as a CUDA graph per batch size and
// attention grid (the partition length, and the partitions the longest context needs, rounded
// up) the second time that pair is seen, and replayed afterwards; all inputs reach the graph
// through one packed index buffer at a fixed device address. Prefill runs eagerly.
#include "kernels/cuda/cuda_runner.h"

#include <cuda_runtime.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_objects.h"
#include "kernels/cuda/dependent_launch.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_weights.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernel_choice.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/lru_cache.h"
#include "kernels/cuda/nvtx_ranges.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/step_inputs.h"

namespace pipeline {

bool cuda_device_available(std::string* why) {
  auto fail = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // clear the error so later CUDA calls start clean
    return fail(std::string("cudaGetDeviceCount: ") + cudaGetErrorString(error));
  }
  if (count == 0) return fail("no CUDA device found");
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess)
    return fail("cudaGetDeviceProperties failed for device 0");
  if (prop.major < 8)
    return fail(std::string(prop.name) + " has compute capability " + std::to_string(prop.major) +
                "." + std::to_string(prop.minor) + "; bf16 kernels need 8.0 or newer");
  return true;
}

namespace cuda {
namespace {

double gib(size_t bytes) {
  return double(bytes) / double(size_t(1) << 30);
}

std::string gib_string(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", gib(bytes));
  return text;
}

// The prompt tokens a runner's buffers hold from the start, and its warm-up prefill.
constexpr int kWarmUpTokens = 512;

// The contexts choose_decode_attention() times the decode attention kernels at: the decode
// benchmark's (bench_cuda_decode), where attention is a third to two thirds of a 7B step.
constexpr int kAttentionTimingContext = 1024;

// The environment variable that sets the decode attention kernel instead of the warm-up's
// timing ("direct" or "pipelined"): to run tests, sanitizers or a benchmark on one of them.
constexpr const char* kDecodeAttentionVariable = "PIPELINE_CUDA_DECODE_ATTENTION";

std::optional<DecodeAttentionKernel> decode_attention_from_environment() {
  return kernel_from_environment(kDecodeAttentionVariable, kDecodeAttentionKernels,
                                 decode_attention_kernel_name, "decode attention kernel");
}

// Captured decode steps kept at once. A key is (batch size, attention grid): a serve
// whose batches grow to 64 sequences over 4K-token contexts meets hundreds of them, while the
// steps of any one stretch of serving, their batches within a few sequences of each other, use
// a few dozen. The least recently replayed graph goes first; a graph being replayed when it
// goes is freed once it completes.
constexpr size_t kMaxDecodeGraphs = 256;

int round_up_pow2(int n) {
  return int(std::bit_ceil(unsigned(std::max(n, 1))));
}

// After `failure`: waits for what was queued on `stream` before it (it may still read the
// pinned step inputs that the next pass rewrites), then throws a RunnerFailure naming `failure`
// if the CUDA context took a "sticky" error, which every later call returns too (an illegal
// address or a kernel's trap, say): then no pass can run until the process exits. A failure
// that leaves the context usable (an allocation, a launch's configuration) is cleared here, so
// that the next step runs.
void throw_if_context_lost(cudaStream_t stream, const std::string& failure) {
  cudaStreamSynchronize(stream);
  (void)cudaGetLastError();
  if (cudaDeviceSynchronize() != cudaSuccess)
    throw RunnerFailure(failure + "; the CUDA context is unusable from now on");
}

// dst = src[0, count). A step's logits are megabytes at large batches (8 MB for 64 sequences of
// a 32,000-word vocabulary), which one core copies in about half a millisecond; slices of
// 64 KiB on several cores move them at the memory's pace instead.
void copy_out(const float* src, size_t count, std::vector<float>& dst) {
  constexpr size_t kSlice = size_t(16) << 10;  // floats
  dst.resize(count);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, count, kSlice),
                    [&](const tbb::blocked_range<size_t>& r) {
                      std::copy(src + r.begin(), src + r.end(), dst.data() + r.begin());
                    });
}

// A decode step's attention grid: partitions of `partition` positions, `splits` per sequence.
struct DecodeGrid {
  int partition = 0;
  int splits = 0;
};

// What a captured decode step is kept under: its batch size and attention grid.
using DecodeKey = std::tuple<int, int, int>;  // (sequences, partition, splits)

// Device buffers of one forward pass, sized for a StepCapacity.
struct Workspace {
  Workspace(const LlamaConfig& c, const StepCapacity& cap, int max_blocks_per_seq, int max_splits,
            cudaStream_t stream)
      : capacity(cap),
        layout(cap, max_blocks_per_seq, kPrefillTileQueries),
        indices(layout.total),
        residual(size_t(cap.tokens) * c.hidden_size),
        normed(size_t(cap.tokens) * c.hidden_size),
        qkv(size_t(cap.tokens) * (c.q_dim() + 2 * c.kv_dim())),
        attn(size_t(cap.tokens) * c.q_dim()),
        proj(size_t(cap.tokens) * c.hidden_size),
        gate_up(size_t(cap.tokens) * 2 * c.intermediate_size),
        act(size_t(cap.tokens) * c.intermediate_size),
        logits(size_t(cap.logit_rows) * c.vocab_size),
        argmax(size_t(cap.logit_rows)),
        decode(cap.seqs, c.num_heads, c.num_kv_heads, c.head_dim, max_splits, stream) {}

  StepCapacity capacity;
  StepLayout layout;
  DeviceBuffer<int32_t> indices;   // the packed StepLayout arrays
  DeviceBuffer<float> residual;    // [tokens, hidden]
  DeviceBuffer<bf16> normed;       // [tokens, hidden]
  DeviceBuffer<bf16> qkv;          // [tokens, q_dim + 2 * kv_dim]
  DeviceBuffer<bf16> attn;         // [tokens, q_dim]
  DeviceBuffer<bf16> proj;         // [tokens, hidden]: attention output and MLP down projection
  DeviceBuffer<bf16> gate_up;      // [tokens, 2 * intermediate]
  DeviceBuffer<bf16> act;          // [tokens, intermediate]
  DeviceBuffer<float> logits;      // [logit_rows, vocab]
  DeviceBuffer<RowArgmax> argmax;  // [logit_rows]: each row's, for an argmax_only() batch
  DecodeScratch decode;            // the decode attention's split partials

  const int32_t* index(size_t offset) const { return indices.data() + offset; }
};

class CudaRunner final : public ModelRunner {
 public:
  CudaRunner(std::shared_ptr<const LlamaWeights> weights, const RunnerOptions& options);
  ~CudaRunner() override;

  const LlamaConfig& config() const override { return config_; }
  const KvCacheShape& kv_shape() const override { return kv_shape_; }
  std::string device_name() const override { return "cuda"; }
  std::vector<std::string> setup_report() const override { return setup_report_; }
  void forward(const Batch& batch, Logits& logits) override;

 private:
  void warm_up(int max_num_seqs);
  void tune_projections();
  void choose_decode_attention(int max_num_seqs);
  std::string time_decode_attention(int seqs);
  DecodeAttentionKernel decode_attention_for(int seqs) const;
  void ensure_capacity(int tokens, int seqs, int logit_rows);
  // Replaces the workspace and pinned buffers with ones of `capacity` (captured graphs go too).
  void allocate_workspace(const StepCapacity& capacity);
  // Queues the copy of the step inputs pack_step() wrote into staging_ to the workspace.
  void upload_step_inputs(const StepShape& shape);
  DecodeGrid decode_grid(const StepShape& shape) const;
  void run_decode(const StepShape& shape);
  void enqueue_forward(const StepShape& shape);
  // grid: a decode step's (decode_grid); unused for prefill.
  // kernel: a decode step's (decode_attention_for); unused for prefill.
  void enqueue_attention(const StepShape& shape, const DecodeGrid& grid,
                         DecodeAttentionKernel kernel, int layer);
  // The first element of `layer`'s share of a KV pool (k_cache_ or v_cache_).
  bf16* layer_kv(const DeviceBuffer<bf16>& pool, int layer) const {
    return pool.data() + size_t(layer) * kv_shape_.num_blocks * kv_shape_.block_elems();
  }

  std::shared_ptr<const LlamaWeights> weights_;
  LlamaConfig config_;
  KvCacheShape kv_shape_;
  int max_blocks_per_seq_ = 0;
  int max_splits_ = 0;
  int multiprocessors_ = 0;
  // Batch size -> the decode attention kernel choose_decode_attention() found faster there.
  std::map<int, DecodeAttentionKernel> decode_attention_;
  Stream stream_;
  Gemm gemm_;
  DeviceWeights device_weights_;
  DeviceBuffer<bf16> k_cache_, v_cache_;
  std::unique_ptr<Workspace> workspace_;
  PinnedBuffer<int32_t> staging_;           // host image of workspace_->indices
  PinnedBuffer<float> logits_staging_;      // host landing of workspace_->logits
  PinnedBuffer<RowArgmax> argmax_staging_;  // host landing of workspace_->argmax
  // (batch size, decode_grid) -> eager runs, and the captured step (null: capture failed).
  std::map<DecodeKey, int> decode_sightings_;
  LruCache<DecodeKey, std::unique_ptr<GraphExec>> decode_graphs_{kMaxDecodeGraphs};
  std::vector<std::string> setup_report_;  // what warm_up() measured and chose
};

void check_options(const RunnerOptions& o) {
  check_runner_options(o);
  if (o.kv_cache_dtype && *o.kv_cache_dtype != DType::BF16)
    throw std::invalid_argument(std::string("the CUDA backend keeps its KV cache in BF16, not ") +
                                dtype_name(*o.kv_cache_dtype) +
                                " (scheduler.kv_cache_dtype: auto or bf16, or device: cpu)");
  if (o.matmul_activations != DType::BF16)
    throw std::invalid_argument(std::string("the CUDA backend multiplies BF16 activations, not ") +
                                dtype_name(o.matmul_activations) +
                                " (model.matmul_activations: bf16, or device: cpu)");
}

const LlamaConfig& checked_config(const LlamaWeights* weights) {
  if (!weights) throw std::invalid_argument("make_cuda_runner: no weights");
  const LlamaConfig& c = weights->config;
  std::string why;
  if (!attention_supports(c.num_heads, c.num_kv_heads, c.head_dim, &why) ||
      !hidden_size_supported(c.hidden_size, &why))
    throw std::runtime_error("CUDA backend cannot run this model: " + why);
  if (c.max_position_embeddings <= 0)
    throw std::runtime_error("CUDA backend needs a positive max_position_embeddings");
  return c;
}

CudaRunner::CudaRunner(std::shared_ptr<const LlamaWeights> weights, const RunnerOptions& options)
    : weights_(std::move(weights)),
      config_(checked_config(weights_.get())),
      stream_(),
      gemm_(stream_.get()) {
  check_options(options);
  const LlamaConfig& c = config_;
  max_blocks_per_seq_ =
      (c.max_position_embeddings + options.kv_block_size - 1) / options.kv_block_size;
  // Sized for kDecodePartition: the short partitions serve only contexts that fit (see
  // decode_partition), so that they cost the KV cache no memory.
  max_splits_ = (c.max_position_embeddings + kDecodePartition - 1) / kDecodePartition;
  multiprocessors_ = multiprocessor_count();

  size_t free_bytes = 0, total_bytes = 0;
  PIPELINE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t weight_bytes = device_weight_bytes(*weights_);
  if (weight_bytes + upload_scratch_bytes(c) >= free_bytes)
    throw std::runtime_error("model does not fit on the GPU: its bf16 weights need " +
                             gib_string(weight_bytes) + " (and " +
                             gib_string(upload_scratch_bytes(c)) +
                             " more while they upload), the device has " + gib_string(free_bytes) +
                             " free of " + gib_string(total_bytes));
  {
    NvtxRange range{"upload_weights"};
    device_weights_ = upload_weights(*weights_, stream_.get());
  }
  // Buffers for the largest pass the scheduler will send, before the KV cache takes its share
  // of what is left: grown later, they could find the device full in the middle of serving.
  // Exactly that pass, not rounded up: every token of room is about 130 KB for a 7B model,
  // which the KV cache would otherwise hold.
  const int initial_seqs = std::max(options.max_num_seqs, 1);
  const int pass_tokens = std::max({kWarmUpTokens, initial_seqs, options.max_pass_tokens});
  try {
    allocate_workspace(
        {pass_tokens, initial_seqs, std::max(initial_seqs, options.max_pass_logit_rows)});
  } catch (const std::exception& e) {
    throw std::runtime_error(
        "model does not fit on the GPU: after " + gib_string(weight_bytes) +
        " of weights, the buffers of a forward pass of " + std::to_string(pass_tokens) +
        " tokens (scheduler.max_prefill_tokens plus max_num_seqs) do not: " + e.what());
  }

  kv_shape_.num_layers = c.num_layers;
  kv_shape_.num_kv_heads = c.num_kv_heads;
  kv_shape_.head_dim = c.head_dim;
  kv_shape_.block_size = options.kv_block_size;
  kv_shape_.dtype = DType::BF16;
  const size_t block_bytes =
      2 * size_t(c.num_layers) * size_t(kv_shape_.block_elems()) * sizeof(bf16);  // K and V
  PIPELINE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  size_t blocks = options.kv_cache_blocks > 0
                      ? size_t(options.kv_cache_blocks)
                      : size_t(double(free_bytes) * options.kv_cache_fraction) / block_bytes;
  if (blocks == 0 || blocks * block_bytes > free_bytes)
    throw std::runtime_error(
        "model does not fit on the GPU: after " + gib_string(weight_bytes) + " of weights, " +
        gib_string(free_bytes) + " free cannot hold " +
        (options.kv_cache_blocks > 0 ? std::to_string(options.kv_cache_blocks) : "one") +
        " KV block(s) of " + gib_string(block_bytes));
  // Slots are int32 (block * block_size + offset).
  blocks = std::min(blocks, size_t(std::numeric_limits<int32_t>::max() / options.kv_block_size));
  kv_shape_.num_blocks = int(blocks);
  const size_t cache_elems = size_t(c.num_layers) * blocks * size_t(kv_shape_.block_elems());
  k_cache_ = DeviceBuffer<bf16>(cache_elems);
  v_cache_ = DeviceBuffer<bf16>(cache_elems);
  warm_up(initial_seqs);
}

// The first call of each kernel loads its module, and cuBLAS chooses an algorithm for each new
// shape: the last H200 run's first prefill (16 prompts of 32 tokens) took 176 ms where the
// arithmetic needs ~15. So before serving, one prefill of kWarmUpTokens and a decode step for
// each projection path, up to the sequences the runner was made for. They write only into the first
// KV blocks, which no sequence reads before writing its own keys there.
void CudaRunner::warm_up(int max_num_seqs) {
  NvtxRange range{"warm_up"};
  const int block_size = kv_shape_.block_size;
  const int prompt =
      std::min({kWarmUpTokens, kv_shape_.num_blocks * block_size, config_.max_position_embeddings});
  SequenceChunk prefill{std::vector<int32_t>(size_t(prompt), 0), 0, {}, false};
  for (int b = 0; b * block_size < prompt; ++b) prefill.block_table.push_back(b);
  Logits logits;
  forward(Batch{{prefill}}, logits);
  tune_projections();  // on the activations the prefill left, not on zeros
  choose_decode_attention(max_num_seqs);
  setup_report_.push_back(std::string("programmatic dependent launch ") +
                          (dependent_launch_supported() ? "on" : "off") +
                          " (kernels from compute_" + std::to_string(kernel_ptx_architecture()) +
                          ")");
  // One row: the GEMV; 2, 9, 17, 33: SkinnyGemm's builds for up to 8, 16, 32, 64 rows (or
  // a cuBLAS algorithm where one was faster); more: cuBLAS.
  for (int seqs : {1, 2, 9, 17, 33, kSkinnyMaxRows + 1}) {
    if (seqs > max_num_seqs) break;
    // Each sequence writes its token into a block of its own where the pool has enough (else
    // some share one, writing the same bits: token 0 at position 0).
    std::vector<SequenceChunk> step;
    for (int s = 0; s < seqs; ++s)
      step.push_back(SequenceChunk{{0}, 0, {s % kv_shape_.num_blocks}, false});
    forward(Batch{std::move(step)}, logits);
  }
  decode_sightings_.clear();  // serving captures its own graphs, as if from a cold start
}

// SkinnyGemm, cuBLAS's own choice and cuBLASLt's proposals, timed on each projection's shape at
// each SkinnyGemm build's row count; Gemm sends those calls to the fastest from now on. Each
// layer's matrix in turn, so the weights come from memory as in a forward pass.
void CudaRunner::tune_projections() {
  NvtxRange range{"tune_projections"};
  const LlamaConfig& c = config_;
  Workspace& ws = *workspace_;
  const int rows = std::min(kSkinnyMaxRows, ws.capacity.tokens);
  std::vector<const bf16*> wqkv, wo, w_gate_up, w_down;
  for (const DeviceLayer& layer : device_weights_.layers) {
    wqkv.push_back(layer.wqkv.data());
    wo.push_back(layer.wo.data());
    w_gate_up.push_back(layer.w_gate_up.data());
    w_down.push_back(layer.w_down.data());
  }
  const int H = c.hidden_size, I = c.intermediate_size;
  const int qkv_dim = c.q_dim() + 2 * c.kv_dim();
  auto tune = [&](const char* name, Gemm::Product product, const bf16* x,
                  const std::vector<const bf16*>& weights, void* y, int in, int out, int max_rows) {
    const std::string report =
        gemm_.tune(product, x, weights, y, ws.gate_up.data(), in, out, max_rows);
    if (!report.empty())
      setup_report_.push_back(std::string(name) + " " + std::to_string(out) + "x" +
                              std::to_string(in) + ": " + report);
  };
  tune("qkv", Gemm::Product::bf16, ws.normed.data(), wqkv, ws.qkv.data(), H, qkv_dim, rows);
  tune("o", Gemm::Product::bf16, ws.attn.data(), wo, ws.proj.data(), c.q_dim(), H, rows);
  tune("gate_up", Gemm::Product::silu_mul, ws.normed.data(), w_gate_up, ws.act.data(), H, 2 * I,
       rows);
  tune("down", Gemm::Product::bf16, ws.act.data(), w_down, ws.proj.data(), I, H, rows);
  tune("lm_head", Gemm::Product::f32, ws.normed.data(), {device_weights_.lm_head}, ws.logits.data(),
       H, c.vocab_size, std::min(rows, ws.capacity.logit_rows));
}

// Which decode attention kernel a step runs (DecodeAttentionKernel), by its batch size: the
// faster on one layer's attention of a step of 1, 16 and 64 sequences and of the largest batch
// the runner was made for (up to 64), each up to that largest batch; a step of n sequences runs
// the choice of the smallest of these batches that holds n (of the largest, past it).
void CudaRunner::choose_decode_attention(int max_num_seqs) {
  NvtxRange range{"choose_decode_attention"};
  if (const std::optional<DecodeAttentionKernel> forced = decode_attention_from_environment()) {
    decode_attention_[1] = *forced;
    setup_report_.push_back(std::string("decode attention: ") +
                            decode_attention_kernel_name(*forced) + ", set by " +
                            kDecodeAttentionVariable);
    return;
  }
  const int largest = std::min({max_num_seqs, kSkinnyMaxRows, workspace_->capacity.seqs});
  std::string report = "decode attention: ";
  for (int seqs : {1, 16, 64}) {
    if (seqs >= largest) break;
    report.append(time_decode_attention(seqs)).append("; ");
  }
  setup_report_.push_back(report.append(time_decode_attention(largest)));
}

// Times both decode attention kernels on one layer's attention of a decode step of `seqs`
// sequences, each at kAttentionTimingContext positions or what the KV pool holds for them, each
// call on the next layer's cache so that the keys and values come from memory, and keeps the
// faster for that batch size (direct where neither could be timed). Before serving no sequence
// owns a block, so the step's new tokens may be written anywhere. Returns what it measured.
std::string CudaRunner::time_decode_attention(int seqs) {
  decode_attention_[seqs] = DecodeAttentionKernel::direct;
  Workspace& ws = *workspace_;
  const int block_size = kv_shape_.block_size;
  const int context = std::min({kAttentionTimingContext, kv_shape_.num_blocks / seqs * block_size,
                                config_.max_position_embeddings});
  const std::string what =
      "batch " + std::to_string(seqs) + " at " + std::to_string(context) + " positions";
  if (context < kDecodePartition)
    return what + ": direct, untimed (" + std::to_string(kv_shape_.num_blocks) + " KV blocks of " +
           std::to_string(block_size) + ", max_position_embeddings " +
           std::to_string(config_.max_position_embeddings) + ")";
  Batch batch;
  const int blocks_per_seq = (context + block_size - 1) / block_size;
  for (int s = 0; s < seqs; ++s) {
    SequenceChunk seq{{0}, context - 1, {}, false};
    for (int b = 0; b < blocks_per_seq; ++b) seq.block_table.push_back(s * blocks_per_seq + b);
    batch.seqs.push_back(std::move(seq));
  }
  const StepShape shape = pack_step(batch, ws.layout, block_size, staging_.data());
  upload_step_inputs(shape);
  const DecodeGrid grid = decode_grid(shape);
  auto time_kernel = [&](DecodeAttentionKernel kernel) {
    return milliseconds_per_call(stream_.get(), [&](int i) {
      enqueue_attention(shape, grid, kernel, i % config_.num_layers);
    });
  };
  float direct_ms = 0.0f, pipelined_ms = 0.0f;
  try {
    direct_ms = time_kernel(DecodeAttentionKernel::direct);
    pipelined_ms = time_kernel(DecodeAttentionKernel::pipelined);
  } catch (const std::runtime_error& e) {
    throw_if_context_lost(stream_.get(),
                          std::string("timing the decode attention kernels: ") + e.what());
    // A timing that cannot run (its capture failed, say) leaves the direct kernel, as
    // Gemm::tune() leaves SkinnyGemm.
    return what + ": not timed (" + e.what() + ") -> direct";
  }
  const DecodeAttentionKernel faster =
      pipelined_ms < direct_ms ? DecodeAttentionKernel::pipelined : DecodeAttentionKernel::direct;
  decode_attention_[seqs] = faster;
  char times[128];
  std::snprintf(times, sizeof times,
                " in partitions of %d: direct %.1f us, pipelined %.1f us -> %s", grid.partition,
                1e3f * direct_ms, 1e3f * pipelined_ms, decode_attention_kernel_name(faster));
  return what + times;
}

DecodeAttentionKernel CudaRunner::decode_attention_for(int seqs) const {
  if (decode_attention_.empty()) return DecodeAttentionKernel::direct;
  const auto holding = decode_attention_.lower_bound(seqs);
  return holding != decode_attention_.end() ? holding->second : decode_attention_.rbegin()->second;
}

CudaRunner::~CudaRunner() {
  cudaStreamSynchronize(stream_.get());  // no work may outlive the buffers it uses
  decode_graphs_.clear();
}

void CudaRunner::ensure_capacity(int tokens, int seqs, int logit_rows) {
  if (workspace_ && tokens <= workspace_->capacity.tokens && seqs <= workspace_->capacity.seqs &&
      logit_rows <= workspace_->capacity.logit_rows)
    return;
  // Beyond what the constructor sized them for: grown by powers of two, so that a few growths
  // cover any pass.
  StepCapacity grown{round_up_pow2(tokens), round_up_pow2(seqs), round_up_pow2(logit_rows)};
  if (workspace_) {
    grown.tokens = std::max(grown.tokens, workspace_->capacity.tokens);
    grown.seqs = std::max(grown.seqs, workspace_->capacity.seqs);
    grown.logit_rows = std::max(grown.logit_rows, workspace_->capacity.logit_rows);
  }
  allocate_workspace(grown);
}

void CudaRunner::allocate_workspace(const StepCapacity& capacity) {
  // Captured graphs point into the old buffers. The old buffers go before the new ones come
  // (device memory may not hold both), and the new ones are kept only all together: after a
  // failed allocation no workspace is left, so the next step allocates again, rather than a
  // larger workspace beside host buffers sized for the old one.
  decode_graphs_.clear();
  decode_sightings_.clear();
  workspace_.reset();
  staging_ = {};
  logits_staging_ = {};
  argmax_staging_ = {};
  auto workspace = std::make_unique<Workspace>(config_, capacity, max_blocks_per_seq_, max_splits_,
                                               stream_.get());
  PinnedBuffer<int32_t> staging(workspace->layout.total);
  PinnedBuffer<float> logits_staging(workspace->logits.size());
  PinnedBuffer<RowArgmax> argmax_staging(workspace->argmax.size());
  workspace_ = std::move(workspace);
  staging_ = std::move(staging);
  logits_staging_ = std::move(logits_staging);
  argmax_staging_ = std::move(argmax_staging);
}

void CudaRunner::upload_step_inputs(const StepShape& shape) {
  PIPELINE_CUDA_CHECK(cudaMemcpyAsync(workspace_->indices.data(), staging_.data(),
                                      shape.packed_elements * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream_.get()));
}

void CudaRunner::forward(const Batch& batch, Logits& logits) {
  validate_batch(batch, config_, kv_shape_);
  ensure_capacity(batch.total_tokens(), int(batch.seqs.size()), batch.logit_rows());
  Workspace& ws = *workspace_;
  const StepShape shape = pack_step(batch, ws.layout, kv_shape_.block_size, staging_.data());
  cudaStream_t stream = stream_.get();
  const bool argmax_only = batch.argmax_only();
  const size_t count = size_t(shape.logit_rows) * (argmax_only ? 1 : config_.vocab_size);
  try {
    upload_step_inputs(shape);
    if (shape.decode) {
      run_decode(shape);
    } else {
      enqueue_forward(shape);
    }
    // Through pinned memory: a direct copy into pageable memory is staged by the driver at a
    // fraction of the bus speed, and a step's logits are megabytes at large batches.
    if (argmax_only) {
      PIPELINE_CUDA_CHECK(cudaMemcpyAsync(argmax_staging_.data(), ws.argmax.data(),
                                          count * sizeof(RowArgmax), cudaMemcpyDeviceToHost,
                                          stream));
    } else {
      PIPELINE_CUDA_CHECK(cudaMemcpyAsync(logits_staging_.data(), ws.logits.data(),
                                          count * sizeof(float), cudaMemcpyDeviceToHost, stream));
    }
    PIPELINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (const std::exception& e) {
    // What was queued before the failure still reads staging_ and writes the KV cache: it must
    // be done before the next step rewrites them. Its own error, if any, is the one thrown.
    throw_if_context_lost(stream, e.what());
    throw;
  }
  logits.vocab = config_.vocab_size;
  if (argmax_only) {
    logits.data.clear();
    logits.argmax.assign(argmax_staging_.data(), argmax_staging_.data() + count);
  } else {
    logits.argmax.clear();
    copy_out(logits_staging_.data(), count, logits.data);
  }
}

// The decode attention's partitions (see decode_partition) and how many are launched per
// sequence: enough for the longest context, rounded up (to a power of two up to 4, then to a
// multiple of 4) so that few graphs cover every length and few blocks find nothing to do.
DecodeGrid CudaRunner::decode_grid(const StepShape& shape) const {
  const int partition = decode_partition(shape.seqs, config_.num_kv_heads, shape.max_context,
                                         multiprocessors_, max_splits_);
  const int needed = (shape.max_context + partition - 1) / partition;
  const int rounded = needed <= 4 ? round_up_pow2(needed) : (needed + 3) / 4 * 4;
  return {partition, std::min(rounded, max_splits_)};
}

// First sight of a (batch size, attention grid) pair runs eagerly; the second captures the step
// into a graph; later ones replay it. Pairs seen once (the tail of a draining batch) never pay for
// a capture. A pair whose capture failed (no memory left to instantiate it, say) runs eagerly
// from then on: the graph saves launch time, and its absence fails nothing. A pair whose graph
// was dropped to make room (kMaxDecodeGraphs) is captured again when it next comes.
void CudaRunner::run_decode(const StepShape& shape) {
  cudaStream_t stream = stream_.get();
  const DecodeGrid grid = decode_grid(shape);
  const DecodeKey key{shape.seqs, grid.partition, grid.splits};
  std::unique_ptr<GraphExec>* graph = decode_graphs_.find(key);
  if (graph == nullptr) {
    if (++decode_sightings_[key] < 2) {
      enqueue_forward(shape);
      return;
    }
    std::unique_ptr<GraphExec> captured;
    try {
      captured = capture_graph(stream, [&] { enqueue_forward(shape); });
    } catch (const std::runtime_error&) {  // a CUDA or cuBLAS error (cuda_check.h)
      (void)cudaGetLastError();            // the capture's error is not the step's
    }
    graph = &decode_graphs_.insert(key, std::move(captured));
  }
  if (!*graph) {
    enqueue_forward(shape);
    return;
  }
  NvtxRange range{"decode_graph"};
  (*graph)->launch(stream);
}

void CudaRunner::enqueue_forward(const StepShape& shape) {
  const LlamaConfig& c = config_;
  Workspace& ws = *workspace_;
  const StepLayout& at = ws.layout;
  cudaStream_t stream = stream_.get();
  const int T = shape.tokens, H = c.hidden_size, I = c.intermediate_size;
  const int qkv_dim = c.q_dim() + 2 * c.kv_dim();
  const DecodeGrid grid = shape.decode ? decode_grid(shape) : DecodeGrid{};
  const DecodeAttentionKernel attention = decode_attention_for(shape.seqs);
  {
    NvtxRange range{"embedding"};
    embedding_gather(device_weights_.embed.data(), ws.index(at.token_ids), T, H, ws.residual.data(),
                     stream);
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const DeviceLayer& w = device_weights_.layers[l];
    {
      NvtxRange range{"attention"};
      // The first layer normalises the embedding; later ones first add the previous MLP output.
      add_rmsnorm(ws.residual.data(), l == 0 ? nullptr : ws.proj.data(), w.attn_norm.data(),
                  nullptr, T, H, c.rms_norm_eps, ws.normed.data(), stream);
      gemm_.linear(ws.normed.data(), w.wqkv.data(), ws.qkv.data(), T, H, qkv_dim);
      if (!shape.decode) {  // the decode attention rotates and appends its new tokens itself
        rope_write_kv(ws.qkv.data(), T, ws.index(at.positions), ws.index(at.slots), c.num_heads,
                      c.num_kv_heads, c.head_dim, c.rope_theta, layer_kv(k_cache_, l),
                      layer_kv(v_cache_, l), stream);
      }
      enqueue_attention(shape, grid, attention, l);
      gemm_.linear(ws.attn.data(), w.wo.data(), ws.proj.data(), T, c.q_dim(), H);
    }
    {
      NvtxRange range{"mlp"};
      add_rmsnorm(ws.residual.data(), ws.proj.data(), w.mlp_norm.data(), nullptr, T, H,
                  c.rms_norm_eps, ws.normed.data(), stream);
      gemm_.linear_silu_mul(ws.normed.data(), w.w_gate_up.data(), ws.gate_up.data(), ws.act.data(),
                            T, H, I);
      gemm_.linear(ws.act.data(), w.w_down.data(), ws.proj.data(), T, I, H);
    }
  }
  {
    NvtxRange range{"lm_head"};
    // Only the rows that return logits go through the final norm and the vocabulary projection.
    add_rmsnorm(ws.residual.data(), ws.proj.data(), device_weights_.final_norm.data(),
                ws.index(at.logit_rows), shape.logit_rows, H, c.rms_norm_eps, ws.normed.data(),
                stream);
    gemm_.linear_f32(ws.normed.data(), device_weights_.lm_head, ws.logits.data(), shape.logit_rows,
                     H, c.vocab_size);
  }
  NvtxRange range{"sampling"};
  // Every pass, so that one captured step serves batches that want rows and ones that want
  // only the argmaxes; forward() copies back one or the other.
  logits_argmax(ws.logits.data(), shape.logit_rows, c.vocab_size, ws.argmax.data(), stream);
}

void CudaRunner::enqueue_attention(const StepShape& shape, const DecodeGrid& grid,
                                   DecodeAttentionKernel kernel, int layer) {
  const LlamaConfig& c = config_;
  Workspace& ws = *workspace_;
  const StepLayout& at = ws.layout;
  bf16* k_layer = layer_kv(k_cache_, layer);
  bf16* v_layer = layer_kv(v_cache_, layer);
  PagedKv kv;
  kv.k = k_layer;
  kv.v = v_layer;
  kv.block_tables = ws.index(at.block_tables);
  kv.max_blocks_per_seq = max_blocks_per_seq_;
  kv.block_size = kv_shape_.block_size;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  const int qkv_dim = c.q_dim() + 2 * c.kv_dim();
  if (shape.decode) {
    const DecodeNewTokens fresh{ws.index(at.positions), ws.index(at.slots), c.rope_theta, k_layer,
                                v_layer};
    paged_decode_attention(ws.qkv.data(), qkv_dim, kv, fresh, ws.index(at.context_lens), shape.seqs,
                           c.num_heads, grid.partition, grid.splits, kernel, ws.decode,
                           ws.attn.data(), stream_.get());
  } else {
    prefill_attention(ws.qkv.data(), qkv_dim, kv, ws.index(at.tiles), shape.tiles,
                      ws.index(at.q_offsets), ws.index(at.q_lens), ws.index(at.start_positions),
                      c.num_heads, ws.attn.data(), stream_.get());
  }
}

}  // namespace
}  // namespace cuda

std::unique_ptr<ModelRunner> make_cuda_runner(std::shared_ptr<const LlamaWeights> weights,
                                              const RunnerOptions& options) {
  std::string why;
  if (!cuda_device_available(&why)) throw std::runtime_error("CUDA backend unavailable: " + why);
  PIPELINE_CUDA_CHECK(cudaSetDevice(0));
  return std::make_unique<cuda::CudaRunner>(std::move(weights), options);
}

}  // namespace pipeline

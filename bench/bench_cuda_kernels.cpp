// The CUDA decode step's parts alone, on LLaMA-2-7B's shapes: each projection as the runner does
// it before tuning (1 row: the GEMV kernel; 4, 16, 32 and 64: SkinnyGemm), after its warm-up's
// tuning (the fastest of SkinnyGemm, cuBLAS and cuBLASLt's proposals) and by cuBLAS itself at 4,
// 16, 32 and 64 rows; paged decode attention over 1024-token contexts at batch 1, 16 and 64. Their
// sum over 32 layers against `bench_cuda_decode`'s step time says where a step goes.
//
// Operands are random bf16; each call reads the next copy of its weights (or the next layer's
// KV) from a pool of at least 1 GiB, so they come from device memory as in a real step, not
// from the 60 MB L2. Times come from CUDA events around 20 calls, so a launch's latency is
// amortised as in a captured graph.
//
// Counters: GB/s (weight or KV bytes read per second), bw_floor (bytes moved / the device's
// copy bandwidth, measured in this process, / the time: 1.0 is the bandwidth floor) and, for
// the projections, TFLOP/s.
#include <benchmark/benchmark.h>

#ifdef PIPELINE_HAVE_CUDA
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_probes.h"
#include "kernels/cuda/cuda_objects.h"
#include "kernels/cuda/cuda_runner.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/skinny_gemm.h"

namespace pipeline::bench {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

// LLaMA-2-7B.
constexpr int kHidden = 4096;
constexpr int kHeads = 32;
constexpr int kHeadDim = 128;
constexpr int kMaxPositions = 4096;
constexpr int kBlockSize = 16;
constexpr int kContext = 1024;

constexpr size_t kPoolBytes = size_t(1) << 30;
constexpr int kCallsPerIteration = 20;

// The device, its stream and copy bandwidth, set up once for every benchmark.
struct Device {
  std::string skip_reason;  // non-empty: no benchmark can run here
  double bandwidth = 0.0;   // bytes/s
  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::Gemm> gemm;
};

Device make_device() {
  Device d;
  std::string why;
  if (!cuda_device_available(&why)) {
    d.skip_reason = "no CUDA device: " + why;
    return d;
  }
  d.bandwidth = measure_device_bandwidth();
  PIPELINE_CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
  d.gemm = std::make_unique<cuda::Gemm>(d.stream);
  return d;
}

Device& device() {
  static Device d = make_device();
  return d;
}

// Times `call(i)` for i = 0, 1, 2, ... kCallsPerIteration calls per iteration between two events
// and reports the time of one call.
template <typename Call>
void time_calls(benchmark::State& state, cudaStream_t stream, Call call) {
  cudaEvent_t start, stop;
  PIPELINE_CUDA_CHECK(cudaEventCreate(&start));
  PIPELINE_CUDA_CHECK(cudaEventCreate(&stop));
  int next = 0;
  for (int i = 0; i < 3; ++i) call(next++);  // warm-up: cuBLAS picks and loads its kernels
  for (auto _ : state) {
    PIPELINE_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int c = 0; c < kCallsPerIteration; ++c) call(next++);
    PIPELINE_CUDA_CHECK(cudaEventRecord(stop, stream));
    PIPELINE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    PIPELINE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(double(ms) * 1e-3 / kCallsPerIteration);
  }
  PIPELINE_CUDA_CHECK(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

// The runner's Gemm (runner_silu_mul: its gate/up call, SiLU*mul of the column pairs included)
// before any tuning, the same after Gemm::tune() on this shape (tuned, tuned_silu_mul), or its
// cublasGemmEx path at any row count.
enum class Path { runner, runner_silu_mul, tuned, tuned_silu_mul, cublas };

// A Gemm of its own, tuned on this projection's shape up to the SkinnyGemm build of `rows` with
// each of `weights` in turn, as the runner's warm-up tunes: so the benchmark times the route a
// decode step of `rows` sequences takes. Its label is that route, then (after " | ") what the
// tuning measured at that build.
std::unique_ptr<cuda::Gemm> tuned_gemm(benchmark::State& state, cudaStream_t stream, bool silu_mul,
                                       const std::vector<const bf16*>& weights, int rows, int in,
                                       int out) {
  auto gemm = std::make_unique<cuda::Gemm>(stream);
  const int build = cuda::skinny_build_rows(rows);
  DeviceBuffer<bf16> x(size_t(build) * in), y(size_t(build) * out), act(size_t(build) * out / 2);
  fill_random_bf16(x.data(), x.size(), 1.0f, 7);
  using Product = cuda::Gemm::Product;
  const Product product = silu_mul ? Product::silu_mul : Product::bf16;
  const std::string report =
      silu_mul ? gemm->tune(product, x.data(), weights, act.data(), y.data(), in, out, build)
               : gemm->tune(product, x.data(), weights, y.data(), nullptr, in, out, build);
  const size_t last = report.rfind("; ");
  state.SetLabel(gemm->route_name(product, rows, in, out) + " | " +
                 report.substr(last == std::string::npos ? 0 : last + 2));
  return gemm;
}

// y [rows, out] = x [rows, in] . W^T for one of the 7B projections, W [out, in] rotating through
// copies filling at least kPoolBytes.
void BM_CudaProjection(benchmark::State& state, int out, int in, Path path) {
  Device& d = device();
  if (!d.skip_reason.empty()) {
    state.SkipWithError(d.skip_reason.c_str());
    return;
  }
  const int rows = int(state.range(0));
  const size_t weight_elems = size_t(out) * in;
  const size_t copies = std::max<size_t>(2, kPoolBytes / (weight_elems * sizeof(bf16)) + 1);
  DeviceBuffer<bf16> weights(copies * weight_elems), x(size_t(rows) * in), y(size_t(rows) * out);
  DeviceBuffer<bf16> act(size_t(rows) * out / 2);
  fill_random_bf16(weights.data(), weights.size(), 0.02f, 1);
  fill_random_bf16(x.data(), x.size(), 1.0f, 2);
  auto copy = [&](size_t i) -> const bf16* { return weights.data() + i % copies * weight_elems; };
  const bool tuned = path == Path::tuned || path == Path::tuned_silu_mul;
  const bool silu_mul = path == Path::runner_silu_mul || path == Path::tuned_silu_mul;
  std::unique_ptr<cuda::Gemm> own_gemm;
  if (tuned) {
    std::vector<const bf16*> copies_to_tune(copies);
    for (size_t i = 0; i < copies; ++i) copies_to_tune[i] = copy(i);
    own_gemm = tuned_gemm(state, d.stream, silu_mul, copies_to_tune, rows, in, out);
  }
  cuda::Gemm& gemm = tuned ? *own_gemm : *d.gemm;
  time_calls(state, d.stream, [&](int i) {
    const bf16* w = copy(size_t(i));
    if (path == Path::cublas) return gemm.linear_cublas(x.data(), w, y.data(), rows, in, out);
    if (silu_mul) return gemm.linear_silu_mul(x.data(), w, y.data(), act.data(), rows, in, out / 2);
    gemm.linear(x.data(), w, y.data(), rows, in, out);
  });
  const double weight_bytes = double(weight_elems) * sizeof(bf16);
  const double moved = weight_bytes + double(rows) * (in + out) * sizeof(bf16);
  using benchmark::Counter;
  state.counters["GB/s"] = Counter(weight_bytes * 1e-9, Counter::kIsIterationInvariantRate);
  state.counters["bw_floor"] = Counter(moved / d.bandwidth, Counter::kIsIterationInvariantRate);
  state.counters["TFLOP/s"] =
      Counter(2.0 * rows * double(weight_elems) * 1e-12, Counter::kIsIterationInvariantRate);
}

// Sequences (attention) or rows (projections), timed by CUDA events. A fixed count of
// iterations: the library would otherwise size them by the per-call time it is given, and run
// twenty times as long as it means to.
void timed_by_events(benchmark::internal::Benchmark* b, std::initializer_list<int> counts) {
  for (int n : counts) b->Arg(n);
  b->UseManualTime()->Iterations(25)->Unit(benchmark::kMicrosecond);
}
void rows_1_4_16_32_64(benchmark::internal::Benchmark* b) {
  timed_by_events(b, {1, 4, 16, 32, 64});
}
void rows_4_16_32_64(benchmark::internal::Benchmark* b) {
  timed_by_events(b, {4, 16, 32, 64});
}

#define PROJECTION(name, out, in, path, tuned_path)                                                \
  BENCHMARK_CAPTURE(BM_CudaProjection, name, out, in, path)->Apply(rows_1_4_16_32_64);             \
  BENCHMARK_CAPTURE(BM_CudaProjection, name##_tuned, out, in, tuned_path)->Apply(rows_4_16_32_64); \
  BENCHMARK_CAPTURE(BM_CudaProjection, name##_cublas, out, in, Path::cublas)->Apply(rows_4_16_32_64)
PROJECTION(qkv_12288x4096, 3 * kHidden, kHidden, Path::runner, Path::tuned);
PROJECTION(o_4096x4096, kHidden, kHidden, Path::runner, Path::tuned);
PROJECTION(gate_up_22016x4096, 2 * 11008, kHidden, Path::runner_silu_mul, Path::tuned_silu_mul);
PROJECTION(down_4096x11008, kHidden, 11008, Path::runner, Path::tuned);
PROJECTION(lm_head_32000x4096, 32000, kHidden, Path::runner, Path::tuned);
#undef PROJECTION

// One layer's decode attention for `batch` sequences of kContext positions (the last one the
// step's new token, rotated and appended by the kernel), their blocks scattered at random
// through the layer's pool, by the direct (first argument 0) or the pipelined kernel (1), for the
// second argument's sequences in partitions of the third's positions; each call reads the next
// layer of the pool. The first argument varies fastest: the two kernels' rows come in pairs.
void BM_CudaDecodeAttention(benchmark::State& state) {
  Device& d = device();
  if (!d.skip_reason.empty()) {
    state.SkipWithError(d.skip_reason.c_str());
    return;
  }
  const auto kernel = cuda::DecodeAttentionKernel(state.range(0));
  const int batch = int(state.range(1));
  const int blocks_per_seq = kContext / kBlockSize;
  const int max_blocks_per_seq = kMaxPositions / kBlockSize;
  const int partition = int(state.range(2));
  const int max_splits = kMaxPositions / cuda::kShortDecodePartition;
  const size_t layer_elems = size_t(batch) * blocks_per_seq * kBlockSize * kHidden;
  const size_t layers = std::max<size_t>(1, kPoolBytes / (2 * layer_elems * sizeof(bf16)));

  DeviceBuffer<bf16> k(layers * layer_elems), v(layers * layer_elems);
  DeviceBuffer<bf16> qkv(size_t(batch) * 3 * kHidden), out(size_t(batch) * kHidden);
  fill_random_bf16(k.data(), k.size(), 1.0f, 3);
  fill_random_bf16(v.data(), v.size(), 1.0f, 4);
  fill_random_bf16(qkv.data(), qkv.size(), 1.0f, 5);

  std::vector<int32_t> blocks(size_t(batch) * blocks_per_seq);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(6));
  std::vector<int32_t> tables(size_t(batch) * max_blocks_per_seq, 0);
  for (int s = 0; s < batch; ++s)
    std::copy_n(blocks.begin() + size_t(s) * blocks_per_seq, blocks_per_seq,
                tables.begin() + size_t(s) * max_blocks_per_seq);
  // Each sequence's new token is its last position; its slot is in its last block.
  const std::vector<int32_t> lens(size_t(batch), kContext), positions(size_t(batch), kContext - 1);
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  for (int s = 0; s < batch; ++s)
    slots[s] =
        blocks[size_t(s + 1) * blocks_per_seq - 1] * kBlockSize + (kContext - 1) % kBlockSize;
  // Complete on return, as fill_random_bf16's copies are.
  auto to_device = [](const std::vector<int32_t>& host) {
    DeviceBuffer<int32_t> device(host.size());
    PIPELINE_CUDA_CHECK(cudaMemcpy(device.data(), host.data(), host.size() * sizeof(int32_t),
                                   cudaMemcpyHostToDevice));
    PIPELINE_CUDA_CHECK(cudaDeviceSynchronize());
    return device;
  };
  const DeviceBuffer<int32_t> tables_d = to_device(tables), lens_d = to_device(lens);
  const DeviceBuffer<int32_t> positions_d = to_device(positions), slots_d = to_device(slots);
  const cuda::DecodeScratch scratch(batch, kHeads, kHeads, kHeadDim, max_splits, d.stream);

  cuda::PagedKv kv;
  kv.block_tables = tables_d.data();
  kv.max_blocks_per_seq = max_blocks_per_seq;
  kv.block_size = kBlockSize;
  kv.num_kv_heads = kHeads;
  kv.head_dim = kHeadDim;
  time_calls(state, d.stream, [&](int i) {
    bf16* k_layer = k.data() + size_t(i) % layers * layer_elems;
    bf16* v_layer = v.data() + size_t(i) % layers * layer_elems;
    kv.k = k_layer;
    kv.v = v_layer;
    const cuda::DecodeNewTokens fresh{positions_d.data(), slots_d.data(), 10000.0f, k_layer,
                                      v_layer};
    cuda::paged_decode_attention(qkv.data(), 3 * kHidden, kv, fresh, lens_d.data(), batch, kHeads,
                                 partition, kContext / partition, kernel, scratch, out.data(),
                                 d.stream);
  });
  const double kv_bytes = 2.0 * double(layer_elems) * sizeof(bf16);
  using benchmark::Counter;
  state.counters["GB/s"] = Counter(kv_bytes * 1e-9, Counter::kIsIterationInvariantRate);
  state.counters["bw_floor"] = Counter(kv_bytes / d.bandwidth, Counter::kIsIterationInvariantRate);
  // 1 where the runner would take this partition for this step.
  const bool chosen = cuda::decode_partition(batch, kHeads, kContext, cuda::multiprocessor_count(),
                                             kMaxPositions / cuda::kDecodePartition) == partition;
  state.counters["chosen"] = chosen ? 1.0 : 0.0;
}

BENCHMARK(BM_CudaDecodeAttention)
    ->ArgsProduct(
        {{int(cuda::DecodeAttentionKernel::direct), int(cuda::DecodeAttentionKernel::pipelined)},
         {1, 16, 64},
         {cuda::kShortDecodePartition, cuda::kDecodePartition, cuda::kLongDecodePartition}})
    ->ArgNames({"pipelined", "seqs", "partition"})
    ->UseManualTime()
    ->Iterations(25)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pipeline::bench

#else  // built without the CUDA backend

namespace {
void BM_CudaKernels(benchmark::State& state) {
  state.SkipWithError("no CUDA device: built without the CUDA backend");
}
BENCHMARK(BM_CudaKernels);
}  // namespace

#endif

BENCHMARK_MAIN();

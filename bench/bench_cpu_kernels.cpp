// The CPU kernels that dominate a forward pass, as the CPU runner calls them, on the
// llama2-110m shapes, with the operands streamed from memory as in a real decode step (a model's
// weights and KV cache do not stay in the caches from one step to the next):
//
//   Matmul/<dtype>/<matrix>/<batch>   the packed matmul (kernels/cpu/packed_matmul.h) on one of
//                                     the runner's packed matrices, W in bf16 or f32, for a batch
//                                     of 1 or 16 rows, activations as the runner gives them by
//                                     default (bf16 for bf16 W). Each call takes the next packed
//                                     copy of W from a pool of at least 1 GiB, so W comes from
//                                     DRAM, as it does in decode.
//   MatmulF32Act/BF16/<matrix>/<batch>
//                                     the same on bf16 W taking float32 activations
//                                     (model.matmul_activations: f32), for the comparison.
//   AttentionDecode/<dtype>/<layout>/<batch>
//                                     one query per sequence over a 1024-token context in the
//                                     paged KV pool (blocks scattered at random), in the head
//                                     layout of llama2-110m, tinyllama-1.1b or llama2-7b (heads
//                                     of 128, as LLaMA-2-7B served on a CPU), its keys and
//                                     values in f32 or bf16, q read with the fused q/k/v
//                                     projection's row stride as in the runner; each call reads
//                                     the next "layer" of a KV pool of at least 1 GiB.
//   AttentionPrefill/<dtype>/<layout>/<tokens>
//                                     one prompt of 512 or 2048 tokens from position 0, every
//                                     query attending the positions up to its own (causal), its
//                                     keys and values just stored in scattered blocks of the pool
//                                     (so in the caches, as in the runner's prefill).
//
// Threads: $PIPELINE_BENCH_THREADS (default 2), in a oneTBB arena of that size.
// Counters: GB/s (operand bytes read per second), GFLOP/s, bw_floor: the fraction of the read
// bandwidth probed beside the benchmark's own iterations (probe_GB/s; bench_support.h,
// time_passes_beside_probe), and flop_floor: the fraction of the float32 FMA rate probed at
// the start.
#include <benchmark/benchmark.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench/bench_support.h"
#include "io/dtype.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/huge_page_buffer.h"
#include "kernels/cpu/packed_matmul.h"
#include "kernels/cpu/paged_kv.h"
#include "kernels/cpu/weight_matrix.h"

namespace pipeline::bench {
namespace {

// Operands rotate through pools at least this large, several times the last-level cache.
constexpr size_t kStreamBytes = size_t(1) << 30;
constexpr int kContext = 1024;
constexpr int kBlockSize = 16;

// The floors every figure is quoted against, probed in main() before any benchmark runs.
MachineFloors& machine() {
  static MachineFloors floors;
  return floors;
}

tbb::task_arena& arena() {
  static tbb::task_arena a(machine().threads);
  return a;
}

// A value in [-1, 1) from a multiplicative hash of its index: random enough for timing, and fast
// enough to fill a gigabyte in a moment.
float hashed_uniform(size_t i) {
  const uint32_t h = uint32_t(i * 2654435761u) >> 8;  // 24 bits
  return float(h) * (2.0f / float(1 << 24)) - 1.0f;
}

// Runs body(i) for i in [0, count) on the benchmark's threads.
template <typename Body>
void parallel_fill(size_t count, Body body) {
  arena().execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, count, size_t(1) << 16),
                      [&](const tbb::blocked_range<size_t>& r) {
                        for (size_t i = r.begin(); i < r.end(); ++i) body(i);
                      });
  });
}

void fill_uniform(float* data, size_t count) {
  parallel_fill(count, [&](size_t i) { data[i] = hashed_uniform(i); });
}

// A projection as the runner packs it (model/cpu_runner.cpp): `parts` matrices of [rows, cols]
// stacked along the output axis, or two interleaved panel by panel (gate/up). `mode` is the one
// the runner multiplies with: o_proj and down_proj add into the residual.
struct MatrixShape {
  const char* name;
  int parts, rows, cols;
  bool interleave;
  cpu::MatmulMode mode;
};

// The projections of llama2-110m (hidden 768, FFN 2048, vocab 32000).
constexpr MatrixShape kMatrices[] = {
    {"qkv_2304x768", 3, 768, 768, false, cpu::MatmulMode::Overwrite},
    {"o_768x768", 1, 768, 768, false, cpu::MatmulMode::Accumulate},
    {"gate_up_4096x768", 2, 2048, 768, true, cpu::MatmulMode::Overwrite},
    {"down_768x2048", 1, 768, 2048, false, cpu::MatmulMode::Accumulate},
    {"lm_head_32000x768", 1, 32000, 768, false, cpu::MatmulMode::Overwrite},
};

// One source matrix of random weights in `dtype`, packed as `shape` (taking `activations`) into
// copies that together fill at least kStreamBytes. Every copy packs the same values: the timing
// depends only on where the bytes come from.
std::vector<cpu::PackedMatrix> make_packed_pool(const MatrixShape& shape, DType dtype,
                                                DType activations) {
  const size_t count = size_t(shape.rows) * size_t(shape.cols);
  std::vector<std::byte> source(count * dtype_size(dtype));
  std::byte* data = source.data();
  parallel_fill(count, [&](size_t i) {
    const float value = 0.05f * hashed_uniform(i);
    switch (dtype) {
      case DType::F32:
        reinterpret_cast<float*>(data)[i] = value;
        break;
      case DType::BF16:
        reinterpret_cast<uint16_t*>(data)[i] = f32_to_bf16(value);
        break;
      case DType::F16:
        reinterpret_cast<uint16_t*>(data)[i] = f32_to_f16(value);
        break;
    }
  });
  const cpu::WeightMatrix part{data, dtype, shape.rows, shape.cols};
  const std::vector<cpu::WeightMatrix> parts(size_t(shape.parts), part);
  std::vector<cpu::PackedMatrix> pool;
  size_t bytes = 0;
  arena().execute([&] {
    while (bytes < kStreamBytes) {
      pool.push_back(shape.interleave ? cpu::PackedMatrix::interleave(part, part, activations)
                                      : cpu::PackedMatrix::stack(parts, activations));
      bytes += pool.back().bytes();
    }
  });
  return pool;
}

// The pool asked for. Only the last one is kept: the batches of one matrix run one after the
// other, and a pool per matrix would hold gigabytes.
const std::vector<cpu::PackedMatrix>& packed_pool(const MatrixShape& shape, DType dtype,
                                                  DType activations) {
  static const MatrixShape* pool_shape = nullptr;
  static DType pool_dtype = DType::F32, pool_activations = DType::F32;
  static std::vector<cpu::PackedMatrix> pool;
  if (pool_shape != &shape || pool_dtype != dtype || pool_activations != activations) {
    pool.clear();  // free the last pool before packing the next
    pool = make_packed_pool(shape, dtype, activations);
    pool_shape = &shape;
    pool_dtype = dtype;
    pool_activations = activations;
  }
  return pool;
}

void set_floor_counters(benchmark::State& state, double bytes, double flops,
                        const ProbedTiming& timing) {
  using benchmark::Counter;
  state.counters["GB/s"] = Counter(bytes * 1e-9, Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = Counter(flops * 1e-9, Counter::kIsIterationInvariantRate);
  state.counters["bw_floor"] = bytes / timing.read_bytes_per_s / timing.seconds_per_pass;
  state.counters["flop_floor"] = flops / machine().fma_flops_per_s / timing.seconds_per_pass;
  state.counters["probe_GB/s"] = timing.read_bytes_per_s * 1e-9;
}

void BM_Matmul(benchmark::State& state, const MatrixShape& shape, DType dtype, DType activations,
               int batch) {
  try {
    const std::vector<cpu::PackedMatrix>& pool = packed_pool(shape, dtype, activations);
    const cpu::PackedMatrix& first = pool.front();
    const size_t ldy = size_t(first.out_cols());
    std::vector<float> x(size_t(batch) * size_t(first.cols())), y(size_t(batch) * ldy);
    fill_uniform(x.data(), x.size());
    fill_uniform(y.data(), y.size());
    size_t next = 0;
    ProbedTiming timing;
    arena().execute([&] {
      timing = time_passes_beside_probe(state, [&] {
        cpu::matmul(x.data(), batch, pool[next], y.data(), ldy, shape.mode);
        next = (next + 1) % pool.size();
      });
    });
    benchmark::DoNotOptimize(y.data());
    // Bytes: the packed panels (their zero padding too, which the kernel streams); FLOPs: the
    // real outputs only.
    const double outputs = double(shape.parts) * shape.rows;
    set_floor_counters(state, double(first.bytes()), 2.0 * outputs * shape.cols * batch, timing);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Head layouts of the two benchmark shapes, and LLaMA-2-7B's (head_dim 128).
struct AttentionLayout {
  const char* name;
  int num_heads, num_kv_heads, head_dim;
};
constexpr AttentionLayout kLayouts[] = {
    {"llama2-110m", 12, 12, 64}, {"tinyllama-1.1b", 32, 4, 64}, {"llama2-7b", 32, 32, 128}};

void BM_AttentionDecode(benchmark::State& state, AttentionLayout layout, int batch, DType dtype) {
  try {
    const int blocks_per_seq = kContext / kBlockSize;
    const int num_blocks = batch * blocks_per_seq;
    const size_t layer_elements =
        size_t(num_blocks) * kBlockSize * layout.num_kv_heads * layout.head_dim;
    const size_t layer_bytes = layer_elements * dtype_size(dtype);
    const size_t layers = std::max<size_t>(1, kStreamBytes / (2 * layer_bytes));
    // Allocated as the CPU runner allocates its KV pool.
    const cpu::HugePageBuffer memory = cpu::allocate_huge_page_buffer(layers * 2 * layer_bytes);
    std::byte* const pool = memory.get();
    if (dtype == DType::F32) {
      fill_uniform(reinterpret_cast<float*>(pool), layers * 2 * layer_elements);
    } else {
      uint16_t* const bf16 = reinterpret_cast<uint16_t*>(pool);
      parallel_fill(layers * 2 * layer_elements,
                    [&](size_t i) { bf16[i] = f32_to_bf16(hashed_uniform(i)); });
    }

    // Each sequence's blocks are scattered over the pool, as a block manager's would be.
    std::vector<int32_t> block_ids(static_cast<size_t>(num_blocks));
    std::iota(block_ids.begin(), block_ids.end(), 0);
    std::shuffle(block_ids.begin(), block_ids.end(), std::mt19937(7));
    std::vector<cpu::AttentionSequence> seqs;
    for (int s = 0; s < batch; ++s) {
      const std::span<const int32_t> table(block_ids.data() + size_t(s) * blocks_per_seq,
                                           size_t(blocks_per_seq));
      seqs.push_back({s, 1, kContext - 1, table});
    }
    // q is the first part of each row of the fused q/k/v projection's output, as in the runner.
    const int q_dim = layout.num_heads * layout.head_dim;
    const int kv_dim = layout.num_kv_heads * layout.head_dim;
    const size_t ld_qkv = size_t(cpu::panel_round_up(q_dim) + 2 * cpu::panel_round_up(kv_dim));
    std::vector<float> qkv(size_t(batch) * ld_qkv), out(size_t(batch) * q_dim);
    fill_uniform(qkv.data(), qkv.size());

    size_t layer = 0;
    ProbedTiming timing;
    arena().execute([&] {
      timing = time_passes_beside_probe(state, [&] {
        std::byte* k = pool + layer * 2 * layer_bytes;
        const cpu::PagedKvLayer kv{
            k, k + layer_bytes, kBlockSize, layout.num_kv_heads, layout.head_dim, dtype};
        cpu::paged_attention(kv, seqs, layout.num_heads, qkv.data(), ld_qkv, out.data());
        layer = (layer + 1) % layers;
      });
    });
    benchmark::DoNotOptimize(out.data());
    set_floor_counters(state, 2.0 * double(layer_bytes), 4.0 * q_dim * double(kContext) * batch,
                       timing);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void BM_AttentionPrefill(benchmark::State& state, AttentionLayout layout, int tokens, DType dtype) {
  try {
    const int num_blocks = (tokens + kBlockSize - 1) / kBlockSize;
    const size_t elements = size_t(num_blocks) * kBlockSize * layout.num_kv_heads * layout.head_dim;
    const cpu::HugePageBuffer memory = cpu::allocate_huge_page_buffer(2 * elements * 4);
    std::byte* const k = memory.get();
    const cpu::PagedKvLayer kv{
        k, k + elements * 4, kBlockSize, layout.num_kv_heads, layout.head_dim, dtype};
    std::vector<int32_t> table(static_cast<size_t>(num_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(7));

    const int q_dim = layout.num_heads * layout.head_dim;
    const int kv_dim = layout.num_kv_heads * layout.head_dim;
    const size_t ld_qkv = size_t(cpu::panel_round_up(q_dim) + 2 * cpu::panel_round_up(kv_dim));
    std::vector<float> qkv(size_t(tokens) * ld_qkv), out(size_t(tokens) * q_dim);
    fill_uniform(qkv.data(), qkv.size());
    const float* k_rows = qkv.data() + cpu::panel_round_up(q_dim);
    cpu::store_kv(kv, table, 0, tokens, k_rows, k_rows + cpu::panel_round_up(kv_dim), ld_qkv);
    const cpu::AttentionSequence seq{0, tokens, 0, table};

    ProbedTiming timing;
    arena().execute([&] {
      timing = time_passes_beside_probe(state, [&] {
        cpu::paged_attention(kv, {&seq, 1}, layout.num_heads, qkv.data(), ld_qkv, out.data());
      });
    });
    benchmark::DoNotOptimize(out.data());
    const double key_reads = double(tokens) * double(tokens + 1) / 2;  // causal
    set_floor_counters(state, 2.0 * double(elements) * dtype_size(dtype), 4.0 * q_dim * key_reads,
                       timing);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void register_benchmarks() {
  // (row name, weights, activations): the runner's default activations, then float32 ones.
  const struct {
    const char* row;
    DType dtype, activations;
  } matmuls[] = {{"Matmul", DType::BF16, DType::BF16},
                 {"Matmul", DType::F32, DType::F32},
                 {"MatmulF32Act", DType::BF16, DType::F32}};
  for (const auto& mm : matmuls) {
    for (const MatrixShape& m : kMatrices) {
      for (int batch : {1, 16}) {
        const std::string name = std::string(mm.row) + "/" + dtype_name(mm.dtype) + "/" + m.name +
                                 "/" + std::to_string(batch);
        benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, std::cref(m), mm.dtype,
                                     mm.activations, batch)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  // (row name, benchmark, its sizes: sequences for decode, prompt tokens for prefill)
  const struct {
    const char* row;
    void (*run)(benchmark::State&, AttentionLayout, int, DType);
    int sizes[2];
  } attentions[] = {{"AttentionDecode", BM_AttentionDecode, {1, 16}},
                    {"AttentionPrefill", BM_AttentionPrefill, {512, 2048}}};
  for (const auto& attention : attentions) {
    for (DType dtype : {DType::BF16, DType::F32}) {
      for (const AttentionLayout& layout : kLayouts) {
        for (int size : attention.sizes) {
          const std::string name = std::string(attention.row) + "/" + dtype_name(dtype) + "/" +
                                   layout.name + "/" + std::to_string(size);
          benchmark::RegisterBenchmark(name.c_str(), attention.run, layout, size, dtype)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

}  // namespace
}  // namespace pipeline::bench

int main(int argc, char** argv) {
  using namespace pipeline::bench;
  return run_cpu_benchmarks(argc, argv, "bench_cpu_kernels", machine(), register_benchmarks);
}

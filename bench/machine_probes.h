// What this machine can do at best, measured in the benchmark's own process so that every model
// figure can be quoted as a fraction of a floor measured on the same machine at the same moment:
//   - read bandwidth: `threads` threads sum a buffer far larger than the caches with the widest
//     vector loads available (AVX-512 or AVX2), prefetching ahead as the kernels do; bytes read /
//     seconds. ReadBandwidthProbe keeps its buffer so a benchmark can probe again beside its own
//     repetitions: this machine's bandwidth moves by a third from minute to minute.
//   - float32 FMA throughput: `threads` threads run independent chains of vector FMAs that never
//     touch memory; 2 FLOPs per lane per FMA.
// The AVX-512 and AVX2 kernels widen bf16/f16 weights to float32 and multiply-add in float32, so
// float32 FMA is their arithmetic roof; vdpbf16ps on bf16 activations does two multiply-adds per
// lane and can reach twice it (bench/README.md). The probes need AVX2+FMA at least and pick
// AVX-512 where it exists.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/huge_page_buffer.h"

namespace pipeline::bench {

struct ProbeResult {
  double best = 0.0;    // the fastest pass: the floor the benchmarks are held to
  double median = 0.0;  // for judging how noisy the machine was
  const char* isa = "";
};

namespace detail {

// Each thread reads its share as this many interleaved streams, as a matmul reads several weight
// rows at once: one stream per core leaves bandwidth unused.
constexpr int kStreams = 4;
// Bytes taken from each stream per loop turn: four 64-byte vectors.
constexpr size_t kStreamStep = 256;
// A thread's share is a multiple of this.
constexpr size_t kShareQuantum = kStreams * kStreamStep;
// Each stream is prefetched this far ahead of its loads, as the packed matmul prefetches its
// panels (kernels/cpu/packed_matmul_avx512.cpp): a probe that reads slower than the kernels'
// own pattern would be no floor (without it this probe read 10-15% below the kernels).
constexpr size_t kPrefetchDistance = 1024;

inline void prefetch_turn(const float* stream_at) {
  const char* ahead = reinterpret_cast<const char*>(stream_at) + kPrefetchDistance;
  for (size_t line = 0; line < kStreamStep; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
}

// Through memory: GCC 12's _mm512_reduce_add_ps trips -Wuninitialized.
__attribute__((target("avx512f"))) inline float horizontal_sum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float sum = 0.0f;
  for (float l : lanes) sum += l;
  return sum;
}

// Sums `bytes` (a multiple of kShareQuantum) from p, 16 loads per turn into 8 accumulators.
__attribute__((target("avx512f"))) inline float sum_avx512(const float* p, size_t bytes) {
  const size_t stream_floats = bytes / kStreams / sizeof(float);
  __m512 acc[8];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  for (size_t off = 0; off < stream_floats; off += kStreamStep / sizeof(float)) {
    for (int s = 0; s < kStreams; ++s) {
      const float* q = p + s * stream_floats + off;
      prefetch_turn(q);
      for (int i = 0; i < 4; ++i) {
        __m512& a = acc[(s * 4 + i) % 8];
        a = _mm512_add_ps(a, _mm512_load_ps(q + 16 * i));
      }
    }
  }
  for (int i = 1; i < 8; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  return horizontal_sum(acc[0]);
}

__attribute__((target("avx2"))) inline float sum_avx2(const float* p, size_t bytes) {
  const size_t stream_floats = bytes / kStreams / sizeof(float);
  __m256 acc[8];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  for (size_t off = 0; off < stream_floats; off += kStreamStep / sizeof(float)) {
    for (int s = 0; s < kStreams; ++s) {
      const float* q = p + s * stream_floats + off;
      prefetch_turn(q);
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_add_ps(acc[i], _mm256_load_ps(q + 8 * i));
    }
  }
  for (int i = 1; i < 8; ++i) acc[0] = _mm256_add_ps(acc[0], acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  float sum = 0.0f;
  for (float l : lanes) sum += l;
  return sum;
}

// FMA chains per thread: enough independent accumulators to cover FMA latency × issue width.
constexpr int kFmaChains = 12;

__attribute__((target("avx512f"))) inline float fma_avx512(int64_t turns) {
  __m512 acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
  for (int64_t t = 0; t < turns; ++t) {
    for (__m512& c : acc) c = _mm512_fmadd_ps(c, a, b);
  }
  for (int i = 1; i < kFmaChains; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  return horizontal_sum(acc[0]);
}

__attribute__((target("avx2,fma"))) inline float fma_avx2(int64_t turns) {
  __m256 acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm256_set1_ps(float(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  for (int64_t t = 0; t < turns; ++t) {
    for (__m256& c : acc) c = _mm256_fmadd_ps(c, a, b);
  }
  for (int i = 1; i < kFmaChains; ++i) acc[0] = _mm256_add_ps(acc[0], acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  return lanes[0];
}

inline cpu::Isa probe_isa() {
  const cpu::Isa isa = cpu::best_isa();
  if (isa == cpu::Isa::Portable) {
    throw std::runtime_error("machine probes: this CPU has neither AVX2+FMA nor AVX-512");
  }
  return isa;
}

// Runs work(thread_index) on `threads` threads released together; returns the wall seconds
// from the release until the last one finishes.
template <typename Work>
double timed_on_threads(int threads, Work work) {
  std::barrier start(threads + 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      start.arrive_and_wait();
      work(t);
    });
  }
  start.arrive_and_wait();
  const auto begin = std::chrono::steady_clock::now();
  for (std::thread& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

// Stores the threads' results where the compiler must assume they are read, so the loads and
// FMAs that made them cannot be optimised away.
inline void keep(const std::vector<float>& results) {
  volatile float sink = 0.0f;
  for (float r : results) sink = sink + r;
}

inline ProbeResult summarise(std::vector<double> rates, cpu::Isa isa) {
  std::sort(rates.begin(), rates.end());
  return {rates.back(), rates[rates.size() / 2], cpu::isa_name(isa)};
}

}  // namespace detail

// Read bandwidth in bytes/s over a buffer split evenly between `threads` threads, one timed
// pass at a time. The buffer is allocated and paged in once, and stays resident (bytes()) for
// the probe's life.
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(int threads, size_t buffer_bytes = size_t(1) << 30)
      : threads_(threads), isa_(detail::probe_isa()) {
    if (threads < 1) throw std::invalid_argument("ReadBandwidthProbe: threads must be >= 1");
    share_ = buffer_bytes / size_t(threads) / detail::kShareQuantum * detail::kShareQuantum;
    // Allocated as the packed weights are (kernels/cpu/huge_page_buffer.h), so that the floor
    // is measured with the same pages, and TLB reach, as the kernels it judges.
    memory_ = cpu::allocate_huge_page_buffer(bytes());
    // Each thread writes its own share first, so its pages are local to it.
    detail::timed_on_threads(
        threads_, [&](int t) { std::fill(part(t), part(t) + share_ / sizeof(float), 1.0f); });
  }

  size_t bytes() const { return share_ * size_t(threads_); }

  // One timed pass over the whole buffer: bytes/s.
  double pass() {
    std::vector<float> sums(static_cast<size_t>(threads_));
    const double seconds = detail::timed_on_threads(threads_, [&](int t) {
      sums[size_t(t)] = isa_ == cpu::Isa::Avx512 ? detail::sum_avx512(part(t), share_)
                                                 : detail::sum_avx2(part(t), share_);
    });
    detail::keep(sums);
    return double(bytes()) / seconds;
  }

  // `passes` timed passes.
  ProbeResult passes(int passes) {
    std::vector<double> rates;
    for (int p = 0; p < passes; ++p) rates.push_back(pass());
    return detail::summarise(std::move(rates), isa_);
  }

 private:
  float* part(int t) const {
    return reinterpret_cast<float*>(memory_.get()) + share_ / sizeof(float) * size_t(t);
  }

  int threads_;
  cpu::Isa isa_;
  size_t share_ = 0;
  cpu::HugePageBuffer memory_;
};

// Float32 multiply-add throughput in FLOP/s on `threads` threads, `passes` timed passes of about
// 0.1 s each.
inline ProbeResult measure_fma_throughput(int threads, int passes = 5) {
  if (threads < 1) throw std::invalid_argument("measure_fma_throughput: threads must be >= 1");
  const cpu::Isa isa = detail::probe_isa();
  const int lanes = isa == cpu::Isa::Avx512 ? 16 : 8;
  const int64_t turns = 20'000'000;
  std::vector<float> sinks(static_cast<size_t>(threads));
  std::vector<double> rates;
  for (int pass = 0; pass < passes; ++pass) {
    const double seconds = detail::timed_on_threads(threads, [&](int t) {
      sinks[size_t(t)] =
          isa == cpu::Isa::Avx512 ? detail::fma_avx512(turns) : detail::fma_avx2(turns);
    });
    const double flops = 2.0 * lanes * detail::kFmaChains * double(turns) * threads;
    rates.push_back(flops / seconds);
  }
  detail::keep(sinks);
  return detail::summarise(std::move(rates), isa);
}

}  // namespace pipeline::bench

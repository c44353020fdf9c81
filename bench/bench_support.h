// Small helpers the CPU benchmarks share: the thread count they run with, the machine's floors
// (probed in the benchmark's own process), per-iteration timing, and the peak resident memory.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

#include "bench/machine_probes.h"
#include "kernels/cpu/cpu_features.h"

namespace pipeline::bench {

// Threads for the kernels and the probes: PIPELINE_BENCH_THREADS, default 2 (the reference
// machine's core count, which the targets assume).
inline int bench_threads() {
  const char* text = std::getenv("PIPELINE_BENCH_THREADS");
  if (!text || !*text) return 2;
  char* end = nullptr;
  const long threads = std::strtol(text, &end, 10);
  if (*end != '\0' || threads < 1 || threads > 1024) {
    throw std::invalid_argument(
        std::string("PIPELINE_BENCH_THREADS: expected a thread count >= 1, got '") + text + "'");
  }
  return int(threads);
}

// The machine as probed at the start on `threads` threads: the best read bandwidth (reported in
// the context only; a bw_floor is judged against the probes beside its own benchmark, see
// ProbedTiming) and the best float32 FMA rate, which every flop_floor is judged against.
struct MachineFloors {
  int threads = 0;
  double read_bytes_per_s = 0.0;
  double fma_flops_per_s = 0.0;
};

inline std::string format_fixed(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

// The read-bandwidth probe of this process, on bench_threads() threads, made on first use. Its
// buffer (1 GiB) stays resident from then on: memory figures subtract read_probe().bytes().
inline ReadBandwidthProbe& read_probe() {
  static ReadBandwidthProbe probe(bench_threads());
  return probe;
}

// Runs both probes on bench_threads() threads: the best of five passes each.
inline MachineFloors probe_machine_floors() {
  const int threads = bench_threads();
  std::fprintf(stderr, "probing read bandwidth and FMA throughput on %d threads...\n", threads);
  MachineFloors floors;
  floors.threads = threads;
  floors.read_bytes_per_s = read_probe().passes(5).best;
  floors.fma_flops_per_s = measure_fma_throughput(threads).best;
  return floors;
}

// Probes the FMA rate again and keeps the better figure: the floor is the machine's, and on a
// shared machine a single probe may have been starved of cores.
inline void reprobe_fma_floor(MachineFloors& floors) {
  std::fprintf(stderr, "probing FMA throughput on %d threads...\n", floors.threads);
  floors.fma_flops_per_s =
      std::max(floors.fma_flops_per_s, measure_fma_throughput(floors.threads).best);
}

// Adds the floors to the context every benchmark report starts with.
inline void report_floors(const MachineFloors& floors) {
  benchmark::AddCustomContext("threads", std::to_string(floors.threads));
  benchmark::AddCustomContext("kernel_isa", cpu::isa_name(cpu::best_isa()));
  benchmark::AddCustomContext("read_GB/s", format_fixed(floors.read_bytes_per_s * 1e-9));
  benchmark::AddCustomContext("fma_GFLOP/s", format_fixed(floors.fma_flops_per_s * 1e-9));
}

// Runs `pass` once per benchmark iteration and returns the mean wall seconds of one, so that
// floor fractions can be stored as plain ratios (a rate counter would print them as "/s").
template <typename Pass>
double time_passes(benchmark::State& state, Pass pass) {
  const auto begin = std::chrono::steady_clock::now();
  for (auto _ : state) pass();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return state.iterations() > 0 ? seconds / double(state.iterations()) : 0.0;
}

// A benchmark's time per pass and the read bandwidth the machine had beside it.
struct ProbedTiming {
  double seconds_per_pass = 0.0;
  // The faster of two passes of read_probe(), one just before the benchmark's first iteration
  // and one just after its last. The host's bandwidth moves by a third from minute to minute
  // while the kernels' time holds steady, so a floor probed minutes earlier would judge the
  // benchmark against another moment's machine. Not probed between iterations: a pass over
  // 1 GiB evicts the caches, and the step after it ran 3% slower than steps run back to back,
  // as a server runs them. The faster pass: one slowed by other load must not lower the floor.
  double read_bytes_per_s = 0.0;
};

// time_passes, with read_probe() run just before and just after the iterations.
template <typename Pass>
ProbedTiming time_passes_beside_probe(benchmark::State& state, Pass pass) {
  const double before = read_probe().pass();
  const double seconds_per_pass = time_passes(state, pass);
  return {seconds_per_pass, std::max(before, read_probe().pass())};
}

// The main of a CPU benchmark executable: Google Benchmark's flags, the machine's floors probed
// into `floors` and reported, `register_benchmarks` (which may throw on missing inputs), the run.
inline int run_cpu_benchmarks(int argc, char** argv, const char* name, MachineFloors& floors,
                              const std::function<void()>& register_benchmarks) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    floors = probe_machine_floors();
    report_floors(floors);
    register_benchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// Peak resident set size in bytes (VmHWM). It is read from /proc rather than getrusage because
// getrusage's ru_maxrss can never be lowered, and each model must be measured without the
// read-bandwidth probe's buffer or the previous model counted in.
inline int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      int64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 16, '\n');
  }
  throw std::runtime_error("/proc/self/status: no VmHWM line");
}

// Lowers the peak resident set size to the current one (Linux: "5" to /proc/self/clear_refs).
inline void reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  if (!clear) throw std::runtime_error("/proc/self/clear_refs: cannot reset the peak RSS");
}

}  // namespace pipeline::bench

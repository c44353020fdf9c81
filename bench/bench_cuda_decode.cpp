// Decode throughput of the CUDA runner: one step for a batch of 1, 16 or 64 sequences, each with
// a 1024-token context already in the KV cache (every sequence has its own blocks). The model
// folder comes from PIPELINE_BENCH_MODEL (e.g. `pipeline make-model --shape llama2-7b`).
// BM_CudaDecode's steps are greedy ones (every chunk argmax_only, as the server sends a batch
// of greedy requests without logprobs): the host gets each row's argmax. BM_CudaDecodeAllLogits
// runs the same steps returning every row, as a batch with one sampled request does.
//
// Each batch size's first replayed step is bracketed by cudaProfilerStart/Stop, so that
// `ncu --profile-from-start off` times that step's kernels and nothing else.
//
// Counters: tok/s (sequences * steps / second) and floor: the fraction of the bandwidth floor
// reached, floor = (bf16 weight bytes + KV bytes read per step) / device bandwidth, the
// bandwidth measured here with a large device-to-device copy (bytes read + bytes written).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/batch.h"
#include "model/llama_weights.h"
#include "model/model_runner.h"

#ifdef PIPELINE_HAVE_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "bench/cuda_probes.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_runner.h"
#include "kernels/cuda/device_weights.h"

namespace pipeline {
namespace {

constexpr int kMaxBatch = 64;
constexpr int kContext = 1024;
constexpr int kPrefillSeqsPerBatch = 8;

// The model, its runner and kMaxBatch sequences with their contexts prefilled, made once.
struct DecodeSetup {
  std::string skip_reason;  // non-empty: the benchmark cannot run here
  std::shared_ptr<const LlamaWeights> weights;
  std::unique_ptr<ModelRunner> runner;
  std::vector<SequenceChunk> seqs;  // each at start_pos = context, block table covering it
  int context = 0;
  double bandwidth = 0.0;
};

DecodeSetup make_setup() {
  DecodeSetup s;
  std::string why;
  if (!cuda_device_available(&why)) {
    s.skip_reason = "no CUDA device: " + why;
    return s;
  }
  const char* model = std::getenv("PIPELINE_BENCH_MODEL");
  if (!model || !*model) {
    s.skip_reason = "set PIPELINE_BENCH_MODEL to a model folder";
    return s;
  }
  s.bandwidth = bench::measure_device_bandwidth();
  s.weights = std::make_shared<const LlamaWeights>(LlamaWeights::load(model));
  const LlamaConfig& c = s.weights->config;
  s.context = std::min(kContext, c.max_position_embeddings - 1);
  RunnerOptions options;
  options.kv_block_size = 16;
  options.max_num_seqs = kMaxBatch;
  const int blocks_per_seq = (s.context + 1 + options.kv_block_size - 1) / options.kv_block_size;
  options.kv_cache_blocks = kMaxBatch * blocks_per_seq;
  s.runner = make_cuda_runner(s.weights, options);
  for (const auto& line : s.runner->setup_report())
    std::fprintf(stderr, "bench_cuda_decode: cuda runner: %s\n", line.c_str());

  // Distinct random contexts, prefilled a few sequences per forward pass.
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> token(3, c.vocab_size - 1);
  int32_t next_block = 0;
  for (int i = 0; i < kMaxBatch; ++i) {
    SequenceChunk seq;
    seq.tokens.resize(size_t(s.context));
    for (int32_t& t : seq.tokens) t = token(rng);
    for (int b = 0; b < blocks_per_seq; ++b) seq.block_table.push_back(next_block++);
    s.seqs.push_back(std::move(seq));
  }
  Logits logits;
  for (int first = 0; first < kMaxBatch; first += kPrefillSeqsPerBatch) {
    Batch batch;
    batch.seqs.assign(s.seqs.begin() + first, s.seqs.begin() + first + kPrefillSeqsPerBatch);
    s.runner->forward(batch, logits);
  }
  // From now on every step decodes position `context`, so the context never grows.
  for (SequenceChunk& seq : s.seqs) {
    seq.tokens = {token(rng)};
    seq.start_pos = s.context;
  }
  return s;
}

DecodeSetup& setup() {
  static DecodeSetup s = make_setup();
  return s;
}

// `argmax_only`: the step returns each row's argmax (greedy), or else every row.
void decode_steps(benchmark::State& state, bool argmax_only) {
  DecodeSetup& s = setup();
  if (!s.skip_reason.empty()) {
    state.SkipWithError(s.skip_reason.c_str());
    return;
  }
  const int batch_size = int(state.range(0));
  Batch batch;
  batch.seqs.assign(s.seqs.begin(), s.seqs.begin() + batch_size);
  for (SequenceChunk& seq : batch.seqs) seq.argmax_only = argmax_only;
  Logits logits;
  for (int i = 0; i < 3; ++i) s.runner->forward(batch, logits);  // eager, capture, replay
  // One replayed step for a profiler to time kernel by kernel; without one, a fourth warm-up.
  PIPELINE_CUDA_CHECK(cudaProfilerStart());
  s.runner->forward(batch, logits);
  PIPELINE_CUDA_CHECK(cudaProfilerStop());
  for (auto _ : state) s.runner->forward(batch, logits);

  const LlamaConfig& c = s.weights->config;
  const double kv_bytes =
      double(batch_size) * (s.context + 1) * c.num_layers * c.kv_dim() * 2.0 /*K,V*/ * 2.0;
  const double floor_seconds = (double(cuda::decode_weight_bytes(c)) + kv_bytes) / s.bandwidth;
  state.counters["tok/s"] =
      benchmark::Counter(double(batch_size), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["floor"] =
      benchmark::Counter(floor_seconds, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s_dev"] = s.bandwidth * 1e-9;
  state.counters["ctx"] = s.context;
}

void BM_CudaDecode(benchmark::State& state) {
  decode_steps(state, /*argmax_only=*/true);
}
void BM_CudaDecodeAllLogits(benchmark::State& state) {
  decode_steps(state, /*argmax_only=*/false);
}
BENCHMARK(BM_CudaDecode)->Arg(1)->Arg(16)->Arg(64)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CudaDecodeAllLogits)->Arg(16)->Arg(64)->UseRealTime()->Unit(benchmark::kMillisecond);

// The serving benchmark's workload on the runner alone: 16 sequences of 32-token prompts,
// prefilled together (the first of 1024 tokens each), then decoded greedily together for 1023
// steps, their contexts growing from 33 to 1055 positions and their cache blocks taken one at a
// time as each needs the next, so that the sequences' blocks interleave in the pool as a
// scheduler's do. Its tok/s set beside `pipeline bench-serve`'s on the same checkpoint say how
// much of serving is the server's. Counters as BM_CudaDecode's (the floor counts each decode
// step's own KV bytes; the prefill's time counts, its bytes do not), and steps: the forward
// passes of one iteration.
void BM_CudaDecodeServing(benchmark::State& state) {
  DecodeSetup& s = setup();
  if (!s.skip_reason.empty()) {
    state.SkipWithError(s.skip_reason.c_str());
    return;
  }
  constexpr int kSeqs = 16, kPrompt = 32, kSteps = 1024;
  const LlamaConfig& c = s.weights->config;
  const int block_size = s.runner->kv_shape().block_size;
  const int positions = kPrompt + kSteps - 1;  // the last token drawn is not computed
  if (positions > c.max_position_embeddings) {
    state.SkipWithError("the model's context is shorter than 1055 positions");
    return;
  }
  if (kSeqs * (positions / block_size + 1) > s.runner->kv_shape().num_blocks) {
    state.SkipWithError("the KV pool is too small for 16 sequences of 1055 positions");
    return;
  }
  std::mt19937 rng(99);
  std::uniform_int_distribution<int32_t> token(3, c.vocab_size - 1);
  const double weight_bytes = double(cuda::decode_weight_bytes(c));
  const double kv_bytes_per_position = double(c.num_layers) * c.kv_dim() * 2.0 * 2.0;
  double floor_seconds = 0.0;
  Logits logits;
  for (auto _ : state) {
    state.PauseTiming();
    // The earlier benchmarks' contexts are overwritten: from here on only timings matter.
    int32_t next_block = 0;
    std::vector<SequenceChunk> seqs(kSeqs);
    for (SequenceChunk& seq : seqs) {
      seq.tokens.resize(kPrompt);
      seq.argmax_only = true;  // bench-serve's requests: greedy, no logprobs
      for (int32_t& t : seq.tokens) t = token(rng);
      for (int b = 0; b * block_size < kPrompt + 1; ++b) seq.block_table.push_back(next_block++);
    }
    state.ResumeTiming();
    s.runner->forward(Batch{seqs}, logits);
    for (int step = 0; step < kSteps - 1; ++step) {
      for (SequenceChunk& seq : seqs) {
        seq.start_pos += int(seq.tokens.size());
        seq.tokens = {token(rng)};
        if (seq.start_pos + 1 > int(seq.block_table.size()) * block_size)
          seq.block_table.push_back(next_block++);
      }
      s.runner->forward(Batch{seqs}, logits);
      floor_seconds +=
          (weight_bytes + kSeqs * (seqs[0].start_pos + 1) * kv_bytes_per_position) / s.bandwidth;
    }
  }
  state.counters["tok/s"] =
      benchmark::Counter(double(kSeqs) * kSteps, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["floor"] = benchmark::Counter(floor_seconds, benchmark::Counter::kIsRate);
  state.counters["GB/s_dev"] = s.bandwidth * 1e-9;
  state.counters["steps"] = kSteps;
}

BENCHMARK(BM_CudaDecodeServing)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pipeline

#else  // built without the CUDA backend

namespace {
void BM_CudaDecode(benchmark::State& state) {
  state.SkipWithError("no CUDA device: built without the CUDA backend");
}
BENCHMARK(BM_CudaDecode);
}  // namespace

#endif

BENCHMARK_MAIN();

// The CPU runner's whole forward pass on real LLaMA shapes (random weights from `pipeline
// make-model`), each figure quoted against floors measured in the same process:
//
//   Decode/<shape>/<B>    one decode step of B sequences (B = 1, 4, 16, 64), each with a
//                         128-token context already in the KV cache. Every step decodes position
//                         128 again (overwriting that KV slot), so the context stays 128 tokens.
//                         The KV cache is bf16, the runner's choice for these bf16 models.
//   Prefill/<shape>/<T>   one prompt of T tokens (T = 128, 512) from position 0.
//   DecodeF32Kv/<shape>/<B>  Decode with the KV cache in float32 instead (B = 16, 64), for the
//                         comparison in one run.
//   DecodeF32Act/<shape>/<B>, PrefillF32Act/<shape>/<T>  Decode (B = 16, 64) and prefill
//                         (T = 128) with the matmuls taking float32 activations instead of bf16
//                         (RunnerOptions::matmul_activations), for the comparison in one run.
//
// Models: $PIPELINE_BENCH_MODELS/llama2-110m and $PIPELINE_BENCH_MODELS/tinyllama-1.1b.
// Threads: $PIPELINE_BENCH_THREADS (default 2), for the runner's kernels and the probes alike.
//
// Counters (per benchmark; with repetitions, report the medians):
//   tok/s         tokens per second, all sequences together
//   weight_MB     weight bytes one forward pass must read: every layer tensor, the final norm,
//                 the whole lm_head, and one embedding row per token
//   kv_MB         (decode) KV-cache bytes one step reads: each sequence's 129 positions of K and
//                 V in every layer, in the cache's element type
//   bw_floor      (decode) fraction of the bandwidth floor: (weight bytes / probed read bandwidth)
//                 / measured time, the bandwidth probed beside this repetition's own iterations
//                 (bench_support.h, time_passes_beside_probe). The floor: weights only,
//                 KV not counted
//   flop_floor    fraction of the arithmetic floor: (FLOPs / probed float32 FMA rate) / measured
//                 time, FLOPs = 2 per weight per token (lm_head once per logit row) plus
//                 attention's 4 * q_dim per attended position per layer
//   probe_GB/s    (decode) the read bandwidth bw_floor used
//   probe_GFLOP/s the FMA rate flop_floor used: the best probed so far in the process
//   peak_mem_GB   peak resident memory since this model was loaded, the probe's buffer not counted
//   mem_budget    that peak / (weights' file size + the runner's KV pool); the target is <= 1.1
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_support.h"
#include "model/batch.h"
#include "model/cpu_runner.h"
#include "model/llama_weights.h"
#include "model/model_runner.h"

namespace pipeline::bench {
namespace {

namespace fs = std::filesystem;

const char* const kShapes[] = {"llama2-110m", "tinyllama-1.1b"};
constexpr int kDecodeBatches[] = {1, 4, 16, 64};
constexpr int kPrefillLengths[] = {128, 512};
constexpr int kMaxDecodeBatch = 64;
constexpr int kContext = 128;
constexpr int kMaxPrefill = 512;
constexpr int kBlockSize = 16;
// Setup prefills the decode contexts this many sequences per forward pass: 512 rows, no more
// than Prefill/512 takes, so the runner's scratch (which keeps its largest size) and the peak
// memory are what the benchmarks themselves need.
constexpr int kSetupSeqsPerPass = kMaxPrefill / kContext;

// The floors: probed in main(), the FMA rate again before each model.
MachineFloors& machine() {
  static MachineFloors floors;
  return floors;
}

// Bytes of every tensor a forward pass reads in full: all layers, the final norm, the lm_head.
double streamed_weight_bytes(const LlamaWeights& w) {
  double bytes = double(w.final_norm.nbytes()) + double(w.lm_head.nbytes());
  for (const LayerWeights& l : w.layers) {
    for (const TensorView* t :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.mlp_norm, &l.w_gate, &l.w_up, &l.w_down}) {
      bytes += double(t->nbytes());
    }
  }
  return bytes;
}

// Weights of the layers' projections (each is one multiply-add per token).
double layer_matrix_params(const LlamaWeights& w) {
  double params = 0.0;
  for (const LayerWeights& l : w.layers) {
    for (const TensorView* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      params += double(t->numel());
    }
  }
  return params;
}

// What one forward pass must do, for the floors.
struct PassWork {
  int tokens = 0;
  double weight_bytes = 0.0;
  double kv_bytes = 0.0;
  double flops = 0.0;
};

// `seqs` sequences, each bringing `new_tokens` tokens after `start_pos` cached ones; one logit
// row per sequence.
PassWork pass_work(const LlamaWeights& w, DType kv_dtype, int seqs, int new_tokens, int start_pos) {
  const LlamaConfig& c = w.config;
  PassWork work;
  work.tokens = seqs * new_tokens;
  work.weight_bytes =
      streamed_weight_bytes(w) + double(work.tokens) * c.hidden_size * dtype_size(w.embed.dtype);
  // Query at position p attends to p + 1 positions: sum over the new tokens' positions.
  const double first = start_pos + 1.0, last = start_pos + double(new_tokens);
  const double attended = seqs * (first + last) * new_tokens / 2.0;
  work.kv_bytes = attended * c.num_layers * c.kv_dim() * 2.0 /*K and V*/ * dtype_size(kv_dtype);
  work.flops = 2.0 * layer_matrix_params(w) * work.tokens + 2.0 * double(w.lm_head.numel()) * seqs +
               4.0 * c.q_dim() * attended * c.num_layers;
  return work;
}

int64_t safetensors_bytes(const fs::path& dir) {
  int64_t bytes = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") {
      bytes += int64_t(entry.file_size());
    }
  }
  return bytes;
}

// The runner options a benchmark row varies from the runner's defaults.
struct RunnerVariant {
  std::optional<DType> kv_dtype;  // unset: the runner's own choice
  DType activations = DType::BF16;
  bool operator==(const RunnerVariant&) const = default;
};

// One model with its runner, its decode contexts (prefilled on first use) and a prompt for the
// prefill benchmarks, which has its own blocks so it never disturbs the contexts.
class ShapeBench {
 public:
  ShapeBench(std::string shape, const fs::path& dir, const RunnerVariant& variant)
      : shape_(std::move(shape)), variant_(variant) {
    weights_ = std::make_shared<const LlamaWeights>(LlamaWeights::load(dir));
    file_bytes_ = safetensors_bytes(dir);
    const int context_blocks = (kContext + 1 + kBlockSize - 1) / kBlockSize;
    const int prompt_blocks = (kMaxPrefill + kBlockSize - 1) / kBlockSize;
    RunnerOptions options;
    options.kv_block_size = kBlockSize;
    options.kv_cache_blocks = kMaxDecodeBatch * context_blocks + prompt_blocks;
    options.max_num_seqs = kMaxDecodeBatch;
    options.threads = machine().threads;
    options.kv_cache_dtype = variant.kv_dtype;
    options.matmul_activations = variant.activations;
    runner_ = make_cpu_runner(weights_, options);
    const KvCacheShape& kv = runner_->kv_shape();
    kv_pool_bytes_ = int64_t(kv.num_layers) * kv.num_blocks * kv.block_elems() * 2 *
                     int64_t(dtype_size(kv.dtype));

    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> token(3, config().vocab_size - 1);
    int32_t next_block = 0;
    contexts_.resize(kMaxDecodeBatch);
    for (SequenceChunk& seq : contexts_) {
      seq.tokens.resize(kContext);
      for (int32_t& t : seq.tokens) t = token(rng);
      for (int b = 0; b < context_blocks; ++b) seq.block_table.push_back(next_block++);
    }
    prompt_.tokens.resize(kMaxPrefill);
    for (int32_t& t : prompt_.tokens) t = token(rng);
    for (int b = 0; b < prompt_blocks; ++b) prompt_.block_table.push_back(next_block++);
  }

  const std::string& shape() const { return shape_; }
  const RunnerVariant& variant() const { return variant_; }
  DType kv_dtype() const { return runner_->kv_shape().dtype; }
  const LlamaWeights& weights() const { return *weights_; }
  const LlamaConfig& config() const { return weights_->config; }
  double memory_budget_bytes() const { return double(file_bytes_ + kv_pool_bytes_); }

  // The first `batch_size` sequences, ready to decode position kContext.
  Batch decode_batch(int batch_size) {
    prefill_contexts();
    Batch batch;
    batch.seqs.assign(contexts_.begin(), contexts_.begin() + batch_size);
    return batch;
  }

  Batch prefill_batch(int tokens) const {
    Batch batch;
    batch.seqs.push_back(prompt_);
    batch.seqs[0].tokens.resize(size_t(tokens));
    return batch;
  }

  // Runs a decode batch once untimed the first time a benchmark meets its size, so that timing
  // starts with the runner's scratch buffers grown and their pages touched.
  void warm_up_decode(const Batch& batch) {
    if (!warmed_.insert(int(batch.seqs.size())).second) return;
    Logits logits;
    runner_->forward(batch, logits);
  }

  void forward(const Batch& batch, Logits& logits) { runner_->forward(batch, logits); }

 private:
  void prefill_contexts() {
    if (contexts_ready_) return;
    std::fprintf(stderr, "%s: prefilling %d contexts of %d tokens...\n", shape_.c_str(),
                 kMaxDecodeBatch, kContext);
    Logits logits;
    for (int first = 0; first < kMaxDecodeBatch; first += kSetupSeqsPerPass) {
      Batch batch;
      batch.seqs.assign(contexts_.begin() + first, contexts_.begin() + first + kSetupSeqsPerPass);
      runner_->forward(batch, logits);
    }
    // From now on each sequence decodes one token at position kContext, step after step.
    std::mt19937 rng(99);
    std::uniform_int_distribution<int32_t> token(3, config().vocab_size - 1);
    for (SequenceChunk& seq : contexts_) {
      seq.tokens = {token(rng)};
      seq.start_pos = kContext;
    }
    contexts_ready_ = true;
  }

  std::string shape_;
  RunnerVariant variant_;
  std::shared_ptr<const LlamaWeights> weights_;
  std::unique_ptr<ModelRunner> runner_;
  int64_t file_bytes_ = 0;
  int64_t kv_pool_bytes_ = 0;
  std::vector<SequenceChunk> contexts_;
  bool contexts_ready_ = false;
  SequenceChunk prompt_;
  std::set<int> warmed_;  // decode batch sizes already run once
};

fs::path models_dir;

// The model of `shape` with the runner `variant`, loaded on first use. Benchmarks run shape by
// shape, so only one model is held at a time: the previous one is dropped, the FMA rate probed
// again (the floor keeps the best figure seen, so one probe starved by other load cannot lower
// it), and the peak RSS reset before the next model loads.
ShapeBench& shape_bench(const std::string& shape, const RunnerVariant& variant) {
  static std::unique_ptr<ShapeBench> current;
  if (!current || current->shape() != shape || current->variant() != variant) {
    current.reset();
    reprobe_fma_floor(machine());
    reset_peak_rss();
    current = std::make_unique<ShapeBench>(shape, models_dir / shape, variant);
  }
  return *current;
}

void set_common_counters(benchmark::State& state, const ShapeBench& bench, const PassWork& work,
                         double seconds_per_pass) {
  state.counters["tok/s"] =
      benchmark::Counter(work.tokens, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_MB"] = work.weight_bytes * 1e-6;
  state.counters["flop_floor"] = work.flops / machine().fma_flops_per_s / seconds_per_pass;
  state.counters["probe_GFLOP/s"] = machine().fma_flops_per_s * 1e-9;
  const double peak = double(peak_rss_bytes() - int64_t(read_probe().bytes()));
  state.counters["peak_mem_GB"] = peak * 1e-9;
  state.counters["mem_budget"] = peak / bench.memory_budget_bytes();
}

void BM_Decode(benchmark::State& state, const std::string& shape, int batch_size,
               const RunnerVariant& variant) {
  try {
    ShapeBench& bench = shape_bench(shape, variant);
    const Batch batch = bench.decode_batch(batch_size);
    Logits logits;
    bench.warm_up_decode(batch);
    const ProbedTiming timing =
        time_passes_beside_probe(state, [&] { bench.forward(batch, logits); });

    const PassWork work = pass_work(bench.weights(), bench.kv_dtype(), batch_size, 1, kContext);
    set_common_counters(state, bench, work, timing.seconds_per_pass);
    state.counters["kv_MB"] = work.kv_bytes * 1e-6;
    state.counters["bw_floor"] =
        work.weight_bytes / timing.read_bytes_per_s / timing.seconds_per_pass;
    state.counters["probe_GB/s"] = timing.read_bytes_per_s * 1e-9;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void BM_Prefill(benchmark::State& state, const std::string& shape, int tokens,
                const RunnerVariant& variant) {
  try {
    ShapeBench& bench = shape_bench(shape, variant);
    const Batch batch = bench.prefill_batch(tokens);
    // No warm-up: a prompt pass is long enough that growing the scratch buffers is lost in it,
    // and an extra pass of the 1.1B model's 512 tokens would cost tens of seconds.
    Logits logits;
    const double seconds = time_passes(state, [&] { bench.forward(batch, logits); });

    set_common_counters(state, bench, pass_work(bench.weights(), bench.kv_dtype(), 1, tokens, 0),
                        seconds);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void check_models_dir() {
  const char* dir = std::getenv("PIPELINE_BENCH_MODELS");
  if (!dir || !*dir) {
    throw std::invalid_argument(
        "PIPELINE_BENCH_MODELS is not set: set it to a folder holding llama2-110m/ and "
        "tinyllama-1.1b/ (scripts/bench_cpu.sh writes them with `pipeline make-model`)");
  }
  models_dir = dir;
  for (const char* shape : kShapes) {
    const std::string folder = std::string(dir) + "/" + shape;
    if (!fs::exists(models_dir / shape / "config.json")) {
      throw std::invalid_argument("PIPELINE_BENCH_MODELS: no " + folder +
                                  "/config.json (write it with `pipeline make-model --shape " +
                                  shape + " --dtype bf16 --out " + folder + "`)");
    }
  }
}

void register_benchmarks() {
  using Body = void (*)(benchmark::State&, const std::string&, int, const RunnerVariant&);
  const auto add = [](const std::string& row, Body body, const std::string& shape, int size,
                      const RunnerVariant& variant) {
    benchmark::RegisterBenchmark((row + "/" + shape + "/" + std::to_string(size)).c_str(), body,
                                 shape, size, variant)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  const RunnerVariant defaults, f32_kv{DType::F32}, f32_activations{std::nullopt, DType::F32};
  for (const char* shape : kShapes) {
    for (int batch_size : kDecodeBatches) add("Decode", BM_Decode, shape, batch_size, defaults);
    for (int tokens : kPrefillLengths) add("Prefill", BM_Prefill, shape, tokens, defaults);
    for (int batch_size : {16, 64}) add("DecodeF32Kv", BM_Decode, shape, batch_size, f32_kv);
    for (int batch_size : {16, 64}) {
      add("DecodeF32Act", BM_Decode, shape, batch_size, f32_activations);
    }
    add("PrefillF32Act", BM_Prefill, shape, 128, f32_activations);
  }
}

}  // namespace
}  // namespace pipeline::bench

int main(int argc, char** argv) {
  using namespace pipeline::bench;
  return run_cpu_benchmarks(argc, argv, "bench_cpu_forward", machine(), [] {
    check_models_dir();
    register_benchmarks();
  });
}

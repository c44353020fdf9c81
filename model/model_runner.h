// The boundary between scheduling and compute: a ModelRunner runs the LLaMA forward pass of a
// Batch on one device, reading and writing KV blocks that the caller's BlockManager allocated.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "model/batch.h"
#include "model/kv_cache.h"

namespace pipeline {

// How a runner sizes itself.
struct RunnerOptions {
  int kv_block_size = 16;
  int kv_cache_blocks = 0;         // explicit KV pool size; 0: derive it
  double kv_cache_fraction = 0.9;  // CUDA: share of free device memory after the weights
  int max_num_seqs = 64;           // CPU: derive the pool from this many full contexts (capped)
  int threads = 0;                 // CPU kernels' threads; 0: all cores
  // The KV cache's element type, F32 or BF16 (CUDA: BF16 only). Unset (auto): float32 for a
  // float32 checkpoint, else bf16, as vLLM's "auto" follows the model's dtype.
  std::optional<DType> kv_cache_dtype;
  // What a bf16 checkpoint's matmuls round their activations to: BF16, as the CUDA kernels do
  // (on CPUs with AVX512_BF16 twice the rate of F32), or F32 (CPU only). Float32 and float16
  // checkpoints always multiply float32 activations.
  DType matmul_activations = DType::BF16;
  // The most tokens, and rows of logits, that one forward pass will hold: the scheduler's prefill
  // budget and rows of prompts to score beside its decoding sequences. The CUDA runner sizes its
  // buffers for them before the KV cache takes its share of the free memory, as vLLM's profile
  // run does, so a long prefill cannot find the device full mid-serving. 0: not known (buffers
  // grow when a pass needs more).
  int max_pass_tokens = 0;
  int max_pass_logit_rows = 0;
};

// Throws std::invalid_argument naming the first field out of its range; every runner checks its
// options with it before its own device-specific checks.
void check_runner_options(const RunnerOptions& options);

// What forward() throws when the runner can run nothing more: a device error that outlives the
// pass (CUDA's "sticky" errors, an illegal address say, leave the context unusable until the
// process exits). The engine then fails every request and stops taking new ones. Anything else
// forward() throws fails only the pass's prompts.
class RunnerFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What forward() throws when the pass's watch (ModelRunner::watch_pass) said no one wants it
// any more: the pass stopped part-way, so its logits and the K and V it was writing are not to
// be used.
class PassAbandoned : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const LlamaConfig& config() const = 0;
  // The KV pool this runner allocated; size a BlockManager with its num_blocks.
  virtual const KvCacheShape& kv_shape() const = 0;
  // "cpu" or "cuda", for logs and metrics.
  virtual std::string device_name() const = 0;
  // What the runner chose while it set itself up (kernels timed against each other, say), a line
  // each, for the log.
  virtual std::vector<std::string> setup_report() const { return {}; }

  // Runs every sequence's new tokens, writes their K and V into the block tables' slots and
  // fills `logits` (resized here) with Batch::logit_rows() rows, or, when the batch is
  // argmax_only(), with their argmaxes (Logits::argmax) and no rows. Decode batches (one token
  // per sequence) are the hot path. Throws RunnerFailure when the runner is no longer usable.
  virtual void forward(const Batch& batch, Logits& logits) = 0;

  // Until the next call, forward() asks `wanted` between the steps of a pass (the CPU runner:
  // before each layer) and, once it answers false, stops and throws PassAbandoned. The model
  // step's answers false once every sequence of its pass has ended (cancelled by its client, or
  // failed at shutdown), so that a long pass (on a CPU, 20 s for a 7B model's 512-token prefill)
  // does not compute for no one, nor hold the exit past the grace. Empty: nothing to ask. A
  // runner whose passes are short may ignore it.
  virtual void watch_pass(std::function<bool()> wanted) { (void)wanted; }
};

}  // namespace pipeline

#include "stages/model_step.h"

#include <oneapi/tbb/parallel_for.h>

#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "graph/log.h"
#include "graph/nvtx.h"

namespace pipeline {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

RequestError server_error(const std::string& what) {
  return {500, what, "server_error", "", ""};
}

// Whether the pass computed the sequence up to its last token, so that its next is sampled.
bool reaches_the_end(const SequenceChunk& chunk, const Sequence& seq) {
  return chunk.start_pos + chunk.tokens.size() == seq.tokens.size();
}

}  // namespace

StepResult run_model_step(EngineContext& ctx, const std::vector<SequencePtr>& seqs,
                          const Batch& batch, bool prefill, Logits& logits, int riders) {
  StepResult result;
  result.prefill = prefill;
  result.batch_tokens = batch.total_tokens();
  const auto start = Clock::now();
  try {
    ctx.runner.forward(batch, logits);
  } catch (const std::exception& e) {
    log_line("%s forward pass failed: %s", prefill ? "prefill" : "decode", e.what());
    const auto first_rider = seqs.end() - riders;
    for (auto seq = seqs.begin(); seq != first_rider; ++seq)
      (*seq)->stream.fail(server_error(std::string("forward pass failed: ") + e.what()));
    result.failed.assign(seqs.begin(), first_rider);
    result.retry.assign(first_rider, seqs.end());
    return result;
  }
  const auto now = Clock::now();
  (prefill ? ctx.metrics.prefill_forward_seconds : ctx.metrics.decode_forward_seconds)
      .observe(seconds_since(start, now));
  // Each sequence samples from its own row with its own sampler: in parallel, since a large
  // batch's sampling would otherwise stall the device between steps.
  std::vector<SampledToken> sampled(seqs.size());
  std::vector<std::optional<std::string>> sampling_errors(seqs.size());
  {
    static const NvtxName kSampling("sampling");
    NvtxRange range(kSampling);
    tbb::parallel_for(size_t(0), seqs.size(), [&](size_t i) {
      if (!reaches_the_end(batch.seqs[i], *seqs[i])) return;
      try {
        sampled[i] = seqs[i]->sampler->sample(logits.row(int(i)), seqs[i]->tokens);
      } catch (const std::exception& e) {
        sampling_errors[i] = e.what();
      }
    });
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& seq = *seqs[i];
    if (!reaches_the_end(batch.seqs[i], seq)) continue;
    if (sampling_errors[i]) {
      seq.stream.fail(server_error("sampling failed: " + *sampling_errors[i]));
      result.failed.push_back(seqs[i]);
      continue;
    }
    seq.tokens.push_back(sampled[i].token);
    const int index = seq.generated() - 1;
    std::optional<FinishReason> finish;
    if (!seq.request->ignore_eos && ctx.model.is_eos(sampled[i].token))
      finish = FinishReason::Stop;
    else if (seq.generated() >= seq.max_tokens)
      finish = FinishReason::Length;
    if (index == 0)
      ctx.metrics.time_to_first_token.observe(seconds_since(seq.request->arrival, now));
    else
      ctx.metrics.inter_token_latency.observe(seconds_since(seq.last_token_at, now));
    seq.last_token_at = now;
    result.outputs.push_back({seqs[i], index, std::move(sampled[i]), finish});
  }
  ctx.metrics.generated_tokens.add(result.outputs.size());
  result.seconds = seconds_since(start, Clock::now());
  return result;
}

}  // namespace pipeline

#include "stages/prefill.h"

#include "graph/log.h"
#include "stages/model_step.h"

namespace pipeline {

StageInfo PrefillStage::info() {
  StageInfo info;
  info.name = "prefill";
  info.summary =
      "forward pass over prompt chunks (ragged batch), running sequences' tokens alongside; "
      "samples each finished prompt's first token";
  info.accepts = kind_of<PrefillBatch>();
  info.produces = kind_of<StepResult>();
  info.serial = true;
  info.make = [](const GraphNodeSpec&, EngineContext& ctx) {
    return std::make_unique<PrefillStage>(ctx);
  };
  return info;
}

void PrefillStage::operator()(Message message, const Emit& emit) {
  const auto& work = std::get<PrefillBatch>(message);
  StepResult result =
      run_model_step(ctx_, work.seqs, work.batch, /*prefill=*/true, logits_, work.decoding);
  const int prompts = int(work.seqs.size()) - work.decoding;
  ctx_.metrics.prefill_batches.add();
  ctx_.metrics.prefill_batch_size.observe(double(prompts));
  // A failed pass hands its decoding sequences back untouched.
  ctx_.metrics.prefill_decode_tokens.add(uint64_t(work.decoding) - result.retry.size());
  if (ctx_.config.scheduler.logs_passes() && !result.pass_failed)
    log_line("prefilled %d tokens of %d prompt(s), %d sequence(s) decoding alongside, in %.3f s",
             result.batch_tokens - work.decoding, prompts, work.decoding, result.seconds);
  emit(std::move(result));
}

}  // namespace pipeline

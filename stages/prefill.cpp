#include "stages/prefill.h"

#include "graph/log.h"
#include "stages/model_step.h"

namespace pipeline {

StageInfo PrefillStage::info() {
  StageInfo info;
  info.name = "prefill";
  info.summary = "forward pass over the new prompts (ragged batch); samples first tokens";
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
  StepResult result = run_model_step(ctx_, work.seqs, work.batch, /*prefill=*/true, logits_);
  ctx_.metrics.prefill_batches.add();
  ctx_.metrics.prefill_batch_size.observe(double(work.seqs.size()));
  log_line("prefilled %zu prompts, %d tokens in %.3f s", work.seqs.size(), result.batch_tokens,
           result.seconds);
  emit(std::move(result));
}

}  // namespace pipeline

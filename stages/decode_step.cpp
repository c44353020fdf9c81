#include "stages/decode_step.h"

#include "stages/model_step.h"

namespace pipeline {

StageInfo DecodeStepStage::info() {
  StageInfo info;
  info.name = "decode_step";
  info.summary = "forward pass of one token for every running sequence; samples each";
  info.accepts = kind_of<DecodeBatch>();
  info.produces = kind_of<StepResult>();
  info.serial = true;
  info.make = [](const GraphNodeSpec&, EngineContext& ctx) {
    return std::make_unique<DecodeStepStage>(ctx);
  };
  return info;
}

void DecodeStepStage::operator()(Message message, const Emit& emit) {
  const auto& work = std::get<DecodeBatch>(message);
  StepResult result = run_model_step(ctx_, work.seqs, work.batch, /*prefill=*/false, logits_);
  ctx_.metrics.decode_steps.add();
  emit(std::move(result));
}

}  // namespace pipeline

#include "stages/batch_window.h"

namespace pipeline {

StageInfo BatchWindowStage::info() {
  StageInfo info;
  info.name = "batch_window";
  info.summary = "scheduler: batch window, continuous batching, KV admission and preemption";
  info.accepts = kinds<Tokenized, StepResult>();
  info.produces = kinds<PrefillBatch, DecodeBatch>();
  info.needs_every = kinds<Tokenized, StepResult>();
  info.serial = true;
  info.async = true;
  info.make = [](const GraphNodeSpec&, EngineContext& ctx) {
    return std::make_unique<BatchWindowStage>(ctx);
  };
  return info;
}

void BatchWindowStage::operator()(Message message, const Emit& emit) {
  ctx_.scheduler.post(std::move(message), emit);
}

}  // namespace pipeline

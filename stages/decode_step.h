// decode_step: one token for every running sequence per forward pass.
// A serial node over the engine's one ModelRunner; its results go back to the scheduler
// (the loop edge) and on to detokenize.
#pragma once

#include "graph/engine_context.h"
#include "graph/stage_registry.h"

namespace pipeline {

class DecodeStepStage : public Stage {
 public:
  static StageInfo info();
  explicit DecodeStepStage(EngineContext& context) : ctx_(context) {}
  void operator()(Message message, const Emit& emit) override;

 private:
  EngineContext& ctx_;
  Logits logits_;  // reused across steps
};

}  // namespace pipeline

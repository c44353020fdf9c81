// prefill: one forward pass over the batch's prompt chunks (a long prompt comes in several
// passes) and one token of each running sequence decoding alongside; samples each finished
// prompt's first token and each decoding sequence's next.
// A serial node over the engine's one ModelRunner; its results go back to the scheduler
// (the loop edge) and on to detokenize.
#pragma once

#include "graph/engine_context.h"
#include "graph/stage_registry.h"

namespace pipeline {

class PrefillStage : public Stage {
 public:
  static StageInfo info();
  explicit PrefillStage(EngineContext& context) : ctx_(context) {}
  void operator()(Message message, const Emit& emit) override;

 private:
  EngineContext& ctx_;
  Logits logits_;  // reused across steps
};

}  // namespace pipeline

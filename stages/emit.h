// emit: stream events → the requests' sinks (on_delta, then on_finish or on_error), each
// request's events in their numbered order whichever body delivers them (ResponseStream).
#pragma once

#include "graph/engine_context.h"
#include "graph/stage_registry.h"

namespace pipeline {

class EmitStage : public Stage {
 public:
  static StageInfo info();
  void operator()(Message message, const Emit& emit) override;
};

}  // namespace pipeline

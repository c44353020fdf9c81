// batch_window: the scheduler's node. New sequences and step results go in; prefill and
// decode batches come out, one forward pass at a time. The node is an async_node over the
// Scheduler (graph/scheduler.h): a message's scheduling pass runs in this node's body, unless
// another thread is in one, and the Scheduler's own thread keeps the batch windows' time.
#pragma once

#include "graph/engine_context.h"
#include "graph/stage_registry.h"

namespace pipeline {

class BatchWindowStage : public Stage {
 public:
  static StageInfo info();
  explicit BatchWindowStage(EngineContext& context) : ctx_(context) {}
  void operator()(Message message, const Emit& emit) override;

 private:
  EngineContext& ctx_;
};

}  // namespace pipeline

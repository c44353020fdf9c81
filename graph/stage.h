// A stage: the body of one flow-graph node. It takes one Message and passes what it makes on
// through `emit` (to the node's successors; the graph builder filters by kind per edge).
#pragma once

#include <functional>

#include "graph/message.h"

namespace pipeline {

using Emit = std::function<void(Message)>;

class Stage {
 public:
  virtual ~Stage() = default;
  // For ordinary stages `emit` is valid during the call only. For asynchronous stages
  // (StageInfo::async) it stays valid for the graph's lifetime and may be called from any
  // thread: it is the async_node's gateway.
  virtual void operator()(Message message, const Emit& emit) = 0;
};

}  // namespace pipeline

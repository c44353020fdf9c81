// A checked GraphPlan (graph_plan.h) → a running tbb::flow::graph.
//
// FlowGraph builds the plan: one node per planned node (a multifunction_node, or an async_node for
// asynchronous stages), each body inside an NVTX range named after the node and counted into
// metrics; and per edge a lightweight filter node that passes on only the kinds the target
// accepts (and counts the target's queue depth).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include "graph/engine_context.h"
#include "graph/graph_plan.h"
#include "graph/metrics.h"

namespace pipeline {

class FlowGraph {
 public:
  FlowGraph(const GraphPlan& plan, EngineContext& context, Metrics& metrics);
  ~FlowGraph();
  FlowGraph(const FlowGraph&) = delete;
  FlowGraph& operator=(const FlowGraph&) = delete;

  // Puts a message into the input node; never blocks. Any thread.
  void put(Message message);
  // Waits until no body runs or is queued.
  void wait();

 private:
  struct Node;
  // Runs `work` in the arena's turn (its FIFO), holding wait() back until it has run.
  void enqueue(std::function<void()> work);
  // The graph runs in an arena of its own, every slot open to oneTBB's workers: the threads
  // that put requests and wait (HTTP handlers, the scheduler, main) never work in it, so a slot
  // kept for one of them, as the default arena keeps one, would leave a core idle in every
  // forward pass. The worker pool is raised by one to fill them all (oneTBB starts one worker
  // fewer than the cores, counting on a caller that joins).
  tbb::global_control workers_;
  tbb::task_arena arena_;   // where put() enqueues and the nodes run
  tbb::flow::graph graph_;  // attached to arena_ in the constructor
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::unique_ptr<tbb::flow::graph_node>> edge_filters_;
  size_t input_ = 0;
};

}  // namespace pipeline

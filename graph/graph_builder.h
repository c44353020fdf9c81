// A config's graph section → a checked plan → a running tbb::flow::graph.
//
// plan_graph checks the spec against the stage registry, each error naming the file, the
// line and the field: unknown stage, duplicate node, unknown node in an edge, a stage
// parameter missing, unknown or of the wrong type, concurrency on a serial stage, an edge that
// carries nothing its target accepts, a message kind with nowhere to go, a missing edge a stage
// needs (batch_window needs every step result: the loop edge), and a node not on a path from
// the input (the node that takes requests) to an output (a node that produces nothing).
//
// FlowGraph builds the plan: one node per planned node (a multifunction_node, or an async_node for
// asynchronous stages), each body inside an NVTX range named after the node and counted into
// metrics; and per edge a lightweight filter node that passes on only the kinds the target
// accepts (and counts the target's queue depth).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include "graph/engine_context.h"
#include "graph/metrics.h"
#include "graph/serve_config.h"
#include "graph/stage_registry.h"

namespace pipeline {

struct PlannedNode {
  GraphNodeSpec spec;
  const StageInfo* stage = nullptr;
};

struct GraphPlan {
  std::vector<PlannedNode> nodes;
  std::vector<std::pair<size_t, size_t>> edges;  // (from, to) node indices, in config order
  size_t input = 0;                              // the node that takes submitted requests
};

// Throws ConfigError ("FILE:LINE: field 'graph.nodes[2].stage': unknown stage 'x' ...").
GraphPlan plan_graph(const ServeConfig& config,
                     const StageRegistry& registry = StageRegistry::global());

// `pipeline graph`: the plan as text (nodes, then edges) or as Graphviz DOT.
std::string describe_graph(const GraphPlan& plan);
std::string graph_to_dot(const GraphPlan& plan);

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

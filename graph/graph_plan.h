// A config's graph section → a checked plan, which FlowGraph (flow_graph.h) runs.
//
// plan_graph checks the spec against the stage registry, each error naming the file, the
// line and the field: unknown stage, duplicate node, unknown node in an edge, a stage
// parameter missing, unknown or of the wrong type, concurrency on a serial stage, an edge that
// carries nothing its target accepts, a message kind with nowhere to go, a missing edge a stage
// needs (batch_window needs every step result: the loop edge), and a node not on a path from
// the input (the node that takes requests) to an output (a node that produces nothing).
#pragma once

#include <string>
#include <utility>
#include <vector>

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

}  // namespace pipeline

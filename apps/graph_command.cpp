// pipeline graph CONFIG [--dot]: checks a config's flow graph and prints its nodes and edges, as
// text or as Graphviz DOT (`| dot -Tsvg > graph.svg`).
#include <cstdio>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "apps/config_overrides.h"
#include "apps/options.h"
#include "graph/graph_plan.h"
#include "graph/serve_config.h"

namespace pipeline {

namespace {

constexpr const char* kUsage =
    "usage: pipeline graph CONFIG [--dot] [--model DIR] [--device D] [--threads N]\n"
    "                      [--set section.key=value ...]\n"
    "Checks CONFIG's flow graph and prints its nodes and edges.\n"
    "  --dot           Graphviz DOT instead of text (| dot -Tsvg > graph.svg)\n"
    "  --model DIR     model.path (the graph does not load it)\n"
    "  --device D      device: cpu, cuda or auto\n"
    "  --threads N     threads: CPU kernel threads\n"
    "  --set K=V       any config field, as for `pipeline run` (repeatable)";

}  // namespace

int graph_command(int argc, char** argv) {
  Options options(argc, argv, kUsage, {"--dot"});
  if (options.help()) return 0;
  const bool dot = options.flag("--dot");
  const std::vector<std::string> overrides = config_overrides(options);
  const std::string config_file = options.finish(1, 1)[0];
  const ServeConfig config = load_serve_config(config_file, overrides);
  const GraphPlan plan = plan_graph(config);
  const std::string text = dot ? graph_to_dot(plan) : describe_graph(plan);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace pipeline

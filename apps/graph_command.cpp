// pipeline graph CONFIG [--dot] [section.key=value ...]: checks a config's flow graph and
// prints its nodes and edges, as text or as Graphviz DOT (`| dot -Tsvg > graph.svg`).
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "apps/commands.h"
#include "graph/graph_builder.h"
#include "graph/serve_config.h"

namespace pipeline {

int graph_command(int argc, char** argv) {
  std::string config_file;
  bool dot = false;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf(
          "usage: pipeline graph CONFIG [--dot] [section.key=value ...]\n"
          "Checks CONFIG's flow graph and prints its nodes and edges (--dot: Graphviz DOT).\n");
      return 0;
    }
    if (arg == "--dot") {
      dot = true;
    } else if (config_file.empty() && arg.find('=') == std::string_view::npos) {
      config_file = arg;
    } else if (arg.find('=') != std::string_view::npos && !arg.starts_with("-")) {
      overrides.emplace_back(arg);
    } else {
      std::fprintf(stderr, "pipeline graph: unexpected argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (config_file.empty()) {
    std::fprintf(stderr, "usage: pipeline graph CONFIG [--dot] [section.key=value ...]\n");
    return 2;
  }
  const ServeConfig config = load_serve_config(config_file, overrides);
  const GraphPlan plan = plan_graph(config);
  const std::string text = dot ? graph_to_dot(plan) : describe_graph(plan);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace pipeline

#include "graph/graph_plan.h"

#include <map>
#include <set>

#include "graph/config_fields.h"

namespace pipeline {
namespace {

// Builds "AT: field 'F': WHAT", AT being where the node or edge was given (FILE:LINE, or the
// override that wrote it).
class Errors {
 public:
  explicit Errors(std::string file) : file_(std::move(file)) {}
  [[noreturn]] void fail(const std::string& at, const std::string& field,
                         const std::string& what) const {
    throw ConfigError((at.empty() ? file_ : at) + ": field '" + field + "': " + what);
  }
  // Where a node's parameter was given: its own line when the file wrote the node.
  std::string param_at(const GraphNodeSpec& node, const YAML::Node& param) const {
    return node.in_file ? file_ + ":" + std::to_string(param.Mark().line + 1) : node.at;
  }

 private:
  std::string file_;
};

std::string node_field(size_t i) {
  return "graph.nodes[" + std::to_string(i) + "]";
}
std::string edge_field(size_t i) {
  return "graph.edges[" + std::to_string(i) + "]";
}

// The graph's node names, for an edge that names none of them; and the node that runs `name`,
// where `name` is a stage's (an edge written with the stage chain's names).
std::string node_names(const GraphSpec& spec, const std::string& name) {
  std::string names, runs;
  for (const auto& node : spec.nodes) {
    names += (names.empty() ? "" : ", ") + node.name;
    if (node.stage == name) runs = "; node '" + node.name + "' runs stage '" + name + "'";
  }
  return names + runs;
}

std::string param_names(const StageInfo& stage) {
  std::string names;
  for (const auto& param : stage.params) names += (names.empty() ? "" : ", ") + param.name;
  return names;
}

bool has_type(const YAML::Node& value, ParamType type) {
  if (!value.IsScalar()) return false;
  try {
    switch (type) {
      case ParamType::Integer:
        yaml_integer<long long>(value);
        return true;
      case ParamType::Number:
        value.as<double>();
        return true;
      case ParamType::Boolean:
        value.as<bool>();
        return true;
      case ParamType::String:
        return true;
    }
  } catch (const YAML::Exception&) {
  }
  return false;
}

void check_params(const Errors& errors, size_t index, const PlannedNode& node) {
  const auto& stage = *node.stage;
  static const std::set<std::string> kCommon = {"name", "stage", "concurrency"};
  for (const auto& entry : node.spec.params) {
    const auto key = entry.first.as<std::string>();
    if (kCommon.contains(key)) continue;
    auto it = std::find_if(stage.params.begin(), stage.params.end(),
                           [&](const StageParam& p) { return p.name == key; });
    const auto field = node_field(index) + "." + key;
    if (it == stage.params.end())
      errors.fail(
          errors.param_at(node.spec, entry.first), field,
          "unknown key: a node takes name, stage and concurrency" +
              (stage.params.empty()
                   ? ", and stage '" + stage.name + "' declares no parameters"
                   : ", and stage '" + stage.name + "' the parameters " + param_names(stage)));
    if (!has_type(entry.second, it->type))
      errors.fail(errors.param_at(node.spec, entry.second), field,
                  std::string("expected ") + param_type_name(it->type));
  }
  for (const auto& param : stage.params)
    if (param.required && !node.spec.params[param.name])
      errors.fail(node.spec.at, node_field(index) + "." + param.name,
                  "stage '" + stage.name + "' requires this parameter (" +
                      param_type_name(param.type) + ")");
}

// Nodes reachable from `start` along `next`.
std::vector<bool> reachable(size_t count, size_t start,
                            const std::vector<std::vector<size_t>>& next) {
  std::vector<bool> seen(count, false);
  std::vector<size_t> stack{start};
  seen[start] = true;
  while (!stack.empty()) {
    const size_t at = stack.back();
    stack.pop_back();
    for (size_t to : next[at])
      if (!seen[to]) seen[to] = true, stack.push_back(to);
  }
  return seen;
}

void check_flow(const Errors& errors, const GraphPlan& plan,
                const std::vector<GraphEdgeSpec>& edge_specs) {
  const size_t n = plan.nodes.size();
  auto name = [&](size_t i) { return "'" + plan.nodes[i].spec.name + "'"; };
  std::vector<std::vector<size_t>> next(n), prev(n);
  for (const auto& [from, to] : plan.edges) next[from].push_back(to), prev[to].push_back(from);

  const bool has_output =
      std::any_of(plan.nodes.begin(), plan.nodes.end(),
                  [](const PlannedNode& node) { return !node.stage->produces; });
  if (!has_output)
    errors.fail(plan.nodes.front().spec.at, "graph.nodes",
                "the graph has no output: no node's stage delivers results (an emit stage)");
  const auto from_input = reachable(n, plan.input, next);
  std::vector<bool> to_output(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (plan.nodes[i].stage->produces) continue;
    const auto back = reachable(n, i, prev);
    for (size_t j = 0; j < n; ++j) to_output[j] = to_output[j] || back[j];
  }
  for (size_t i = 0; i < n; ++i)
    if (!from_input[i] || !to_output[i])
      errors.fail(plan.nodes[i].spec.at, node_field(i),
                  "node " + name(i) + " is not on a path from the input " + name(plan.input) +
                      " to an output");

  for (size_t e = 0; e < plan.edges.size(); ++e) {
    const auto [from, to] = plan.edges[e];
    const auto carried = plan.nodes[from].stage->produces & plan.nodes[to].stage->accepts;
    if (!carried)
      errors.fail(edge_specs[e].at, edge_field(e),
                  "edge " + name(from) + "->" + name(to) + " carries nothing: " + name(to) +
                      " accepts " + describe_kinds(plan.nodes[to].stage->accepts) + ", " +
                      name(from) + " produces " + describe_kinds(plan.nodes[from].stage->produces));
  }
  for (size_t a = 0; a < n; ++a) {
    KindSet delivered = 0;
    for (size_t b : next[a]) delivered |= plan.nodes[b].stage->accepts;
    const KindSet lost = plan.nodes[a].stage->produces & ~delivered;
    if (lost)
      errors.fail(plan.nodes[a].spec.at, node_field(a),
                  "node " + name(a) + " produces " + describe_kinds(lost) +
                      " but no edge takes them to a node that accepts them");
  }
  for (size_t b = 0; b < n; ++b) {
    for (size_t a = 0; a < n; ++a) {
      const KindSet needed = plan.nodes[b].stage->needs_every & plan.nodes[a].stage->produces;
      if (!needed || std::find(next[a].begin(), next[a].end(), b) != next[a].end()) continue;
      errors.fail(plan.nodes[a].spec.at, node_field(a),
                  "node " + name(a) + " produces " + describe_kinds(needed) + ", which " + name(b) +
                      " (stage " + plan.nodes[b].stage->name +
                      ") needs from every producer, but there is no edge " +
                      plan.nodes[a].spec.name + "->" + plan.nodes[b].spec.name);
    }
  }
}

}  // namespace

GraphPlan plan_graph(const ServeConfig& config, const StageRegistry& registry) {
  const Errors errors(config.file.string());
  const auto& spec = config.graph;
  GraphPlan plan;
  std::map<std::string, size_t> by_name;
  std::map<const StageInfo*, size_t> single;  // stages that may appear once -> their node
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const auto& node = spec.nodes[i];
    if (auto it = by_name.find(node.name); it != by_name.end())
      errors.fail(node.at, node_field(i) + ".name",
                  "duplicate node '" + node.name + "' (first defined at " +
                      spec.nodes[it->second].at + ")");
    const StageInfo* stage = registry.find(node.stage);
    if (!stage) {
      std::string known;
      for (const auto& n : registry.names()) known += (known.empty() ? "" : ", ") + n;
      errors.fail(node.at, node_field(i) + ".stage",
                  "unknown stage '" + node.stage + "' (known: " + known + ")");
    }
    if (stage->serial && node.concurrency != 1)
      errors.fail(node.at, node_field(i) + ".concurrency",
                  "stage '" + stage->name + "' runs one message at a time; it must be serial");
    // The scheduler and the model steps own the runner and the KV blocks, detokenize and emit
    // each request's text and event order: a second node of one of them would run every
    // message twice (the graph hands a message to each node that accepts it).
    if (stage->serial || stage->needs_every) {
      if (const auto [first, added] = single.emplace(stage, i); !added)
        errors.fail(node.at, node_field(i) + ".stage",
                    "stage '" + stage->name + "' may appear once; node '" + node.name +
                        "' repeats node '" + spec.nodes[first->second].name + "' (" +
                        spec.nodes[first->second].at + ")");
    }
    by_name.emplace(node.name, i);
    plan.nodes.push_back({node, stage});
    check_params(errors, i, plan.nodes.back());
  }

  std::set<std::pair<size_t, size_t>> seen;
  for (size_t e = 0; e < spec.edges.size(); ++e) {
    const auto& edge = spec.edges[e];
    auto lookup = [&](const std::string& n) {
      auto it = by_name.find(n);
      if (it == by_name.end())
        errors.fail(edge.at, edge_field(e),
                    "unknown node '" + n + "' in edge " + edge.from + "->" + edge.to +
                        " (edges join nodes by name: " + node_names(spec, n) + ")");
      return it->second;
    };
    const auto pair = std::make_pair(lookup(edge.from), lookup(edge.to));
    if (!seen.insert(pair).second)
      errors.fail(edge.at, edge_field(e),
                  "edge " + edge.from + "->" + edge.to + " is listed twice");
    plan.edges.push_back(pair);
  }

  std::vector<size_t> inputs;
  for (size_t i = 0; i < plan.nodes.size(); ++i)
    if (plan.nodes[i].stage->accepts & kind_of<Submitted>()) inputs.push_back(i);
  if (inputs.size() != 1)
    errors.fail(spec.nodes.empty() ? "" : spec.nodes.front().at, "graph.nodes",
                "the graph needs exactly one node that takes submitted requests (a tokenize "
                "stage); it has " +
                    std::to_string(inputs.size()));
  plan.input = inputs.front();
  check_flow(errors, plan, spec.edges);
  return plan;
}

std::string describe_graph(const GraphPlan& plan) {
  std::string out = "nodes:\n";
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    const auto& node = plan.nodes[i];
    const int c = node.spec.concurrency;
    out += "  " + node.spec.name + "  stage=" + node.stage->name +
           "  concurrency=" + (c == 0 ? std::string("unlimited") : std::to_string(c)) +
           (node.stage->async ? "  (async)" : "") + (i == plan.input ? "  (input)" : "") +
           (node.stage->produces ? "" : "  (output)") + "\n      " + node.stage->summary + "\n";
  }
  out += "edges:\n";
  for (const auto& [from, to] : plan.edges) {
    const KindSet carried = plan.nodes[from].stage->produces & plan.nodes[to].stage->accepts;
    out += "  " + plan.nodes[from].spec.name + " -> " + plan.nodes[to].spec.name + "  (" +
           describe_kinds(carried) + ")\n";
  }
  return out;
}

std::string graph_to_dot(const GraphPlan& plan) {
  std::string out = "digraph pipeline {\n  rankdir=LR;\n  node [shape=box];\n";
  for (const auto& node : plan.nodes) {
    out += "  \"" + node.spec.name + "\" [label=\"" + node.spec.name + "\\n(" + node.stage->name +
           ")\"" + (node.stage->serial ? ", style=bold" : "") + "];\n";
  }
  for (const auto& [from, to] : plan.edges) {
    const KindSet carried = plan.nodes[from].stage->produces & plan.nodes[to].stage->accepts;
    out += "  \"" + plan.nodes[from].spec.name + "\" -> \"" + plan.nodes[to].spec.name +
           "\" [label=\"" + describe_kinds(carried) + "\"];\n";
  }
  return out + "}\n";
}

}  // namespace pipeline

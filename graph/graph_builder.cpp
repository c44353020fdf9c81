#include "graph/graph_builder.h"

#include <oneapi/tbb/info.h>

#include <chrono>
#include <map>
#include <set>

#include "graph/log.h"
#include "graph/nvtx.h"

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

// ---- The running graph.

using Ports = std::tuple<Message>;
using FunctionNode = tbb::flow::multifunction_node<Message, Ports>;
using AsyncNode = tbb::flow::async_node<Message, Message>;
using EdgeFilter = tbb::flow::multifunction_node<Message, Ports, tbb::flow::lightweight>;

struct FlowGraph::Node {
  Node(const PlannedNode& planned, EngineContext& context, Metrics& metrics)
      : name(planned.spec.name),
        stage(planned.stage->make(planned.spec, context)),
        accepts(planned.stage->accepts),
        metrics(metrics.add_stage(planned.spec.name)),
        nvtx(planned.spec.name) {}

  // Every body: an NVTX range, a call count and latency, and no exception escapes into TBB.
  void run(const Message& message, const Emit& emit) {
    metrics.queue_depth.add(-1);
    NvtxRange range(nvtx);
    const auto start = std::chrono::steady_clock::now();
    try {
      (*stage)(message, emit);
    } catch (const std::exception& e) {
      log_line("node %s: %s", name.c_str(), e.what());
      fail_carried(message, emit, e.what());
    }
    metrics.calls.add();
    metrics.seconds.observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  // After the stage threw: every sequence the message carries ends with a 500, rather than
  // wait for an answer that will not come (holding its place in the queue and its blocks). A
  // forward pass's batch also gets its result, all failed, since the scheduler waits for one
  // before it schedules the next pass.
  void fail_carried(const Message& message, const Emit& emit, const std::string& what) {
    const RequestError error{500, "internal error in graph node " + name + ": " + what,
                             "server_error", "", ""};
    std::vector<SequencePtr> seqs = carried_sequences(message);
    for (const SequencePtr& seq : seqs) seq->stream.fail(error);
    const bool prefill = std::holds_alternative<PrefillBatch>(message);
    if (!prefill && !std::holds_alternative<DecodeBatch>(message)) return;
    StepResult result;
    result.prefill = prefill;
    result.failed = std::move(seqs);
    try {
      emit(std::move(result));
    } catch (const std::exception& e) {
      log_line("node %s: its failed step's result was lost too: %s", name.c_str(), e.what());
    }
  }

  std::string name;
  std::unique_ptr<Stage> stage;
  KindSet accepts;
  StageMetrics& metrics;
  NvtxName nvtx;
  std::unique_ptr<tbb::flow::graph_node> node;
  tbb::flow::receiver<Message>* input = nullptr;
  tbb::flow::sender<Message>* output = nullptr;
};

FlowGraph::FlowGraph(const GraphPlan& plan, EngineContext& context, Metrics& metrics)
    : workers_(tbb::global_control::max_allowed_parallelism,
               size_t(tbb::info::default_concurrency()) + 1),
      arena_(tbb::info::default_concurrency(), /*reserved_for_masters=*/0) {
  arena_.execute([this] { graph_.reset(); });  // a graph runs in the arena it was last reset in
  for (const auto& planned : plan.nodes) {
    auto n = std::make_unique<Node>(planned, context, metrics);
    Node* self = n.get();
    const size_t concurrency = planned.spec.concurrency == 0 ? size_t(tbb::flow::unlimited)
                                                             : size_t(planned.spec.concurrency);
    if (planned.stage->async) {
      auto node = std::make_unique<AsyncNode>(
          graph_, concurrency, [self](const Message& m, AsyncNode::gateway_type& gateway) {
            self->run(m, [&gateway](Message out) { gateway.try_put(out); });
          });
      n->input = node.get();
      n->output = &tbb::flow::output_port<0>(*node);  // async_node takes successors on its port
      n->node = std::move(node);
    } else {
      auto node = std::make_unique<FunctionNode>(
          graph_, concurrency, [self](const Message& m, FunctionNode::output_ports_type& ports) {
            self->run(m, [&ports](Message out) { std::get<0>(ports).try_put(out); });
          });
      n->input = node.get();
      n->output = &tbb::flow::output_port<0>(*node);
      n->node = std::move(node);
    }
    nodes_.push_back(std::move(n));
  }
  for (const auto& [from, to] : plan.edges) {
    Node* target = nodes_[to].get();
    auto filter = std::make_unique<EdgeFilter>(
        graph_, tbb::flow::unlimited,
        [target](const Message& m, EdgeFilter::output_ports_type& ports) {
          if (!(kind_of(m) & target->accepts)) return;
          target->metrics.queue_depth.add(1);
          std::get<0>(ports).try_put(m);
        });
    tbb::flow::make_edge(*nodes_[from]->output, *filter);
    tbb::flow::make_edge(tbb::flow::output_port<0>(*filter), *target->input);
    edge_filters_.push_back(std::move(filter));
  }
  input_ = plan.input;
}

FlowGraph::~FlowGraph() {
  graph_.wait_for_all();
}

// A try_put from a thread outside the graph's arena would leave the input's task in that
// thread's slot, where a worker busy with the decode loop only steals it once the loop idles;
// enqueued, the put takes its turn in the arena's FIFO with the scheduler's batches (which
// reach the graph the same way, through the async_node gateway). The reserved wait keeps
// wait() from returning while the put is still queued.
void FlowGraph::put(Message message) {
  graph_.reserve_wait();
  arena_.enqueue([this, message = std::move(message)] {
    nodes_[input_]->metrics.queue_depth.add(1);
    nodes_[input_]->input->try_put(message);
    graph_.release_wait();
  });
}

void FlowGraph::wait() {
  graph_.wait_for_all();
}

}  // namespace pipeline

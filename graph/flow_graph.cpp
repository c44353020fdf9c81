#include "graph/flow_graph.h"

#include <oneapi/tbb/info.h>

#include <chrono>

#include "graph/log.h"
#include "graph/nvtx.h"
#include "model/seconds.h"

namespace pipeline {
namespace {

using Ports = std::tuple<Message>;
using FunctionNode = tbb::flow::multifunction_node<Message, Ports>;
using AsyncNode = tbb::flow::async_node<Message, Message>;
using EdgeFilter = tbb::flow::multifunction_node<Message, Ports, tbb::flow::lightweight>;

}  // namespace

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
    metrics.seconds.observe(seconds_since(start));
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
          graph_, concurrency, [this, self](const Message& m, AsyncNode::gateway_type& gateway) {
            // Through the arena's FIFO, as put() hands requests in. The node's work (the
            // scheduler's pass) often runs on this worker (Scheduler::post), and a worker runs
            // its own spawns before anything the arena holds: a decode step whose successor
            // spawned the next one would keep a new request's tokenize waiting until the
            // running batch ended.
            self->run(m, [this, &gateway](Message out) {
              enqueue([&gateway, out = std::move(out)] { gateway.try_put(out); });
            });
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
// reach the graph the same way, see the constructor). The reserved wait keeps wait() from
// returning while the put is still queued.
void FlowGraph::put(Message message) {
  enqueue([this, message = std::move(message)] {
    nodes_[input_]->metrics.queue_depth.add(1);
    nodes_[input_]->input->try_put(message);
  });
}

void FlowGraph::enqueue(std::function<void()> work) {
  graph_.reserve_wait();
  arena_.enqueue([this, work = std::move(work)] {
    work();
    graph_.release_wait();
  });
}

void FlowGraph::wait() {
  graph_.wait_for_all();
}

}  // namespace pipeline

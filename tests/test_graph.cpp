// The graph spec → flow graph: every validation error names file, line and field; a stage
// swapped by one line of YAML (a stage registered by this test) runs in the engine.
#include <gtest/gtest.h>

#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_for.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <fstream>
#include <thread>

#include "graph/engine.h"
#include "graph/graph_plan.h"
#include "stages/emit.h"
#include "tests/support/collecting_sink.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

// An output stage with a required integer parameter, to check parameter validation.
StageInfo counted_sink_info() {
  StageInfo info;
  info.name = "test_counted_sink";
  info.summary = "test output with a required parameter";
  info.accepts = kind_of<StreamEvents>();
  info.params = {{"limit", ParamType::Integer, true}, {"label", ParamType::String, false}};
  info.make = [](const GraphNodeSpec&, EngineContext&) { return std::make_unique<EmitStage>(); };
  return info;
}

// emit, but shouting: upper-cases every delta's text before delivering it.
class ShoutEmit : public Stage {
 public:
  void operator()(Message message, const Emit& emit) override {
    for (auto& event : std::get<StreamEvents>(message).events)
      if (auto* delta = std::get_if<Delta>(&event.payload))
        for (auto& c : delta->text) c = char(std::toupper(static_cast<unsigned char>(c)));
    EmitStage()(std::move(message), emit);
  }
};

StageInfo shout_emit_info() {
  StageInfo info = EmitStage::info();
  info.name = "test_shout_emit";
  info.make = [](const GraphNodeSpec&, EngineContext&) { return std::make_unique<ShoutEmit>(); };
  return info;
}

// emit, after measuring once how many threads a parallel loop in a node's body gets at once:
// each of default_concurrency() iterations waits (up to a second) for all of them to be running.
class ThreadProbeEmit : public Stage {
 public:
  static inline std::atomic<int> most_at_once{0};

  void operator()(Message message, const Emit& emit) override {
    if (!probed_.exchange(true)) most_at_once = threads_at_once();
    EmitStage()(std::move(message), emit);
  }

 private:
  static int threads_at_once() {
    const int wanted = tbb::info::default_concurrency();
    std::atomic<int> running{0}, most{0};
    tbb::parallel_for(
        0, wanted,
        [&](int) {
          const int now = ++running;
          int seen = most.load();
          while (seen < now && !most.compare_exchange_weak(seen, now)) {
          }
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          while (most.load() < wanted && std::chrono::steady_clock::now() < give_up)
            std::this_thread::yield();
          --running;
        },
        tbb::simple_partitioner());
    return most.load();
  }

  std::atomic<bool> probed_{false};
};

StageInfo thread_probe_emit_info() {
  StageInfo info = EmitStage::info();
  info.name = "test_thread_probe_emit";
  info.make = [](const GraphNodeSpec&, EngineContext&) {
    return std::make_unique<ThreadProbeEmit>();
  };
  return info;
}

class GraphTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto& registry = StageRegistry::global();
    if (!registry.find("test_counted_sink")) registry.add(counted_sink_info());
    if (!registry.find("test_shout_emit")) registry.add(shout_emit_info());
    if (!registry.find("test_thread_probe_emit")) registry.add(thread_probe_emit_info());
  }
  void SetUp() override { dir_ = testing::make_temp_dir("graph-builder"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path write(const std::string& graph) {
    const auto path = dir_ / "serve.yaml";
    std::ofstream(path) << "model: {path: " << testing::shared_path("models/stories260K").string()
                        << ", chat_template: raw}\ndevice: cpu\nthreads: 2\n"
                        << "scheduler: {window_ms: 0}\n"
                        << graph;
    return path;
  }
  std::string file() const { return (dir_ / "serve.yaml").string(); }

  std::string error_of(const std::string& graph) {
    try {
      plan_graph(load_serve_config(write(graph)));
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error for:\n" << graph;
    return "";
  }

  std::filesystem::path dir_;
};

// The default six nodes (lines 7..12 of the file) and edges (line 13), with the last node or
// the edges replaced.
std::string six_nodes(const std::string& emit_node = "{ name: emit, stage: emit }",
                      const std::string& edges =
                          "[tokenize->batch, tokenize->emit, batch->prefill, batch->decode, "
                          "prefill->batch, decode->batch, prefill->detok, decode->detok, "
                          "detok->emit]") {
  return "graph:\n  nodes:\n"
         "    - { name: tokenize, stage: tokenize, concurrency: 2 }\n"
         "    - { name: batch, stage: batch_window }\n"
         "    - { name: prefill, stage: prefill }\n"
         "    - { name: decode, stage: decode_step }\n"
         "    - { name: detok, stage: detokenize, concurrency: unlimited }\n"
         "    - " +
         emit_node +
         "\n"
         "  edges: " +
         edges + "\n";
}

TEST_F(GraphTest, TheDefaultGraphPlans) {
  const auto plan = plan_graph(load_serve_config(write(six_nodes())));
  ASSERT_EQ(plan.nodes.size(), 6u);
  EXPECT_EQ(plan.nodes[plan.input].spec.name, "tokenize");
  EXPECT_EQ(plan.edges.size(), 9u);
  const auto text = describe_graph(plan);
  EXPECT_NE(text.find("decode -> batch  (step results)"), std::string::npos) << text;
  const auto dot = graph_to_dot(plan);
  EXPECT_NE(dot.find("\"prefill\" -> \"detok\""), std::string::npos) << dot;
}

TEST_F(GraphTest, UnknownStage) {
  const auto error = error_of(six_nodes("{ name: emit, stage: emitt }"));
  EXPECT_EQ(error.substr(0, error.find(" (known")),
            file() + ":12: field 'graph.nodes[5].stage': unknown stage 'emitt'");
  EXPECT_NE(error.find("detokenize"), std::string::npos) << "the known stages are listed";
}

TEST_F(GraphTest, DuplicateNode) {
  EXPECT_EQ(error_of(six_nodes("{ name: detok, stage: emit }")),
            file() + ":12: field 'graph.nodes[5].name': duplicate node 'detok' (first defined at " +
                file() + ":11)");
}

// A graph written by --set overrides has no line of the file: its errors name the override.
TEST_F(GraphTest, ErrorsInAGraphAnOverrideWroteNameTheOverride) {
  const auto base = write("");
  const std::string nodes =
      "graph.nodes=[{name: tokenize, stage: tokenize}, {name: batch, stage: batch_window}, "
      "{name: prefill, stage: prefill}, {name: decode, stage: decode_step}, "
      "{name: detok, stage: detokenize}, {name: emit, stage: emitx}]";
  const std::string edges =
      "graph.edges=[tokenize->batch, tokenize->emit, batch->prefill, batch->decode, "
      "prefill->batch, decode->batch, prefill->detok, decode->detok, detok->emit, detok->nowhere]";
  const auto error = [&](const std::vector<std::string>& overrides) {
    try {
      plan_graph(load_serve_config(base, overrides));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string unknown_stage = error({nodes, edges});
  EXPECT_EQ(unknown_stage.substr(0, unknown_stage.find(" (known")),
            base.string() + ": override '" + nodes +
                "': field 'graph.nodes[5].stage': unknown stage 'emitx'");
  std::string good_nodes = nodes;
  good_nodes.replace(good_nodes.find("emitx"), 5, "emit");
  EXPECT_EQ(error({good_nodes, edges}),
            base.string() + ": override '" + edges +
                "': field 'graph.edges[9]': unknown node 'nowhere' in edge detok->nowhere (edges "
                "join nodes by name: tokenize, batch, prefill, decode, detok, emit)");
}

TEST_F(GraphTest, UnknownNodeInAnEdge) {
  const auto error = error_of(
      six_nodes("{ name: emit, stage: emit }",
                "[tokenize->batch, tokenize->emit, batch->prefill, batch->decode, prefill->batch, "
                "decode->batch, prefill->detok, decode->detok, detok->emitter]"));
  EXPECT_EQ(error,
            file() +
                ":13: field 'graph.edges[8]': unknown node 'emitter' in edge detok->emitter (edges "
                "join nodes by name: tokenize, batch, prefill, decode, detok, emit)");
  // Written with the stage chain's names: the node that runs the stage is named.
  const auto by_stage = error_of(
      six_nodes("{ name: emit, stage: emit }",
                "[tokenize->batch, tokenize->emit, batch->prefill, batch->decode, prefill->batch, "
                "decode->batch, prefill->detok, decode->detok, detokenize->emit]"));
  EXPECT_NE(by_stage.find("unknown node 'detokenize' in edge detokenize->emit (edges join nodes by "
                          "name: tokenize, batch, prefill, decode, detok, emit; node 'detok' runs "
                          "stage 'detokenize')"),
            std::string::npos)
      << by_stage;
}

TEST_F(GraphTest, AMissingLoopEdge) {
  const auto error = error_of(
      six_nodes("{ name: emit, stage: emit }",
                "[tokenize->batch, tokenize->emit, batch->prefill, batch->decode, prefill->batch, "
                "prefill->detok, decode->detok, detok->emit]"));
  EXPECT_NE(error.find(file() + ":10: field 'graph.nodes[3]': node 'decode' produces step results"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("no edge decode->batch"), std::string::npos) << error;
}

TEST_F(GraphTest, AnEdgeThatCarriesNothing) {
  const auto error = error_of(
      six_nodes("{ name: emit, stage: emit }",
                "[tokenize->batch, tokenize->emit, batch->prefill, batch->decode, prefill->batch, "
                "decode->batch, prefill->detok, decode->detok, detok->emit, tokenize->prefill]"));
  EXPECT_NE(error.find(file() +
                       ":13: field 'graph.edges[9]': edge 'tokenize'->'prefill' carries nothing"),
            std::string::npos)
      << error;
}

TEST_F(GraphTest, ANodeOffThePathFromInputToOutput) {
  // A second output that nothing feeds.
  std::string graph = six_nodes();
  graph.insert(graph.find("  edges:"),
               "    - { name: orphan, stage: test_counted_sink, limit: 1 }\n");
  EXPECT_EQ(error_of(graph), file() +
                                 ":13: field 'graph.nodes[6]': node 'orphan' is not on a "
                                 "path from the input 'tokenize' to an output");
}

TEST_F(GraphTest, AGraphWithoutAnOutputSaysSo) {
  const auto error = error_of(
      "graph:\n  nodes:\n    - { name: tokenize, stage: tokenize }\n"
      "    - { name: batch, stage: batch_window }\n  edges: [tokenize->batch]\n");
  EXPECT_NE(error.find("field 'graph.nodes': the graph has no output"), std::string::npos) << error;
}

// Two nodes of a stage that owns the runner, the scheduler's state or a request's text and event
// order would each run every message they are handed: the graph refuses them.
TEST_F(GraphTest, StatefulStagesAppearOnce) {
  std::string graph = six_nodes("{ name: emit, stage: emit }",
                                "[tokenize->batch, tokenize->emit, batch->prefill, batch->decode, "
                                "prefill->batch, decode->batch, prefill->detok, decode->detok, "
                                "detok->emit, detok->emit2, tokenize->emit2]");
  graph.insert(graph.find("  edges:"), "    - { name: emit2, stage: emit }\n");
  EXPECT_EQ(error_of(graph), file() +
                                 ":13: field 'graph.nodes[6].stage': stage 'emit' may appear "
                                 "once; node 'emit2' repeats node 'emit' (" +
                                 file() + ":12)");
  for (const char* stage : {"batch_window", "prefill", "decode_step", "detokenize"}) {
    std::string twice = six_nodes();
    twice.insert(twice.find("  edges:"),
                 std::string("    - { name: second, stage: ") + stage + " }\n");
    EXPECT_NE(error_of(twice).find("stage '" + std::string(stage) + "' may appear once"),
              std::string::npos)
        << stage;
  }
}

TEST_F(GraphTest, SerialStagesStaySerial) {
  std::string graph = six_nodes();
  graph.replace(graph.find("{ name: prefill, stage: prefill }"),
                std::string("{ name: prefill, stage: prefill }").size(),
                "{ name: prefill, stage: prefill, concurrency: 4 }");
  EXPECT_EQ(error_of(graph), file() +
                                 ":9: field 'graph.nodes[2].concurrency': stage 'prefill' "
                                 "runs one message at a time; it must be serial");
}

TEST_F(GraphTest, StageParameters) {
  EXPECT_EQ(error_of(six_nodes("{ name: emit, stage: test_counted_sink }")),
            file() +
                ":12: field 'graph.nodes[5].limit': stage 'test_counted_sink' requires "
                "this parameter (an integer)");
  EXPECT_EQ(error_of(six_nodes("{ name: emit, stage: test_counted_sink, limit: many }")),
            file() + ":12: field 'graph.nodes[5].limit': expected an integer");
  EXPECT_EQ(error_of(six_nodes("{ name: emit, stage: test_counted_sink, limit: 3, colour: red }")),
            file() +
                ":12: field 'graph.nodes[5].colour': unknown key: a node takes name, stage and "
                "concurrency, and stage 'test_counted_sink' the parameters limit, label");
  EXPECT_NO_THROW(plan_graph(load_serve_config(
      write(six_nodes("{ name: emit, stage: test_counted_sink, limit: 3, label: x }")))));
  // A leading zero is decimal, as in every other integer field (as octal, 08 was no integer).
  EXPECT_NO_THROW(plan_graph(
      load_serve_config(write(six_nodes("{ name: emit, stage: test_counted_sink, limit: 08 }")))));
  EXPECT_EQ(error_of(six_nodes("{ name: emit, stage: emit, limit: 3 }")),
            file() +
                ":12: field 'graph.nodes[5].limit': unknown key: a node takes name, stage "
                "and concurrency, and stage 'emit' declares no parameters");
}

std::string run_one(const std::filesystem::path& config) {
  Engine engine(load_serve_config(config));
  auto request = std::make_shared<Request>();
  request->id = "cmpl-graph";
  request->chat = false;
  request->prompt = "Once upon a time";
  request->sampling.temperature = 0.0f;
  request->max_tokens = 40;
  auto sink = std::make_shared<testing::CollectingSink>();
  request->sink = sink;
  EXPECT_EQ(engine.submit(request), SubmitStatus::Accepted);
  EXPECT_TRUE(sink->wait());
  EXPECT_TRUE(sink->completion().has_value());
  return sink->text();
}

TEST_F(GraphTest, AStageSwappedInYamlRunsInTheEngine) {
  const std::string plain = run_one(write(six_nodes()));
  const std::string shouted = run_one(write(six_nodes("{ name: emit, stage: test_shout_emit }")));
  ASSERT_FALSE(plain.empty());
  std::string upper = plain;
  for (auto& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(shouted, upper);
  EXPECT_NE(shouted, plain);
}

// The thread that submits a request waits outside the graph (as the HTTP handlers and main do),
// so the graph's nodes, and the forward passes in them, must get every core without it.
TEST_F(GraphTest, ANodesParallelLoopRunsOnEveryCoreWhileTheSubmitterWaits) {
  ASSERT_FALSE(run_one(write(six_nodes("{ name: emit, stage: test_thread_probe_emit }"))).empty());
  EXPECT_EQ(ThreadProbeEmit::most_at_once.load(), tbb::info::default_concurrency());
}

}  // namespace
}  // namespace pipeline

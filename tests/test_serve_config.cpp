// load_serve_config: defaults, overrides, relative paths, and errors that name file:line:field.
#include <gtest/gtest.h>

#include <fstream>

#include "graph/serve_config.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

class ServeConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("serve-config"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path write(const std::string& text) {
    const auto path = dir_ / "serve.yaml";
    std::ofstream(path) << text;
    return path;
  }

  // The ConfigError message for `text` (with overrides); fails the test when none is thrown.
  std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
    try {
      load_serve_config(write(text), overrides);
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no ConfigError for:\n" << text;
    return "";
  }

  std::filesystem::path dir_;
};

TEST_F(ServeConfigTest, EveryFieldDefaults) {
  const auto config = load_serve_config(write("model: {path: m}\n"));
  EXPECT_EQ(config.model.path, (dir_ / "m").lexically_normal());
  EXPECT_EQ(config.model.chat_template, "llama2");
  EXPECT_EQ(config.device, "auto");
  EXPECT_EQ(config.threads, 0);
  EXPECT_EQ(config.server.host, "127.0.0.1");
  EXPECT_EQ(config.server.port, 2000);
  EXPECT_EQ(config.server.api_key, "");
  EXPECT_EQ(config.server.max_queue, 256);
  EXPECT_EQ(config.server.shutdown_grace_s, 30);
  EXPECT_EQ(config.server.sse_keepalive_s, 15);
  EXPECT_EQ(config.server.log_requests, std::nullopt);  // run: true, batch: false
  EXPECT_TRUE(config.server.logs_requests());
  EXPECT_EQ(config.scheduler.window_ms, 200);
  EXPECT_EQ(config.scheduler.max_batch, 16);
  EXPECT_EQ(config.scheduler.max_num_seqs, 64);
  EXPECT_FALSE(config.scheduler.max_prefill_tokens.has_value());  // the device's default
  EXPECT_TRUE(config.scheduler.enable_prefix_caching);
  EXPECT_EQ(config.scheduler.kv_block_size, 16);
  EXPECT_DOUBLE_EQ(config.scheduler.kv_cache_fraction, 0.9);
  EXPECT_EQ(config.scheduler.kv_cache_blocks, 0);
  EXPECT_EQ(config.scheduler.kv_cache_dtype, std::nullopt);  // auto
  EXPECT_FALSE(config.scheduler.priority_policy);            // fcfs
  EXPECT_EQ(config.scheduler.log_passes, std::nullopt);      // run: true, batch: false
  EXPECT_EQ(config.model.matmul_activations, DType::BF16);
  EXPECT_EQ(config.sampling.max_tokens, 1024);
  EXPECT_FLOAT_EQ(config.sampling.params.temperature, 1.0f);
  // The default graph: the six stages.
  ASSERT_EQ(config.graph.nodes.size(), 6u);
  EXPECT_EQ(config.graph.nodes[0].stage, "tokenize");
  EXPECT_EQ(config.graph.nodes[4].concurrency, 0);  // detokenize: unlimited
  EXPECT_FALSE(config.graph.edges.empty());
}

TEST_F(ServeConfigTest, ReadsEverySection) {
  const auto config = load_serve_config(write(R"(
model: {path: /abs/model, chat_template: raw, name: tiny, matmul_activations: f32}
device: cpu
threads: 2
server: {host: 0.0.0.0, port: 8080, api_key: secret, max_queue: 4, shutdown_grace_s: 1, sse_keepalive_s: 0, log_requests: false}
scheduler: {window_ms: 0, max_batch: 2, max_num_seqs: 3, max_prefill_tokens: 64, policy: priority, enable_prefix_caching: false, kv_block_size: 8, kv_cache_fraction: 0.5, kv_cache_blocks: 40, kv_cache_dtype: f32, log_passes: false}
sampling: {temperature: 0.7, top_p: 0.9, top_k: 40, repeat_last_n: 64, repetition_penalty: 1.1, seed: 7, max_tokens: 99}
graph:
  nodes:
    - {name: t, stage: tokenize, concurrency: 3}
    - {name: e, stage: emit, concurrency: serial}
  edges: [t->e, {from: e, to: t}]
)"));
  EXPECT_EQ(config.model.path, "/abs/model");
  EXPECT_EQ(config.model.name, "tiny");
  EXPECT_EQ(config.model.matmul_activations, DType::F32);
  EXPECT_EQ(config.device, "cpu");
  EXPECT_EQ(config.threads, 2);
  EXPECT_EQ(config.server.api_key, "secret");
  EXPECT_EQ(config.server.port, 8080);
  EXPECT_EQ(config.server.log_requests, false);
  EXPECT_EQ(config.server.sse_keepalive_s, 0);
  EXPECT_EQ(config.scheduler.window_ms, 0);
  EXPECT_EQ(config.scheduler.max_prefill_tokens, 64);
  EXPECT_FALSE(config.scheduler.enable_prefix_caching);
  EXPECT_EQ(config.scheduler.kv_cache_blocks, 40);
  EXPECT_EQ(config.scheduler.kv_cache_dtype, DType::F32);
  EXPECT_TRUE(config.scheduler.priority_policy);
  EXPECT_EQ(config.scheduler.log_passes, false);
  EXPECT_FLOAT_EQ(config.sampling.params.temperature, 0.7f);
  EXPECT_EQ(config.sampling.params.top_k, 40);
  EXPECT_EQ(config.sampling.params.seed, 7u);
  EXPECT_EQ(config.sampling.max_tokens, 99);
  ASSERT_EQ(config.graph.nodes.size(), 2u);
  EXPECT_EQ(config.graph.nodes[0].concurrency, 3);
  EXPECT_EQ(config.graph.nodes[0].at, (dir_ / "serve.yaml").string() + ":10");
  EXPECT_TRUE(config.graph.nodes[0].in_file);
  EXPECT_EQ(config.graph.nodes[1].concurrency, 1);
  ASSERT_EQ(config.graph.edges.size(), 2u);
  EXPECT_EQ(config.graph.edges[0].from, "t");
  EXPECT_EQ(config.graph.edges[1].to, "t");
}

TEST_F(ServeConfigTest, OverridesApplyBeforeValidation) {
  const auto config = load_serve_config(
      write("model: {path: m}\nscheduler: {window_ms: 200}\n"),
      {"scheduler.window_ms=0", "device=cpu", "server.api_key=k", "model.path=/x/y"});
  EXPECT_EQ(config.scheduler.window_ms, 0);
  EXPECT_EQ(config.device, "cpu");
  EXPECT_EQ(config.server.api_key, "k");
  EXPECT_EQ(config.model.path, "/x/y");
}

// A config without a graph section has the default graph; an override of its nodes or its edges
// alone replaces that half (it failed: "graph.nodes: expected a list of at least one node"). A
// graph section in the file still names both.
TEST_F(ServeConfigTest, AnOverrideReplacesOneHalfOfTheDefaultGraph) {
  const auto file = write("model: {path: m}\n");
  const auto edges = load_serve_config(file, {"graph.edges=[tokenize->batch, batch->emit]"});
  ASSERT_EQ(edges.graph.nodes.size(), 6u);
  EXPECT_EQ(edges.graph.nodes[5].at, "<default graph>:8");
  ASSERT_EQ(edges.graph.edges.size(), 2u);
  EXPECT_EQ(edges.graph.edges[1].to, "emit");
  EXPECT_EQ(edges.graph.edges[1].at,
            file.string() + ": override 'graph.edges=[tokenize->batch, batch->emit]'");
  const auto nodes = load_serve_config(file, {"graph.nodes=[{name: tokenize, concurrency: 3}]"});
  ASSERT_EQ(nodes.graph.nodes.size(), 1u);
  EXPECT_EQ(nodes.graph.nodes[0].concurrency, 3);
  EXPECT_EQ(nodes.graph.edges.size(), 9u);  // the default's: graph_plan finds their nodes gone
  EXPECT_EQ(error_of("model: {path: m}\ngraph:\n  nodes: [{name: t, stage: tokenize}]\n"),
            (dir_ / "serve.yaml").string() +
                ":3: field 'graph.edges': is missing: a graph section lists both nodes and edges "
                "(a --set override may give one half, the other then the default graph's)");
  EXPECT_EQ(error_of("model: {path: m}\ngraph:\n  nodes: [{name: t}]\n  edges: 5\n"),
            (dir_ / "serve.yaml").string() + ":4: field 'graph.edges': expected a list of edges");
}

// YAML 1.2 reads 037061 as decimal, as --port does; yaml-cpp's conversion took it for octal
// (a server on 15921). Every integer field, from the file or an override, reads it so.
TEST_F(ServeConfigTest, ALeadingZeroIsDecimal) {
  const auto config = load_serve_config(write(R"(
model: {path: m}
server: {port: 037061}
scheduler: {window_ms: 0100, kv_block_size: 0x10}
sampling: {seed: 010, top_k: -01}
graph:
  nodes: [{name: t, stage: tokenize, concurrency: 08}]
  edges: []
)"),
                                        {"scheduler.max_batch=0012", "server.max_queue=+09"});
  EXPECT_EQ(config.server.port, 37061);
  EXPECT_EQ(config.scheduler.window_ms, 100);
  EXPECT_EQ(config.scheduler.kv_block_size, 16);  // hex stays hex
  EXPECT_EQ(config.sampling.params.seed, 10u);
  EXPECT_EQ(config.sampling.params.top_k, -1);
  EXPECT_EQ(config.graph.nodes[0].concurrency, 8);
  EXPECT_EQ(config.scheduler.max_batch, 12);
  EXPECT_EQ(config.server.max_queue, 9);
  EXPECT_EQ(load_serve_config(write("model: {path: m}\n"), {"server.port=023417"}).server.port,
            23417);
  EXPECT_EQ(load_serve_config(write("model: {path: m}\nserver: {port: 0}\n")).server.port, 0);
}

TEST_F(ServeConfigTest, ErrorsNameFileLineAndField) {
  const std::string file = (dir_ / "serve.yaml").string();
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  window_ms: soon\n"),
            file + ":3: field 'scheduler.window_ms': expected an integer, got 'soon'");
  EXPECT_EQ(error_of("model: {path: m}\nserver:\n  port: 70000\n"),
            file + ":3: field 'server.port': must be at most 65535");
  EXPECT_EQ(error_of("model: {path: m}\nserver:\n  max_queue: 5000\n"),
            file +
                ":3: field 'server.max_queue': must be at most 4096 (each waiting request holds a "
                "connection thread)");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  max_num_seqs: 2147483647\n"),
            file +
                ":3: field 'scheduler.max_num_seqs': must be at most 4096 (each running request "
                "holds a connection thread)");
  EXPECT_EQ(error_of("model: {path: m}\nserver:\n  host: ''\n"),
            file +
                ":3: field 'server.host': must not be empty (0.0.0.0 listens on every interface, "
                "127.0.0.1 on this machine alone)");
  EXPECT_EQ(error_of("model: {path: m}\nserver:\n  api_key: ''\n"),
            file +
                ":3: field 'server.api_key': must not be empty (null, or leaving it out, serves "
                "without a key)");
  const std::string name_error =
      ": field 'model.name': must be a non-empty UTF-8 string without control characters (the "
      "id clients send as `model`); leave it out for the model folder's name";
  EXPECT_EQ(error_of("model: {path: m, name: ''}\n"), file + ":1" + name_error);
  EXPECT_EQ(error_of("model: {path: m, name: \"a\\nb\"}\n"), file + ":1" + name_error);
  EXPECT_EQ(error_of("model:\n  path: m\n  name: a\xFF\n"), file + ":3" + name_error);
  EXPECT_EQ(error_of("model: {path: m}\nthreads: 100000\n"),
            file +
                ":2: field 'threads': must be at most 1024 (more threads than a machine's cores "
                "only cost memory)");
  EXPECT_EQ(error_of("model: {path: m}\n", {"threads=1025"}),
            file +
                ": override 'threads=1025': field 'threads': must be at most 1024 (more threads "
                "than a machine's cores only cost memory)");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  kv_block_size: 2147483647\n"),
            file + ":3: field 'scheduler.kv_block_size': must be at most 1024");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  max_batch: 0\n"),
            file + ":3: field 'scheduler.max_batch': must be at least 1");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  max_prefill_tokens: 0\n"),
            file + ":3: field 'scheduler.max_prefill_tokens': must be at least 1");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  max_prefill_tokens: 99999999999\n"),
            file + ":3: field 'scheduler.max_prefill_tokens': must be at most 2147483647");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  enable_prefix_caching: maybe\n"),
            file +
                ":3: field 'scheduler.enable_prefix_caching': expected true or false, got "
                "'maybe'");
  EXPECT_EQ(error_of("model: {path: m}\ndevice: tpu\n"),
            file + ":2: field 'device': 'tpu' is not one of auto, cpu, cuda");
  EXPECT_EQ(error_of("model: {path: m, chat_template: chatml}\n"),
            file + ":1: field 'model.chat_template': 'chatml' is not one of llama2, raw");
  EXPECT_EQ(error_of("model: {path: m, matmul_activations: f16}\n"),
            file + ":1: field 'model.matmul_activations': 'f16' is not one of bf16, f32");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler: {policy: lifo}\n"),
            file + ":2: field 'scheduler.policy': 'lifo' is not one of fcfs, priority");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  kv_cache_dtype: fp8\n"),
            file + ":3: field 'scheduler.kv_cache_dtype': 'fp8' is not one of auto, bf16, f32");
  // An empty value is named on its own line (yaml-cpp marks it at the next token), with the
  // values it may take.
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  kv_cache_dtype:\n\n\n  max_batch: 2\n"),
            file + ":3: field 'scheduler.kv_cache_dtype': expected one of auto, bf16, f32");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  max_batch:\n\n  window_ms: 2\n"),
            file + ":3: field 'scheduler.max_batch': expected an integer");
  EXPECT_EQ(error_of("model: {path: m}\ndevice: [cpu]\n"),
            file + ":2: field 'device': expected one of auto, cpu, cuda");
  EXPECT_EQ(error_of("model: {path: m}\n", {"scheduler.kv_cache_dtype="}),
            file +
                ": override 'scheduler.kv_cache_dtype=': field 'scheduler.kv_cache_dtype': "
                "expected one of auto, bf16, f32");
}

// A second document would be dropped unread, and a folder read as a file failed inside the
// standard library with a message that named no file. A stray ',' or '%' where a document
// begins made yaml-cpp's LoadAll read empty documents there until memory ran out.
TEST_F(ServeConfigTest, OneDocumentInAFile) {
  const std::string file = (dir_ / "serve.yaml").string();
  EXPECT_EQ(error_of("model: {path: m}\n---\nscheduler:\n  window_ms: 5\n"),
            file + ":2: a second YAML document (\"---\"); a config file holds one");
  EXPECT_EQ(error_of(","), file + ":1: ',' cannot begin a YAML value here");
  EXPECT_EQ(error_of("%\n,"), file + ":2: ',' cannot begin a YAML value here");
  EXPECT_EQ(error_of("model: {path: m}\n%\n,\n"), file + ":3: ',' cannot begin a YAML value here");
  try {
    load_serve_config(dir_, {});
    ADD_FAILURE() << "a folder was read as a config";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), dir_.string() + ": is a folder, not a config file");
  }
}

// yaml-cpp words a tab in the indentation as "illegal map value"; the error says what it is. A
// tab inside a value, or after the indent, is no indentation.
TEST_F(ServeConfigTest, ATabIndentIsNamed) {
  const std::string file = (dir_ / "serve.yaml").string();
  EXPECT_EQ(error_of("model:\n\tpath: m\n"),
            file + ":2: indented with a tab; YAML indents with spaces only");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  \twindow_ms: 5\n"),
            file + ":3: indented with a tab; YAML indents with spaces only");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  window_ms:\t[5\n"),
            file + ":4: end of sequence flow not found");
}

TEST_F(ServeConfigTest, UnknownSectionsAndKeysAreErrors) {
  const std::string file = (dir_ / "serve.yaml").string();
  EXPECT_NE(error_of("model: {path: m}\nschedular: {}\n")
                .find(file + ":2: field 'schedular': unknown field"),
            std::string::npos);
  EXPECT_NE(error_of("model: {path: m}\nscheduler:\n  windw_ms: 5\n")
                .find(file + ":3: field 'scheduler.windw_ms': unknown field"),
            std::string::npos);
  // A field of another section says where it belongs.
  EXPECT_NE(
      error_of("model: {path: m}\nserver:\n  window_ms: 5\n")
          .find(file + ":3: field 'server.window_ms': unknown field (known: allowed_origins, "),
      std::string::npos);
  EXPECT_NE(error_of("model: {path: m}\nserver:\n  window_ms: 5\n")
                .find("); 'window_ms' is a field of 'scheduler' (scheduler.window_ms)"),
            std::string::npos);
  EXPECT_NE(error_of("model: {path: m}\nwindow_ms: 5\n")
                .find("'window_ms' is a field of 'scheduler' (scheduler.window_ms)"),
            std::string::npos);
  EXPECT_NE(error_of("model: {path: m}\nscheduler:\n  server: {}\n")
                .find("'server' is a section of its own, at the top level"),
            std::string::npos);
  EXPECT_EQ(error_of("model: {path: m}\nserver:\n  port: 8000\n  port: 8001\n"),
            file + ":4: field 'server.port': given twice (first on line 3)");
  EXPECT_EQ(error_of("model: {path: m}\ndevice: cpu\ndevice: cuda\n"),
            file + ":3: field 'device': given twice (first on line 2)");
}

// A graph node's keys are its stage's to check (graph_plan), but none may come twice: yaml-cpp
// read the first of two and dropped the other without a word.
TEST_F(ServeConfigTest, AKeyRepeatedInAGraphNodeIsAnError) {
  const std::string file = (dir_ / "serve.yaml").string();
  const std::string graph =
      "model: {path: m}\ngraph:\n  nodes:\n    - {name: t, stage: tokenize}\n";
  const std::string edges = "  edges: []\n";
  EXPECT_EQ(
      error_of(graph + "    - {name: emit, stage: emit, concurrency: 3, concurrency: 1}\n" + edges),
      file + ":5: field 'graph.nodes[1].concurrency': given twice (first on line 5)");
  EXPECT_EQ(
      error_of(graph + "    - name: emit\n      stage: emit\n      stage: detokenize\n" + edges),
      file + ":7: field 'graph.nodes[1].stage': given twice (first on line 6)");
  EXPECT_EQ(error_of(graph + "    - {name: a, name: b}\n" + edges),
            file + ":5: field 'graph.nodes[1].name': given twice (first on line 5)");
  EXPECT_EQ(error_of(graph + "    - {name: b, stage: batch_window, x: 1, x: 2}\n" + edges),
            file + ":5: field 'graph.nodes[1].x': given twice (first on line 5)");
}

TEST_F(ServeConfigTest, SamplingAndGraphErrors) {
  const std::string file = (dir_ / "serve.yaml").string();
  EXPECT_EQ(error_of("model: {path: m}\nsampling:\n  top_p: 0.9\n  temperature: 5\n"),
            file + ":4: field 'sampling.temperature': temperature must be between 0 and 2, got 5");
  EXPECT_EQ(
      error_of(
          "model: {path: m}\ngraph:\n  nodes:\n    - {name: a, concurrency: lots}\n  edges: []\n"),
      file +
          ":4: field 'graph.nodes[0].concurrency': expected a positive integer, 'serial' "
          "or 'unlimited', got 'lots'");
  // A name goes bare into edges and Graphviz DOT: a quote made `pipeline graph --dot` invalid.
  for (const std::string name : {R"('e"m')", "''", "'a->b'", "'a b'"})
    EXPECT_EQ(error_of("model: {path: m}\ngraph:\n  nodes:\n    - {name: " + name +
                       ", stage: tokenize}\n  edges: []\n"),
              file + ":4: field 'graph.nodes[0].name': '" + name.substr(1, name.size() - 2) +
                  "' is not a node name: letters, digits, '_', '.' and '-'");
  EXPECT_EQ(error_of("model: {path: m}\ngraph:\n  nodes: [{name: a}]\n  edges: [a=>b]\n"),
            file + ":4: field 'graph.edges[0]': expected 'from->to', got 'a=>b'");
}

// yaml-cpp read such keys with "bad conversion", and too deep a nesting with "bad file", naming
// neither the file nor what was wrong.
TEST_F(ServeConfigTest, KeysThatAreNotNamesAndDeepNestingAreNamed) {
  const std::string file = (dir_ / "serve.yaml").string();
  EXPECT_EQ(error_of("model: {path: m}\n? [a, b]\n: 1\n"),
            file + ":2: a key must be a name, not a list");
  EXPECT_EQ(error_of("model: {path: m}\nscheduler:\n  {x: 1}: 2\n"),
            file + ":3: field 'scheduler': a key must be a name, not a mapping");
  EXPECT_EQ(error_of("model: {path: m}\ngraph:\n  nodes:\n    - name: t\n      {x: 1}: 2\n"
                     "  edges: []\n"),
            file + ":5: field 'graph.nodes[0]': a key must be a name, not a mapping");
  EXPECT_EQ(error_of("model: {path: m}\nserver: {~: 1}\n"),
            file + ":2: field 'server': a key must be a name, not null");
  // The line is where yaml-cpp gave up, below the nesting's first line.
  const std::string deep = "model: {path: m}\nx: " + std::string(100000, '[') + "\n";
  const std::string too_deep = "lists and mappings nested deeper than yaml-cpp reads";
  const std::string error = error_of(deep);
  EXPECT_EQ(error.rfind(file + ":", 0), 0u) << error;
  EXPECT_NE(error.find(": " + too_deep), std::string::npos) << error;
  EXPECT_NE(error_of("model: {path: m}\n", {"x.y=" + std::string(100000, '[')})
                .find("': value is not valid YAML: " + too_deep),
            std::string::npos);
}

TEST_F(ServeConfigTest, MissingModelPathIsAnError) {
  const std::string file = (dir_ / "serve.yaml").string();
  EXPECT_NE(error_of("device: cpu\n").find(file + ": section 'model' is required"),
            std::string::npos);
  EXPECT_EQ(error_of("model: {name: tiny}\n"),
            file + ":1: field 'model.path': is required (a Hugging Face model folder)");
}

// Loading named a file inside the folder ("../m/config.json: no such file"), not the config line
// that gave it.
TEST_F(ServeConfigTest, AModelFolderThatIsNotThereIsNamedWhereItWasGiven) {
  const std::string file = (dir_ / "serve.yaml").string();
  const auto problem = [&](const std::string& text, const std::vector<std::string>& overrides) {
    try {
      check_model_folder(load_serve_config(write(text), overrides).model);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("a folder");
  };
  EXPECT_EQ(problem("device: cpu\nmodel:\n  path: ../no-such-model\n", {}),
            file + ":3: field 'model.path': no such folder: " +
                (dir_.parent_path() / "no-such-model").string());
  EXPECT_EQ(problem("model: {path: serve.yaml}\n", {}),
            file + ":1: field 'model.path': not a folder: " + file);
  EXPECT_EQ(
      problem("model: {path: m}\n", {"model.path=/no/such"}),
      file + ": override 'model.path=/no/such': field 'model.path': no such folder: /no/such");
  EXPECT_EQ(problem("model: {path: .}\n", {}), "a folder");
}

TEST_F(ServeConfigTest, OverrideErrorsNameTheOverride) {
  const std::string file = (dir_ / "serve.yaml").string();
  EXPECT_EQ(error_of("model: {path: m}\n", {"scheduler.window_ms=abc"}),
            file +
                ": override 'scheduler.window_ms=abc': field 'scheduler.window_ms': expected an "
                "integer, got 'abc'");
  EXPECT_EQ(
      error_of("model: {path: m}\nsampling:\n  temperature: 1\n", {"sampling.temperature=-1"}),
      file +
          ": override 'sampling.temperature=-1': field 'sampling.temperature': temperature "
          "must be between 0 and 2, got -1");
  // A section only an override wrote is the override's mistake too.
  EXPECT_NE(error_of("model: {path: m}\n", {"scheduler.window_ms=1", "bogus.x=1"})
                .find(file + ": override 'bogus.x=1': field 'bogus': unknown field"),
            std::string::npos);
  EXPECT_NE(
      error_of("model: {path: m}\n", {"scheduler.nope=1"})
          .find(file + ": override 'scheduler.nope=1': field 'scheduler.nope': unknown field"),
      std::string::npos);
  // Everything in a section or list an override wrote whole is the override's: their marks
  // point into its text, which they called line 1 of the file.
  EXPECT_EQ(error_of("model: {path: m}\n", {"scheduler={window_ms: fast}"}),
            file +
                ": override 'scheduler={window_ms: fast}': field 'scheduler.window_ms': expected "
                "an integer, got 'fast'");
  EXPECT_EQ(error_of("model: {path: m}\n", {"server={port: 1, port: 2}"}),
            file + ": override 'server={port: 1, port: 2}': field 'server.port': given twice");
  EXPECT_NE(error_of("model: {path: m}\n", {"server={prot: 1}"})
                .find(file + ": override 'server={prot: 1}': field 'server.prot': unknown field"),
            std::string::npos);
  EXPECT_EQ(
      error_of("model: {path: m}\n", {"graph.nodes=[{name: a, concurrency: x}]", "graph.edges=[]"}),
      file +
          ": override 'graph.nodes=[{name: a, concurrency: x}]': field "
          "'graph.nodes[0].concurrency': expected a positive integer, 'serial' or "
          "'unlimited', got 'x'");
  // A key the file repeats is the file's mistake, even when an override sets its value.
  EXPECT_EQ(error_of("model: {path: m}\nserver:\n  port: 1\n  port: 2\n", {"server.port=0"}),
            file + ":4: field 'server.port': given twice (first on line 3)");
  EXPECT_NE(error_of("model: {path: m}\n", {"nonsense"}).find("expected section.key=value"),
            std::string::npos);
  EXPECT_EQ(error_of("model: {path: m}\n", {".window_ms=1"}),
            file + ": override '.window_ms=1': expected section.key=value");
}

// Browser pages of any origin may call the API unless server.allowed_origins says which, as
// vLLM's --allowed-origins; [] sends no CORS headers.
TEST_F(ServeConfigTest, AllowedOriginsAreAnyByDefaultOrThoseListed) {
  EXPECT_EQ(load_serve_config(write("model: {path: m}\n")).server.allowed_origins,
            std::vector<std::string>{"*"});
  const auto listed = load_serve_config(
      write("model: {path: m}\nserver: {allowed_origins: [https://chat.example.com, "
            "'http://localhost:3000']}\n"));
  EXPECT_EQ(listed.server.allowed_origins,
            (std::vector<std::string>{"https://chat.example.com", "http://localhost:3000"}));
  EXPECT_TRUE(load_serve_config(write("model: {path: m}\nserver: {allowed_origins: []}\n"))
                  .server.allowed_origins.empty());
  const std::string file = (dir_ / "serve.yaml").string();
  EXPECT_EQ(error_of("model: {path: m}\nserver:\n  allowed_origins: '*'\n"),
            file + ":3: field 'server.allowed_origins': expected a list, such as [\"*\"] or []");
  EXPECT_EQ(
      error_of("model: {path: m}\nserver:\n  allowed_origins:\n    - https://a.example/app\n"),
      file +
          ":4: field 'server.allowed_origins': 'https://a.example/app' is not \"*\" nor an "
          "origin such as https://chat.example.com");
}

TEST_F(ServeConfigTest, ShippedConfigsLoad) {
  for (const char* name : {"configs/llama2_serve.yaml", "configs/demo.yaml"}) {
    const auto config = load_serve_config(testing::source_dir() / name);
    EXPECT_EQ(config.server.port, 2000) << name;
    EXPECT_EQ(config.graph.nodes.size(), 6u) << name;
  }
  const auto llama = load_serve_config(testing::source_dir() / "configs/llama2_serve.yaml");
  EXPECT_EQ(llama.model.path,
            (testing::source_dir() / "models/Llama-2-7b-chat-hf").lexically_normal());
  EXPECT_EQ(llama.scheduler.window_ms, 200);
  const auto demo = load_serve_config(testing::source_dir() / "configs/demo.yaml");
  EXPECT_EQ(demo.model.path, (testing::source_dir() / "build/demo-model").lexically_normal());
  EXPECT_EQ(demo.device, "cpu");
}

}  // namespace
}  // namespace pipeline

// Everything a serving or batch run is configured with: one YAML file (see configs/), every
// field defaulted, plus command-line overrides of the form section.key=value.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "io/dtype.h"
#include "model/sampling.h"

namespace pipeline {

struct ModelSection {
  std::filesystem::path path;            // Hugging Face model folder
  std::string path_given_at;             // "serve.yaml:2", or the override: for messages
  std::string chat_template = "llama2";  // llama2 | raw
  std::string name;                      // served model id; defaults to the folder name
  // bf16 | f32: what a bf16 checkpoint's matmuls round their activations to (f32: CPU only)
  DType matmul_activations = DType::BF16;
};

// What server.host and --host may name, for the messages that refuse an empty one.
constexpr const char* kHostChoices =
    "0.0.0.0 listens on every interface, 127.0.0.1 on this machine alone";

struct ServerSection {
  std::string host = "127.0.0.1";
  int port = 2000;
  std::string api_key;  // empty: no authentication
  int max_queue = 256;  // waiting requests (a call's n choices count n) beyond this get 503
  int shutdown_grace_s = 30;
  // A stream with nothing to send for this long sends an SSE comment (": keep-alive"), so that
  // proxies that end silent connections (nginx's proxy_read_timeout, 60 s) keep it; one still
  // waiting for its first token (queued, or behind long CPU prefill passes) sends its 200 headers
  // then. Until then a refusal still gets its own status. 0: never; headers wait for a token.
  int sse_keepalive_s = 15;
  // A log line when each request is added, finishes or fails (vLLM's request log). Unset:
  // `pipeline run` writes them, `pipeline batch` does not (its progress line counts them).
  std::optional<bool> log_requests;
  bool logs_requests() const { return log_requests.value_or(true); }
  // Origins whose pages may call the API from a browser (CORS), "*" for any, as vLLM's
  // --allowed-origins; empty: no CORS headers.
  std::vector<std::string> allowed_origins{"*"};
};

// scheduler.max_prefill_tokens when the config leaves it out: vLLM's 2048 on a GPU, and 512 on a
// CPU, where a pass of 2048 prompt tokens of a 7B model takes about a minute that every running
// stream would wait for its next token.
inline constexpr int kGpuPrefillTokens = 2048, kCpuPrefillTokens = 512;
inline int prefill_tokens_for(const std::string& device_name) {
  return device_name == "cpu" ? kCpuPrefillTokens : kGpuPrefillTokens;
}

// The values of scheduler.kv_cache_dtype and model.matmul_activations (and of the commands'
// --kv-cache-dtype and --matmul-activations): "auto" is none, the others name a DType.
inline constexpr std::string_view kKvCacheDtypeNames[] = {"auto", "bf16", "f32"};
inline constexpr std::string_view kMatmulActivationNames[] = {"bf16", "f32"};

struct SchedulerSection {
  int window_ms = 200;  // batch window for new requests; 0 = no wait
  int max_batch = 16;   // most prompts prefilled together
  int max_num_seqs = 64;
  // Prompt tokens per forward pass; longer prompts go in chunks. Unset: the device's default
  // (prefill_tokens_for), which the engine sets once its runner is made.
  std::optional<int> max_prefill_tokens;
  // vLLM's scheduling policy. fcfs: arrival order, and a request's priority must be 0. priority:
  // a request's priority (lower first), then arrival, orders admission and preemption.
  bool priority_policy = false;
  bool enable_prefix_caching = true;  // reuse the KV blocks of a prompt's cached first tokens
  int kv_block_size = 16;
  double kv_cache_fraction = 0.9;  // of free device memory (CUDA)
  int kv_cache_blocks = 0;  // explicit pool size; 0 = derive (CPU: max_num_seqs full contexts)
  // bf16 | f32; unset (auto): f32 for a float32 checkpoint, else bf16 (CUDA: bf16 only)
  std::optional<DType> kv_cache_dtype;
  // A log line per prefill pass and per run of decode steps, with their tokens/s, and per
  // preemption. Unset:
  // `pipeline run` writes them, `pipeline batch` does not (its progress line gives the rate).
  std::optional<bool> log_passes;
  bool logs_passes() const { return log_passes.value_or(true); }
};

struct SamplingDefaults {
  SamplingParams params;
  int max_tokens = 1024;
};

struct GraphNodeSpec {
  std::string name;
  std::string stage;
  int concurrency = 1;  // 0 = unlimited
  YAML::Node params;    // the whole node, for the stage's own parameters
  // Where it was given, for errors: "FILE:LINE", or "FILE: override '...'" for a node an
  // override wrote (whose parameters then have no line of the file either).
  std::string at;
  bool in_file = false;
};

struct GraphEdgeSpec {
  std::string from;
  std::string to;
  std::string at;  // as GraphNodeSpec::at
};

struct GraphSpec {
  std::vector<GraphNodeSpec> nodes;
  std::vector<GraphEdgeSpec> edges;
};

struct ServeConfig {
  std::filesystem::path file;  // where it was read from, for messages
  ModelSection model;
  std::string device = "auto";  // auto | cpu | cuda
  int threads = 0;              // CPU kernels' threads; 0 = all cores
  ServerSection server;
  SchedulerSection scheduler;
  SamplingDefaults sampling;
  GraphSpec graph;
};

// Reads a config file and applies "section.key=value" overrides (value parsed as YAML).
// Throws ConfigError naming the file, line and field.
ServeConfig load_serve_config(const std::filesystem::path& file,
                              const std::vector<std::string>& overrides = {});

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws ConfigError naming where model.path was given unless it is a folder: the checkpoint's
// own messages would name a file inside it ("m/config.json: no such file"), not the config.
void check_model_folder(const ModelSection& model);

}  // namespace pipeline

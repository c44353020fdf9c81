// The engine: the model, its runner, and the flow graph of stages built from a ServeConfig.
// Front ends (the HTTP server, the offline batch runner) submit Requests and read results
// from each request's sink.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "graph/metrics.h"
#include "graph/request.h"
#include "graph/serve_config.h"
#include "io/chat_template.h"
#include "io/model_config.h"
#include "io/tokenizer.h"
#include "model/llama_weights.h"
#include "model/model_runner.h"

namespace pipeline {

enum class SubmitStatus { Accepted, QueueFull, ShuttingDown, EngineFailed };

// Makes the engine's ModelRunner from the loaded weights.
using RunnerMaker = std::function<std::unique_ptr<ModelRunner>(
    std::shared_ptr<const LlamaWeights> weights, const RunnerOptions& options)>;

class Engine {
 public:
  // The runner is make_runner's for the config's device, unless `make` is given (tests give
  // runners that fail).
  explicit Engine(const ServeConfig& config, RunnerMaker make = {});
  ~Engine();  // shuts down with the configured grace

  // Never blocks. QueueFull: the waiting queue would hold more than server.max_queue requests
  // (answer 503). EngineFailed: see failure().
  SubmitStatus submit(std::shared_ptr<Request> request);
  // Several requests that answer together (the choices of one API call): all are accepted or
  // none is, so a full queue never leaves some of them running.
  SubmitStatus submit(std::span<const std::shared_ptr<Request>> requests);

  // The 400 a request gets whatever the load, found before its prompt is encoded (a prompt
  // whose length bound or max_tokens cannot fit the context or the KV pool), or none. Cheap: the
  // server asks it before it answers a full queue's 503, so that a request that can never run
  // is not told to retry.
  std::optional<RequestError> refusal_whatever_the_load(const Request& request) const;

  // The client left: the request ends now with 499, so its place in the waiting queue is free
  // at once, and the scheduler frees its KV blocks at its next step. Nothing happens to a
  // request that already ended.
  void cancel(Request& request);
  // The same, with `error` as the ending: for the other choices of a call one of whose choices
  // failed, which the call answers with that error (their client did not leave).
  void end(Request& request, const RequestError& error);

  // Stops accepting, lets in-flight requests finish for up to `grace`, then fails the rest
  // through their sinks. Idempotent.
  void shutdown(std::chrono::milliseconds grace);
  // Ends a shutdown's grace now (a second Ctrl-C): the requests still in flight fail at once.
  // Callable from any thread, before or during shutdown().
  void end_grace();

  // Why the engine failed for good, once it has: its model runner threw RunnerFailure ("the
  // model runner failed: ...") or a scheduling pass threw ("the scheduler failed: ...").
  // Every request in flight that still needed the model then failed with engine_failed_error
  // (an answer already complete is still delivered: a shutdown's grace gives it the time), and
  // submit() answers EngineFailed: the process is meant to exit, for a supervisor to start a
  // fresh one.
  std::optional<std::string> failure() const;
  // Calls `listener` with the reason when the engine fails for good, once, from the pipeline
  // thread that saw it (at once if it already has). One listener; a later call replaces it.
  void on_failure(std::function<void(const std::string& why)> listener);

  // Prometheus text exposition of every metric.
  std::string metrics_text() const;
  // The same metrics as values (tests, the offline batch runner).
  const Metrics& metrics() const;

  const LlamaConfig& model_config() const;
  // The most tokens a request's prompt and answer may hold together (vLLM's max_model_len): the
  // model's context, or the whole KV cache where that holds fewer.
  int max_model_len() const;
  const Tokenizer& tokenizer() const;
  // How chat messages become the prompt's tokens (the tokenize stage's template).
  ChatTemplate chat_template() const;
  const std::string& model_name() const;
  const ServeConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeline

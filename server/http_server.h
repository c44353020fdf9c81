// The OpenAI-compatible HTTP front end of an Engine (cpp-httplib, one thread per connection).
//
// Routes: POST /v1/chat/completions, POST /v1/completions, POST /tokenize, POST /detokenize
// (vLLM's), GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics. Every error body is
// OpenAI's {"error": {...}}: 404 for an unknown route, 405 for a known route with the wrong method,
// 400 for a malformed or invalid request, 503 when the engine's queue is full, it is shutting
// down, or the engine failed for good (its model runner or scheduler; /health then says so too).
// When server.api_key is set every route but GET /health (left open for load balancers' probes)
// needs `Authorization: Bearer KEY` (401 otherwise).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "graph/engine.h"

namespace pipeline {

// The connection threads a server with `config` may start: one per request the engine may hold
// (running or queued), since a completion holds its connection's thread until it ends, and a
// few more to answer the rest (a 503 when the queue is full, /health, /metrics).
size_t connection_threads(const ServeConfig& config);

class HttpServer {
 public:
  // The engine must outlive the server.
  explicit HttpServer(Engine& engine);
  ~HttpServer();

  // Binds the listening socket; port 0 picks a free port. Returns the bound port; throws
  // std::runtime_error naming host and port when it cannot bind.
  int bind(const std::string& host, int port);

  // Serves until shutdown(); returns once every connection thread has ended: true then, false
  // when the listening socket failed first.
  bool serve();

  // Graceful stop, callable from any thread: /health turns 503 and new completion requests
  // get 503, Engine::shutdown(grace) lets in-flight requests finish (failing the rest), their
  // last chunks are written in what is left of the grace (at least a second), then connections
  // still answering (a client that stopped reading) are cut off, the listening socket closes
  // and serve() returns.
  void shutdown(std::chrono::milliseconds grace);
  // Ends a shutdown's grace now (a second Ctrl-C): the requests still in flight fail, and their
  // last chunks are not waited for. Callable from any thread, before or during shutdown().
  void end_grace();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeline

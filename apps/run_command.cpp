// `pipeline run CONFIG`: loads the engine a config describes and serves it over the
// OpenAI-compatible HTTP API until SIGINT or SIGTERM, then shuts down gracefully and exits 0.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "apps/commands.h"
#include "apps/config_overrides.h"
#include "apps/options.h"
#include "graph/engine.h"
#include "graph/serve_config.h"
#include "server/http_server.h"

namespace pipeline {

namespace {

constexpr const char* kUsage =
    "usage: pipeline run CONFIG [--model DIR] [--port N] [--host H] [--device cpu|cuda|auto]\n"
    "                    [--set section.key=value ...]\n"
    "Serves the model CONFIG describes over an OpenAI-compatible HTTP API.\n"
    "  --model DIR     model.path: a Hugging Face model folder\n"
    "  --port N        server.port; 0 picks a free port (the address is printed when ready)\n"
    "  --host H        server.host, e.g. 0.0.0.0 to listen on every interface\n"
    "  --device D      device: cpu, cuda or auto\n"
    "  --set K=V       any config field, e.g. --set scheduler.max_batch=8 (repeatable)\n"
    "SIGINT or SIGTERM: stop taking requests, finish those in flight (server.shutdown_grace_s)\n"
    "and exit 0; a second one fails those still in flight at once.";

// --host and --port, then the overrides every config-loading command takes (--set last, so
// that it wins).
std::vector<std::string> overrides_from(Options& options) {
  std::vector<std::string> overrides;
  if (auto host = options.find("--host")) overrides.push_back("server.host=" + yaml_string(*host));
  if (options.find("--port")) {
    const int64_t port = options.integer("--port", 0);
    if (port < 0 || port > 65535)
      throw UsageError("--port: expected 0 (any free port) to 65535, got " + std::to_string(port));
    overrides.push_back("server.port=" + std::to_string(port));
  }
  for (auto& assignment : config_overrides(options)) overrides.push_back(std::move(assignment));
  return overrides;
}

// Waits on a thread of its own for SIGINT or SIGTERM (blocked in every other thread), or
// until the server stopped by itself.
int wait_for_stop_signal(const std::atomic<bool>& server_ended) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  const timespec poll{0, 200'000'000};
  while (!server_ended.load()) {
    const int signal_number = sigtimedwait(&signals, nullptr, &poll);
    if (signal_number > 0) return signal_number;
  }
  return 0;
}

}  // namespace

int run_command(int argc, char** argv) {
  Options options(argc, argv, kUsage);
  if (options.help()) return 0;
  const std::string config_file = options.positional(1, 1)[0];
  const std::vector<std::string> overrides = overrides_from(options);
  options.finish();
  const ServeConfig config = load_serve_config(config_file, overrides);

  // Before any thread starts, so all of them inherit it: SIGINT and SIGTERM go to the one
  // thread that waits for them. A client that hangs up must not kill the server with SIGPIPE.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Engine engine(config);
  HttpServer server(engine);
  const int port = server.bind(config.server.host, config.server.port);
  std::fprintf(stderr, "pipeline run: serving model '%s'; listening on http://%s:%d\n",
               engine.model_name().c_str(), config.server.host.c_str(), port);

  std::atomic<bool> server_ended{false};
  std::atomic<bool> signalled{false};
  auto signal_name = [](int signal_number) {
    return signal_number == SIGINT ? "SIGINT" : "SIGTERM";
  };
  // Both threads start now, not at the signal: by then the process may have no thread left
  // to start (its connection threads grow to its limit under load).
  std::mutex stop_mutex;
  std::condition_variable stop_changed;
  bool stop_asked = false, serve_returned = false;  // under stop_mutex
  std::thread shutting_down([&] {
    std::unique_lock lock(stop_mutex);
    stop_changed.wait(lock, [&] { return stop_asked || serve_returned; });
    if (!stop_asked) return;
    lock.unlock();
    server.shutdown(std::chrono::seconds(config.server.shutdown_grace_s));
  });
  std::thread stopper([&] {
    const int signal_number = wait_for_stop_signal(server_ended);
    if (signal_number == 0) return;
    signalled.store(true);
    std::fprintf(stderr,
                 "pipeline run: %s received, finishing requests in flight (up to %d s; another "
                 "signal ends them now)\n",
                 signal_name(signal_number), config.server.shutdown_grace_s);
    {
      std::lock_guard lock(stop_mutex);
      stop_asked = true;
    }
    stop_changed.notify_one();
    if (const int second = wait_for_stop_signal(server_ended); second != 0) {
      std::fprintf(stderr, "pipeline run: second %s: failing the requests still in flight\n",
                   signal_name(second));
      engine.end_grace();
    }
  });
  const bool asked_to_stop = server.serve();
  server_ended.store(true);
  {
    std::lock_guard lock(stop_mutex);
    serve_returned = true;
  }
  stop_changed.notify_one();
  stopper.join();
  shutting_down.join();
  if (!asked_to_stop || !signalled.load()) {
    std::fprintf(stderr, "pipeline run: the HTTP server stopped without being asked to\n");
    engine.shutdown(std::chrono::seconds(0));
    return 1;
  }
  std::fprintf(stderr, "pipeline run: stopped\n");
  return 0;
}

}  // namespace pipeline

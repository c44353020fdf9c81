// `pipeline run CONFIG`: loads the engine a config describes and serves it over the
// OpenAI-compatible HTTP API until SIGINT, SIGTERM or SIGHUP, then shuts down gracefully and exits
// 0.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "apps/commands.h"
#include "apps/config_overrides.h"
#include "apps/options.h"
#include "apps/stop_signals.h"
#include "graph/engine.h"
#include "graph/serve_config.h"
#include "server/http_server.h"
#include "server/open_file_limit.h"
#include "server/port_claim.h"

namespace pipeline {

namespace {

constexpr const char* kUsage =
    "usage: pipeline run CONFIG [--model DIR] [--port N] [--host H] [--device cpu|cuda|auto]\n"
    "                    [--threads N] [--set section.key=value ...]\n"
    "Serves the model CONFIG describes over an OpenAI-compatible HTTP API.\n"
    "  --model DIR     model.path: a Hugging Face model folder\n"
    "  --port N        server.port; 0 picks a free port (the address is printed when ready)\n"
    "  --host H        server.host, e.g. 0.0.0.0 to listen on every interface\n"
    "  --device D      device: cpu, cuda or auto\n"
    "  --threads N     threads: CPU kernel threads (0, the default: all cores; at most 1024)\n"
    "  --set K=V       any config field, e.g. --set scheduler.max_batch=8 (repeatable)\n"
    "SIGINT, SIGTERM or SIGHUP: stop taking requests, finish those in flight "
    "(server.shutdown_grace_s)\n"
    "and exit 0; a second one fails those still in flight at once, a third exits at once (as\n"
    "one does while the model loads). Exits 1 if the model runner fails for good (a device\n"
    "error), having failed each request in flight with a 503.";

// The address a client reaches: an IPv6 address goes in brackets (http://[::1]:2000), as a
// URL's port would otherwise be read as part of it.
std::string listening_url(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return "http://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// --host and --port, then the overrides every config-loading command takes (--set last, so
// that it wins).
std::vector<std::string> overrides_from(Options& options) {
  std::vector<std::string> overrides;
  if (auto host = options.find("--host")) {
    if (host->empty())
      throw UsageError("--host must not be empty (" + std::string(kHostChoices) + ")");
    overrides.push_back("server.host=" + yaml_string(*host));
  }
  if (options.find("--port")) {
    const int64_t port = options.integer("--port", 0);
    if (port < 0 || port > 65535)
      throw UsageError("--port: expected 0 (any free port) to 65535, got " + std::to_string(port));
    overrides.push_back("server.port=" + std::to_string(port));
  }
  for (auto& assignment : config_overrides(options)) overrides.push_back(std::move(assignment));
  return overrides;
}

// Each connection holds a file; past the limit, new clients wait unanswered (the warning names
// what to raise, which only the hard limit's owner can).
void warn_of_few_open_files(uint64_t open_files, const ServeConfig& config) {
  const size_t connections = connection_threads(config);
  const size_t needed = connections + 64;  // and the model's files, logs, pipes
  if (open_files >= needed) return;
  std::fprintf(stderr,
               "pipeline run: warning: this process may open %llu files (ulimit -n), fewer than "
               "the %zu connections its queue and running sequences may hold; clients past that "
               "wait unanswered. Raise the hard limit (ulimit -Hn, LimitNOFILE=) to at least "
               "%zu.\n",
               static_cast<unsigned long long>(open_files), connections, needed);
}

}  // namespace

int run_command(int argc, char** argv) {
  // First, before any thread starts, so all of them inherit it: the stop signals (SIGINT, SIGTERM,
  // SIGHUP) go to the one thread that waits for them. A client that hangs up must not kill the
  // server with SIGPIPE.
  block_stop_signals();
  signal(SIGPIPE, SIG_IGN);
  // Until the server listens nothing was accepted, so a stop signal ends the process at once:
  // loading a large model takes tens of seconds that a stop should not wait out.
  std::optional<StopSignalWatcher> while_loading(
      std::in_place,
      [](int signal_number) {
        std::fprintf(stderr, "pipeline run: %s received before serving; stopped\n",
                     stop_signal_name(signal_number));
        std::fflush(stderr);
        std::_Exit(0);
      },
      [](int) {});
  Options options(argc, argv, kUsage);
  if (options.help()) return 0;
  const std::vector<std::string> overrides = overrides_from(options);
  const std::string config_file = options.finish(1, 1)[0];
  const ServeConfig config = load_serve_config(config_file, overrides);

  warn_of_few_open_files(raise_open_file_limit(), config);
  PortClaim claim(config.server.host, config.server.port);  // a port in use fails before the load
  Engine engine(config);
  HttpServer server(engine);
  claim.release();
  const int port = server.bind(config.server.host, config.server.port);
  while_loading.reset();  // a signal from here on waits for the watcher below
  std::fprintf(stderr, "pipeline run: serving model '%s'; listening on %s\n",
               engine.model_name().c_str(), listening_url(config.server.host, port).c_str());

  std::atomic<bool> signalled{false};
  // The shutdown runs on a thread started now, not at the signal: by then the process may have
  // no thread left to start (its connection threads grow to its limit under load).
  std::mutex stop_mutex;
  std::condition_variable stop_changed;
  bool stop_asked = false, engine_failed = false, serve_returned = false;  // under stop_mutex
  std::thread shutting_down([&] {
    std::unique_lock lock(stop_mutex);
    stop_changed.wait(lock, [&] { return stop_asked || engine_failed || serve_returned; });
    if (!stop_asked && !engine_failed) return;
    // After an engine failure what is left to finish are the answers the model had completed,
    // on their way to their clients: the grace is theirs.
    const std::chrono::seconds grace(config.server.shutdown_grace_s);
    lock.unlock();
    server.shutdown(grace);
  });
  // A device (or scheduler) that failed for good cannot be recovered in this process: stop, so
  // that a supervisor starts a fresh one, rather than answer 503 from here on.
  engine.on_failure([&](const std::string& why) {
    std::fprintf(stderr, "pipeline run: %s; stopping\n", why.c_str());
    {
      std::lock_guard lock(stop_mutex);
      engine_failed = true;
    }
    stop_changed.notify_one();
  });
  bool asked_to_stop = false;
  {
    const StopSignalWatcher watcher(
        [&](int signal_number) {
          signalled.store(true);
          std::fprintf(stderr,
                       "pipeline run: %s received, finishing requests in flight (up to %d s; "
                       "another signal ends them now)\n",
                       stop_signal_name(signal_number), config.server.shutdown_grace_s);
          {
            std::lock_guard lock(stop_mutex);
            stop_asked = true;
          }
          stop_changed.notify_one();
        },
        [&](int second) {
          std::fprintf(stderr, "pipeline run: second %s: failing the requests still in flight\n",
                       stop_signal_name(second));
          server.end_grace();
        });
    asked_to_stop = server.serve();
  }  // the watcher stops watching once the server has stopped
  {
    std::lock_guard lock(stop_mutex);
    serve_returned = true;
  }
  stop_changed.notify_one();
  shutting_down.join();
  if (const auto why = engine.failure()) {
    engine.shutdown(std::chrono::seconds(0));
    std::fprintf(stderr, "pipeline run: stopped: %s\n", why->c_str());
    return 1;
  }
  if (!asked_to_stop || !signalled.load()) {
    std::fprintf(stderr, "pipeline run: the HTTP server stopped without being asked to\n");
    engine.shutdown(std::chrono::seconds(0));
    return 1;
  }
  std::fprintf(stderr, "pipeline run: stopped\n");
  return 0;
}

}  // namespace pipeline
